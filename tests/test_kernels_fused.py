"""Fused kernels (trnsim.kernels.fused, fused_matmul): each recipe run at instruction
fidelity against the numpy reference bit for bit, their SBUF estimate against what the
tracer places, and their simulated time against the eager kernels they replace."""

import numpy as np
import pytest

import trnsim.nki as nki
from trnsim.compute import reference as cref
from trnsim import dtypes
from trnsim.simulator import simulate
from trnsim.hw.placement import OnChipAllocator
from trnsim.hw.spec import load_chip
from trnsim.kernels.elementwise import binary_kernel, unary_kernel
from trnsim.kernels.fused import Recipe, Ref, Step, fused_rows_kernel, reference, sbuf_bytes
from trnsim.kernels.fused_matmul import fused_matmul_kernel
from trnsim.kernels.gemm import matmul_general
from trnsim.kernels.reduce import reduce_kernel
from trnsim.nki import KernelError

CHIP = "trn2"
X, Y = Ref("in", 0), Ref("in", 1)


def s(j):
    return Ref("step", j)


def c(value):
    return Ref("const", value=value)


def data(seed, *shapes, dtype="float32", scale=1.0):
    """Seeded normal values rounded to ``dtype``: (kernel arguments, the values they hold)."""
    rng = np.random.default_rng(seed)
    args, values = [], []
    for shape in shapes:
        dt = dtypes.as_dtype(dtype)
        v = cref.decode(cref.encode(rng.standard_normal(shape) * scale, dt), dt).astype(np.float32)
        values.append(v)
        args.append(v if dtype == "float32" else nki.typed(v, dtype))
    return args, values


def assert_rows(recipe, seed, shapes, shape, dtype="float32", scale=1.0):
    args, values = data(seed, *shapes, dtype=dtype, scale=scale)
    got = nki.simulate(fused_rows_kernel, chip=CHIP)(*args, recipe=recipe, shape=shape)
    want = reference(recipe, values, shape)
    assert len(got) == len(want) == len(recipe.outputs)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    return got


SILU_MUL_BF16 = Recipe(("full", "full"), (Step("silu", (X,)), Step("multiply", (s(0), Y)),
                                          Step("copy", (s(1),), "bfloat16")), (2,))
SOFTMAX = Recipe(("full",), (Step("max", (X,)), Step("subtract", (X, s(0))), Step("exp", (s(1),)),
                             Step("sum", (s(2),)), Step("divide", (s(2), s(3)))), (4,))
RMSNORM = Recipe(("full", "row"), (Step("square", (X,)), Step("mean", (s(0),)), Step("add", (s(1), c(1e-6))),
                                   Step("rsqrt", (s(2),)), Step("multiply", (X, s(3))), Step("multiply", (s(4), Y))),
                 (5,))
LAYERNORM = Recipe(("full", "row", "row"),
                   (Step("mean", (X,)), Step("subtract", (X, s(0))), Step("square", (s(1),)), Step("mean", (s(2),)),
                    Step("add", (s(3), c(1e-5))), Step("rsqrt", (s(4),)), Step("multiply", (s(1), s(5))),
                    Step("multiply", (s(6), Y)), Step("add", (s(7), Ref("in", 2)), "bfloat16")),
                   (8, 0, 5))


def test_elementwise_chain_cast_to_bf16():
    (out,) = assert_rows(SILU_MUL_BF16, 1, [(200, 300), (200, 300)], (200, 300))
    np.testing.assert_array_equal(cref.decode(cref.encode(out, dtypes.bfloat16), dtypes.bfloat16), out)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_softmax(dtype):
    (out,) = assert_rows(SOFTMAX, 2, [(200, 384)], (200, 384), dtype=dtype, scale=3.0)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_rmsnorm_with_a_row_weight():
    assert_rows(RMSNORM, 3, [(130, 256), (256,)], (130, 256))


def test_layernorm_with_mean_and_rstd_as_column_outputs():
    out, mean, rstd = assert_rows(LAYERNORM, 4, [(256, 200), (200,), (200,)], (256, 200))
    assert out.shape == (256, 200) and mean.shape == rstd.shape == (256, 1)


def test_where_and_comparisons():
    recipe = Recipe(("full", "full"), (Step("greater", (X, c(0.0))), Step("multiply", (X, c(0.1))),
                                       Step("where", (s(0), X, s(1))), Step("less_equal", (X, Y)),
                                       Step("where", (s(3), s(2), c(-2.5)), "bfloat16"),
                                       Step("where", (s(3), c(1.5), Y))), (2, 4, 5))
    assert_rows(recipe, 5, [(200, 100), (200, 100)], (200, 100))


def test_scalar_and_column_operands():
    recipe = Recipe(("full", "scalar", "col"), (Step("multiply", (X, Ref("in", 1))), Step("subtract", (Ref("in", 2), s(0))),
                                                Step("exp", (Ref("in", 2),)), Step("divide", (s(1), s(2))),
                                                Step("neg", (s(3),)), Step("reciprocal", (s(2),))), (4, 5))
    assert_rows(recipe, 6, [(150, 64), (1,), (150, 1)], (150, 64))


def test_where_with_column_and_constant_branches_and_narrow_dtypes():
    recipe = Recipe(("full", "col"), (Step("less", (X, Y)), Step("where", (s(0), Y, X)),
                                      Step("where", (s(0), c(2.0), Y), "float16"), Step("max", (s(1),), "bfloat16"),
                                      Step("exp", (Y,), "bfloat16")), (1, 2, 3, 4))
    assert_rows(recipe, 12, [(130, 70), (130, 1)], (130, 70))


def test_fp8_and_fp16_steps_over_column_chunks_of_bf16_operands():
    recipe = Recipe(("full", "row"), (Step("power", (X, c(2.0))), Step("sigmoid", (s(0),), "float8_e4m3"),
                                      Step("sqrt", (s(0),), "float8_e5m2"), Step("erf", (s(2),), "float16"),
                                      Step("minimum", (s(3), Y)), Step("sign", (s(4),))), (1, 5))
    assert_rows(recipe, 13, [(130, 2100), (2100,)], (130, 2100), dtype="bfloat16")


@pytest.mark.parametrize("n", [1, 127, 129])
def test_partial_row_tiles(n):
    assert_rows(RMSNORM, 7, [(n, 96), (96,)], (n, 96))


def test_large_d_elementwise_goes_in_column_chunks():
    recipe = Recipe(("full", "row"), (Step("add", (X, Y)), Step("gelu_tanh", (s(0),), "bfloat16")), (1,))
    assert_rows(recipe, 8, [(130, 5000), (5000,)], (130, 5000))
    program = nki.trace_program(fused_rows_kernel, *data(8, (130, 5000), (5000,))[0], recipe=recipe,
                                shape=(130, 5000), chip=CHIP)
    widths = {t.shape[1] for t in program.tensors if t.memory.value == "sbuf" and t.shape[0] == 128}
    assert max(widths) == 2048


def test_recipes_that_are_not_well_formed_are_refused():
    x = np.zeros((4, 8), np.float32)
    with pytest.raises(KernelError, match="step 0 .* refers to Ref"):
        nki.trace_program(fused_rows_kernel, x, recipe=Recipe(("full",), (Step("exp", (s(0),)),), (0,)), shape=(4, 8))
    with pytest.raises(KernelError, match="op 'cumsum'"):
        nki.trace_program(fused_rows_kernel, x, recipe=Recipe(("full",), (Step("cumsum", (X,)),), (0,)), shape=(4, 8))
    with pytest.raises(KernelError, match=r"operand 0 \(full\) is \[4, 8\], expected \[4, 9\]"):
        nki.trace_program(fused_rows_kernel, x, recipe=SOFTMAX, shape=(4, 9))


# -- matmul epilogues ----------------------------------------------------------------

def product(lhsT, rhs):
    """The fp32 product as matmul_general computes it, bit for bit."""
    return nki.simulate(matmul_general, chip=CHIP)(lhsT, rhs, dtype="float32")


def assert_matmul(recipe, lhsT, rhs, args, values, shape):
    got = nki.simulate(fused_matmul_kernel, chip=CHIP)(lhsT, rhs, *args, recipe=recipe)
    want = reference(recipe, values, shape, mm=product(lhsT, rhs))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    return got


MM_BIAS_SILU = Recipe(("row",), (Step("add", (Ref("mm"), X)), Step("silu", (s(0),))), (1,))


def test_matmul_bias_silu():
    (lhsT, rhs, bias), (_, _, b) = data(9, (256, 200), (256, 700), (700,))
    assert_matmul(MM_BIAS_SILU, lhsT, rhs, [bias], [b], (200, 700))


def test_matmul_residual_cast_to_bf16_over_several_k_chunks():
    recipe = Recipe(("full",), (Step("add", (Ref("mm"), X)), Step("copy", (s(0),), "bfloat16")), (1,))
    (lhsT, rhs, res), (_, _, r) = data(10, (1100, 130), (1100, 300), (130, 300), dtype="bfloat16")
    assert_matmul(recipe, lhsT, rhs, [res], [r], (130, 300))


def test_batched_matmul_epilogue():
    recipe = Recipe(("col", "scalar"), (Step("multiply", (Ref("mm"), X)), Step("add", (s(0), Y)),
                                        Step("tanh", (s(1),), "bfloat16")), (2,))
    (lhsT, rhs, col, sc), (_, _, cv, sv) = data(11, (3, 64, 96), (64, 160), (3, 96, 1), (1,))
    (out,) = assert_matmul(recipe, lhsT, rhs, [col, sc], [cv, sv], (3, 96, 160))
    assert out.shape == (3, 96, 160)


def test_matmul_product_rounded_to_dtype_before_the_epilogue():
    (lhsT, rhs, bias), (_, _, b) = data(14, (200, 130), (200, 260), (260,), dtype="bfloat16")
    got = nki.simulate(fused_matmul_kernel, chip=CHIP)(lhsT, rhs, bias, recipe=MM_BIAS_SILU, dtype="bfloat16")
    mm = product(lhsT, rhs)
    want = reference(MM_BIAS_SILU, [b], (130, 260), mm=cref.decode(cref.encode(mm, dtypes.bfloat16), dtypes.bfloat16))
    np.testing.assert_array_equal(got[0], want[0])
    assert not np.array_equal(got[0], reference(MM_BIAS_SILU, [b], (130, 260), mm=mm)[0])


def test_matmul_recipe_with_a_reduction_is_refused():
    recipe = Recipe((), (Step("sum", (Ref("mm"),)),), (0,))
    a = np.zeros((128, 128), np.float32)
    with pytest.raises(KernelError, match=r"step 0 \(sum\) is a reduction"):
        nki.trace_program(fused_matmul_kernel, a, a, recipe=recipe)


# -- SBUF --------------------------------------------------------------------------

def sbuf_peak(monkeypatch, recipe, shapes, shape):
    """The most SBUF bytes live at once on partition 0 while the kernel traces."""
    peak = [0]
    allocate = OnChipAllocator.allocate

    def tracked(self, name, start, count, nbytes):
        offset = allocate(self, name, start, count, nbytes)
        if self.memory.value == "sbuf":
            peak[0] = max(peak[0], sum(a.nbytes for a in self.live.values() if a.overlaps_partitions(0, 1)))
        return offset

    monkeypatch.setattr(OnChipAllocator, "allocate", tracked)
    args = [np.broadcast_to(np.zeros((), np.float32), sh) for sh in shapes]
    nki.trace_program(fused_rows_kernel, *args, recipe=recipe, shape=shape, chip=CHIP)
    return peak[0]


@pytest.mark.parametrize("recipe, shapes, shape", [
    (SOFTMAX, [(1000, 1000)], (1000, 1000)),
    (LAYERNORM, [(256, 4096), (4096,), (4096,)], (256, 4096)),
    (SILU_MUL_BF16, [(200, 9000), (200, 9000)], (200, 9000)),
    (Recipe(("full", "col"), (Step("less", (X, Y)), Step("where", (s(0), Y, X))), (1,)), [(130, 700), (130, 1)],
     (130, 700)),
], ids=["softmax", "layernorm", "chunked", "where"])
def test_sbuf_estimate_bounds_what_the_kernel_places(monkeypatch, recipe, shapes, shape):
    estimate = sbuf_bytes(recipe, shape, [4] * len(shapes))
    assert 0 < sbuf_peak(monkeypatch, recipe, shapes, shape) <= estimate


def test_a_fusion_over_the_sbuf_estimate_spills_to_hbm():
    shape = (256, 16000)
    estimate = sbuf_bytes(LAYERNORM, shape, [4, 4, 4])
    assert estimate > load_chip(CHIP).sbuf.partition_bytes
    args = [np.broadcast_to(np.zeros((), np.float32), sh) for sh in (shape, (16000,), (16000,))]
    program = nki.trace_program(fused_rows_kernel, *args, recipe=LAYERNORM, shape=shape, chip=CHIP)
    assert any(t.name.endswith("_spill_0") for t in program.tensors)   # the Neuron compiler's spill, as it does


# -- timing ------------------------------------------------------------------------

def time_ns(kernel, *args, **kwargs):
    program = kernel.trace(*args, chip=CHIP, **kwargs).tracer.program
    return simulate(program, None, fidelity="timing").time_ns


def placeholder(*shape, dtype="float32"):
    zeros = np.broadcast_to(np.zeros((), np.float32), shape)
    return zeros if dtype == "float32" else nki.typed(zeros, dtype)


def test_fused_softmax_beats_the_eager_kernels():
    x, col = placeholder(1024, 1024), placeholder(1024, 1)
    fused = [time_ns(fused_rows_kernel, x, recipe=SOFTMAX, shape=(1024, 1024)) for _ in range(2)]
    eager = (time_ns(reduce_kernel, x, op="max") + time_ns(binary_kernel, x, col, op="subtract")
             + time_ns(unary_kernel, x, op="exp") + time_ns(reduce_kernel, x, op="sum")
             + time_ns(binary_kernel, x, col, op="divide"))
    assert fused[0] == fused[1]
    assert 3 * fused[0] < eager


def test_fused_matmul_bias_silu_beats_matmul_then_bias_then_silu():
    recipe = Recipe(("row",), (Step("add", (Ref("mm"), X), "bfloat16"), Step("silu", (s(0),), "bfloat16")), (1,))
    lhsT, rhs, bias = (placeholder(*sh, dtype="bfloat16") for sh in ((1024, 1024), (1024, 1024), (1024,)))
    out = placeholder(1024, 1024, dtype="bfloat16")
    fused = time_ns(fused_matmul_kernel, lhsT, rhs, bias, recipe=recipe)
    matmul = time_ns(matmul_general, lhsT, rhs)
    eager = matmul + time_ns(binary_kernel, out, bias, op="add") + time_ns(unary_kernel, out, op="silu")
    assert matmul < fused < matmul * 1.15
    assert 1.5 * fused < eager


# -- each chip's own clocks --------------------------------------------------------

NEG_CHAIN = Recipe(("full",), (Step("neg", (X,)), *(Step("neg", (s(j),)) for j in range(19))), (19,))


@pytest.mark.parametrize("chip", ["trn1", "trn2", "trn3"])
def test_work_either_lane_engine_can_do_is_split_by_the_chips_clocks(chip):
    """neg runs as exactly on the vector as on the scalar engine; a fused kernel gives each
    the share its clock earns on the chip traced for (trn2's clocks were used on every chip)."""
    spec = load_chip(chip)
    x = np.broadcast_to(np.zeros((), np.float32), (128, 512))
    program = fused_rows_kernel.trace(x, recipe=NEG_CHAIN, shape=(128, 512), chip=chip).tracer.program
    engines = [i.engine.name for i in program.instructions if i.engine.name in ("VECTOR", "SCALAR")]
    vector, scalar = engines.count("VECTOR"), engines.count("SCALAR")
    assert vector + scalar == 20
    # the busier engine's time exceeds the other's by at most one step
    vector_ns, scalar_ns = vector / spec.vector_engine.clock_ghz, scalar / spec.scalar_engine.clock_ghz
    assert abs(vector_ns - scalar_ns) <= 1 / min(spec.vector_engine.clock_ghz, spec.scalar_engine.clock_ghz)
    assert (vector, scalar) == {"trn1": (9, 11), "trn2": (9, 11), "trn3": (10, 10)}[chip]
