"""Adversarial checks of kernel CI helpers, Programs, NKI kernels and the kernel library."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import trnsim.nki as nki
import trnsim.nki.language as nl
from trnsim import Program, simulate
from trnsim.errors import ProgramError, SimulationError
from trnsim.isa import Engine, Memset
from trnsim.testing import assert_allclose, assert_kernel_matches, assert_latency

from .conftest import clean_error

SPECIAL = st.sampled_from([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 1e30, -2.5])
ARRAYS = hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=5),
                    elements=st.one_of(st.floats(-1e6, 1e6), SPECIAL))


# -- kernel CI helpers ---------------------------------------------------------

def _check_fails(fn: object, *fragments: str) -> None:
    """A kernel-CI helper's verdict: AssertionError (what pytest reports as a failed check)
    whose message names each fragment."""
    with pytest.raises(AssertionError) as info:
        fn()
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_assert_allclose_infinite_reference_does_not_hide_differences() -> None:
    _check_fails(lambda: assert_allclose([1, 2, np.inf], [5, 6, np.inf]), "2 of 3 elements")


@pytest.mark.parametrize("actual, expected", [
    ([np.nan, 1.0], [1.0, 1.0]), ([1.0, 1.0], [np.nan, 1.0]), ([np.inf], [-np.inf]), ([1e300], [np.inf]),
    ([np.inf], [1.0]), ([[1.0, 2.0]], [1.0, 2.0]), (None, [1.0]), ([1, 2], [1, 3]),
])
def test_assert_allclose_refuses(actual: object, expected: object) -> None:
    _check_fails(lambda: assert_allclose(actual, expected))


def test_assert_allclose_integer_dtype_is_exact() -> None:
    _check_fails(lambda: assert_allclose(np.array([2**40 + 1]), np.array([2**40]), "int32"))
    _check_fails(lambda: assert_allclose(np.array([2**60 + 1]), np.array([2**60]), "int32"))
    assert_allclose(np.arange(4, dtype=np.int32), np.arange(4), "int32")


def test_assert_allclose_takes_numpy_tolerances() -> None:
    assert_allclose([1.0], [1.0 + 1e-6], rtol=np.float32(1e-5), atol=np.float64(0.0))
    _check_fails(lambda: assert_allclose([1.0], [1.1], rtol=np.float32(1e-5), atol=np.float64(0.0)))


@pytest.mark.parametrize("kwargs", [{"rtol": float("nan")}, {"atol": -1.0}, {"atol": float("inf")}])
def test_assert_allclose_refuses_tolerances_that_accept_anything(kwargs: dict) -> None:
    clean_error(lambda: assert_allclose([1.0], [2.0], **kwargs), next(iter(kwargs)), types=ValueError)


@settings(max_examples=60, deadline=None)
@given(ARRAYS, st.data())
def test_assert_allclose_fails_on_any_difference_beyond_tolerance(expected: np.ndarray, data: st.DataObject) -> None:
    assert_allclose(expected.copy(), expected)   # identical arrays pass
    if expected.size == 0:
        return
    idx = data.draw(st.tuples(*(st.integers(0, n - 1) for n in expected.shape)))
    actual = expected.copy()
    old = actual[idx]
    finite = expected[np.isfinite(expected)]
    atol = 1e-5 * max(float(np.max(np.abs(finite))) if finite.size else 0.0, 1e-30)
    choices = [v for v in (np.nan, np.inf, -np.inf) if not (v == old or (np.isnan(v) and np.isnan(old)))]
    if np.isfinite(old):
        choices.append(old + 10 * (atol + 1e-5 * abs(old)) + 1.0)
    actual[idx] = data.draw(st.sampled_from(choices))
    with pytest.raises(AssertionError):
        assert_allclose(actual, expected)


@nki.jit
def _copy_kernel(x):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(x))
    return out


@nki.jit
def _no_output(x):
    nl.load(x)


def test_assert_kernel_matches_refuses_a_kernel_returning_nothing() -> None:
    x = np.ones((4, 8), np.float32)
    _check_fails(lambda: assert_kernel_matches(_no_output, lambda a: a, x), "0 outputs")
    _check_fails(lambda: assert_kernel_matches(_no_output, lambda a: None, x), "no values")
    _check_fails(lambda: assert_kernel_matches(_copy_kernel, lambda a: a + 1, x), "differs")
    assert_kernel_matches(_copy_kernel, lambda a: a, x)


@pytest.mark.parametrize("max_ns", [float("nan"), float("inf"), -1.0, 0])
def test_assert_latency_refuses_budgets_that_cannot_fail(max_ns: float) -> None:
    clean_error(lambda: assert_latency(_copy_kernel, np.ones((4, 8), np.float32), max_ns=max_ns), "max_ns",
                types=ValueError)


def test_assert_latency_refuses_a_kernel_with_no_instructions() -> None:
    @nki.jit
    def nothing(x):
        return None

    _check_fails(lambda: assert_latency(nothing, np.ones((4, 8), np.float32), max_ns=1e9), "no instructions")


# -- Programs ------------------------------------------------------------------

def _two_memsets() -> Program:
    p = Program("trn1")
    t = p.sbuf((128, 4))
    p.add(Memset(t.view(), 1.0, engine=Engine.VECTOR))
    p.add(Memset(t.view(), 2.0, engine=Engine.VECTOR, deps=(0,)))
    return p


def test_instruction_dependencies_are_fixed_once_added() -> None:
    p = _two_memsets()

    def cycle() -> None:
        p.instructions[0].deps = (1,)

    clean_error(cycle, "instruction 0 memset", "deps", "build a new instruction", types=ProgramError)
    assert p.instructions[0].deps == ()
    simulate(p)


def test_an_instruction_joins_one_program_once() -> None:
    p = _two_memsets()
    clean_error(lambda: p.add(p.instructions[1]), "already in program", types=ProgramError)


def test_a_refused_instruction_can_be_fixed_and_added() -> None:
    p = Program("trn1")
    t = p.sbuf((128, 4))
    inst = Memset(t.view(), 1.0, engine=Engine.VECTOR, deps=(5,))
    clean_error(lambda: p.add(inst), "dependency 5", types=ProgramError)
    inst.deps = ()
    assert p.add(inst) == 0


def test_instructions_put_in_the_list_directly_do_not_simulate() -> None:
    p = _two_memsets()
    t = p.tensors[0]
    p.instructions.append(Memset(t.view(), 3.0, engine=Engine.VECTOR, deps=(2,)))
    clean_error(lambda: simulate(p), "Program.add", types=SimulationError)
    p = _two_memsets()
    p.instructions.reverse()
    clean_error(lambda: simulate(p), "Program.add", types=SimulationError)


# -- memory nothing wrote ----------------------------------------------------------

def _store_part(rows: slice, cols: slice, dtype: object = None):
    @nki.jit
    def part(x):
        out = nl.ndarray(x.shape, dtype or x.dtype, buffer=nl.shared_hbm)
        nl.store(out[rows, cols], value=nl.load(x[rows, cols]))
        return out

    return part


@pytest.mark.parametrize("rows, cols, region", [
    (slice(0, 64), slice(0, 8), "rows 64:128"),
    (slice(0, 128), slice(0, 5), "columns 5:8"),
    (slice(0, 32), slice(0, 4), "896 of 1024 elements, within [0:128, 0:8]"),
])
def test_unwritten_output_reads_nan_and_warns(rows: slice, cols: slice, region: str) -> None:
    from trnsim.errors import UnwrittenOutputWarning

    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    with pytest.warns(UnwrittenOutputWarning) as caught:
        out = _store_part(rows, cols)(x)
    message = str(caught[0].message)
    assert "'part'" in message and region in message and "[128, 8]" in message, message
    assert np.array_equal(out[rows, cols], x[rows, cols])
    written = np.zeros(x.shape, bool)
    written[rows, cols] = True
    assert np.isnan(out[~written]).all()


def test_unwritten_output_warning_can_be_an_error() -> None:
    import warnings

    from trnsim.errors import UnwrittenOutputWarning

    x = np.ones((128, 8), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnwrittenOutputWarning)
        clean_error(lambda: _store_part(slice(0, 64), slice(0, 8))(x), "rows 64:128", types=UnwrittenOutputWarning)


def test_unwritten_narrow_and_integer_outputs() -> None:
    from trnsim.errors import UnwrittenOutputWarning

    x = np.ones((128, 8), np.float32)
    with pytest.warns(UnwrittenOutputWarning, match="read as NaN"):
        out = _store_part(slice(0, 64), slice(0, 8), nl.bfloat16)(x)
    assert np.isnan(out[64:]).all() and (out[:64] == 1).all()
    xi = np.full((128, 8), 7, np.int32)
    with pytest.warns(UnwrittenOutputWarning, match="read as 0"):
        out = _store_part(slice(0, 64), slice(0, 8))(xi)
    assert (out[64:] == 0).all() and (out[:64] == 7).all()


def test_a_partial_kernel_fails_its_check() -> None:
    from trnsim.errors import UnwrittenOutputWarning

    x = np.ones((128, 8), np.float32)
    with pytest.warns(UnwrittenOutputWarning):
        _check_fails(lambda: assert_kernel_matches(_store_part(slice(0, 64), slice(0, 8)), lambda a: a, x),
                     "512 of 1024")


def test_program_hbm_never_written_reads_nan() -> None:
    from trnsim.errors import UninitializedReadWarning, UnwrittenOutputWarning

    p = Program("trn1", name="partial")
    src = p.hbm((4, 4), kind="input", name="src")
    scratch = p.hbm((4, 4), name="scratch")
    out = p.hbm((4, 4), kind="output", name="out")
    p.dma(out[0:2, :], scratch[0:2, :])    # copies memory nothing wrote
    p.dma(out[2:4, 0:2], src[2:4, 0:2])
    with pytest.warns(UnwrittenOutputWarning, match=r"'partial': elements \[2:4, 2:4\] of output out \[4, 4\]"), \
            pytest.warns(UninitializedReadWarning, match=r"instruction 0 dma_copy reads hbm:scratch") as caught:
        result = simulate(p, {"src": np.ones((4, 4))}, fidelity="instruction")
    assert {w.filename for w in caught} == {__file__}   # attributed to the caller, not to trnsim
    got = result.outputs["out"]
    assert np.isnan(got[0:2]).all() and (got[2:4, 0:2] == 1).all() and np.isnan(got[2:4, 2:4]).all()


# -- kernel library shape preconditions ------------------------------------------

@pytest.mark.parametrize("kernel", ["matmul_basic", "matmul_optimized"])
@pytest.mark.parametrize("k, m, n, named", [
    (128, 200, 512, "M = 200"), (200, 128, 512, "K = 200"), (128, 128, 600, "N = 600"),
    (128, 128 * 17, 512, "M = 2176"),
])
def test_tiled_matmuls_refuse_shapes_their_loops_do_not_cover(kernel: str, k: int, m: int, n: int, named: str) -> None:
    from trnsim.kernels import matmul

    if kernel == "matmul_basic" and m == 128 * 17:
        return   # 17 tiles of M are fine for the basic kernel: it has no blocks
    lhsT, rhs = np.ones((k, m), np.float32), np.ones((k, n), np.float32)
    clean_error(lambda: nki.trace_program(getattr(matmul, kernel), lhsT, rhs), kernel, named, "matmul_general",
                types=ProgramError)


def test_tiled_matmul_refuses_operands_of_two_contraction_sizes() -> None:
    from trnsim.kernels.matmul import matmul_basic

    clean_error(lambda: matmul_basic(np.ones((256, 128), np.float32), np.ones((128, 512), np.float32)),
                "[256, 128] and [128, 512]", types=ProgramError)


def test_flash_attention_names_the_shape_it_needs() -> None:
    from trnsim.kernels.attention import flash_attention_fwd

    q = np.ones((130, 64), np.float32)
    kv = np.ones((256, 64), np.float32)
    clean_error(lambda: flash_attention_fwd(q, kv, kv), "seqlen = 130", "multiple of 128", "pad",
                types=ProgramError)
    clean_error(lambda: flash_attention_fwd(kv, kv[:200], kv[:200]), "keys = 200", "pad", types=ProgramError)


def test_readme_softmax_on_200_rows_is_not_silently_zero() -> None:
    from trnsim.errors import UnwrittenOutputWarning

    @nki.jit
    def softmax_rows(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        for i in nl.affine_range(x.shape[0] // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], value=nl.softmax(t, axis=1))
        return out

    with pytest.warns(UnwrittenOutputWarning, match=r"'softmax_rows': rows 128:200 of output .* \[200, 512\]"):
        y = softmax_rows(np.zeros((200, 512), np.float32))
    assert np.isnan(y[128:]).all() and np.allclose(y[:128], 1 / 512)


def _library_cases():
    from trnsim.kernels.elementwise import binary_kernel, unary_kernel
    from trnsim.kernels.gemm import matmul_general
    from trnsim.kernels.norms import rmsnorm_kernel
    from trnsim.kernels.reduce import log_softmax_kernel, reduce_kernel
    from trnsim.kernels.softmax import softmax_kernel

    def softmax(a):
        e = np.exp(a - a.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    w = np.linspace(0.5, 1.5, 4100)
    return {
        "softmax": (softmax_kernel, softmax),
        "log_softmax": (log_softmax_kernel, lambda a: np.log(softmax(a))),
        "reduce_max": (lambda a: reduce_kernel(a, op="max"), lambda a: a.max(axis=1).reshape(-1, 1)),
        "rmsnorm": (lambda a: rmsnorm_kernel(a, w[:a.shape[1]].astype(np.float32)),
                    lambda a: a / np.sqrt((a * a).mean(axis=1, keepdims=True) + 1e-6) * w[:a.shape[1]]),
        "unary_exp": (lambda a: unary_kernel(a, op="exp"), np.exp),
        "binary_column": (lambda a: binary_kernel(a, a[:, :1].copy(), op="subtract"), lambda a: a - a[:, :1]),
        "matmul_general": (lambda a: matmul_general(a, a[:, :2].copy()), lambda a: a.T @ a[:, :2]),
    }


@pytest.mark.parametrize("rows, cols", [(129, 3), (3, 4100), (200, 130)])
@pytest.mark.parametrize("name", sorted(_library_cases()))
def test_library_kernels_cover_awkward_shapes(name: str, rows: int, cols: int) -> None:
    import warnings

    kernel, ref = _library_cases()[name]
    x = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = kernel(x)
    want = ref(x.astype(np.float64))
    assert_allclose(np.asarray(got).reshape(want.shape), want, "float32", rtol=1e-4)


def test_a_dependency_list_changed_after_add_does_not_reach_the_schedule() -> None:
    p = Program("trn1")
    t = p.sbuf((128, 4))
    p.add(Memset(t.view(), 1.0, engine=Engine.VECTOR))
    deps = [0]
    p.add(Memset(t.view(), 2.0, engine=Engine.VECTOR, deps=deps))
    deps.append(1)   # would make instruction 1 wait for itself
    assert p.instructions[1].deps == (0,)
    assert simulate(p).total_ps > 0
    clean_error(lambda: p.add(Memset(t.view(), 3.0, engine=Engine.VECTOR, deps=5)), "deps 5", types=ProgramError)


def test_operands_of_an_added_instruction_cannot_change_under_it() -> None:
    p = _two_memsets()
    view, tensor = p.instructions[0].dst, p.tensors[0]

    def move_view() -> None:
        view.offset = 4

    def reshape_tensor() -> None:
        tensor.shape = (64, 8)

    clean_error(move_view, "views are values", types=ProgramError)
    clean_error(reshape_tensor, "cannot change its shape", types=ProgramError)
    assert view.offset == 0 and tensor.shape == (128, 4)


# -- Program construction and simulate's arguments -------------------------------

@pytest.mark.parametrize("shape", [[128, 1.5], [128, True], "128", [128, None]])
def test_program_shapes_are_integers_not_truncated(shape: object) -> None:
    clean_error(lambda: Program("trn1").hbm(shape, "bfloat16", "x"), "must be a sequence of integers",
                types=ProgramError)


def test_program_shapes_take_numpy_integers() -> None:
    assert Program("trn1").hbm([np.int64(128), np.int32(4)], "bfloat16", "x").shape == (128, 4)


@pytest.mark.parametrize("program, inputs, fragment", [
    ("not a program", None, "takes a Program, not str"),
    (None, None, "takes a Program, not NoneType"),
])
def test_simulate_refuses_what_is_not_a_program(program: object, inputs: object, fragment: str) -> None:
    clean_error(lambda: simulate(program, inputs), fragment, types=ProgramError)


def test_simulate_refuses_inputs_that_are_not_a_mapping() -> None:
    p = Program("trn1")
    p.hbm([128, 4], "float32", "x", kind="input")
    clean_error(lambda: simulate(p, [np.ones((128, 4))], fidelity="instruction"), "must map input tensor names",
                types=ProgramError)


# -- errors name the kernel's own tensors ---------------------------------------------------

_INTERNAL_NAME = r"\b(?:sbuf|psum|hbm)_\d+\b"


@nki.jit
def _store_of_the_wrong_shape(a_input):
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    half_tile = nl.load(a_input[0:64, :])
    nl.store(c_output, value=half_tile)
    return c_output


@nki.jit
def _read_before_write(a_input):
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    scratch = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.sbuf)
    nl.store(c_output, value=nl.exp(scratch))
    return c_output


@nki.jit
def _nameless_tile(a_input):
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    nl.store(c_output, value=nl.exp(nl.load(a_input[0:64, :])))
    return c_output


@nki.jit
def _half_written(a_input):
    c_output = nl.ndarray((200, 512), dtype=a_input.dtype, buffer=nl.shared_hbm)
    nl.store(c_output[0:128, :], value=nl.load(a_input))
    return c_output


@pytest.mark.parametrize("kernel, fragments", [
    (_store_of_the_wrong_shape, ("half_tile[64, 512]", "c_output[128, 512]",
                                 "store a [128, 512] value into c_output", "c_output[0:64, 0:512]")),
    (_read_before_write, ("reads SBUF tile scratch[128, 512]",)),
    (_nameless_tile, ("made at ", "test_nki.py:", "into c_output[128, 512]")),
])
def test_kernel_errors_name_the_kernels_arguments_and_variables(kernel, fragments) -> None:
    """nl.store named internal buffers (hbm_0, sbuf_0) and gave no fix."""
    import re

    err = clean_error(lambda: kernel(np.ones((128, 512), np.float32)), *fragments, types=nki.KernelError)
    # an internal name appears only beside the line that made its tile
    assert all(str(err)[m.end():].startswith(" (made at ") for m in re.finditer(_INTERNAL_NAME, str(err))), str(err)


def test_an_unwritten_output_is_named_by_its_variable() -> None:
    from trnsim.errors import UnwrittenOutputWarning

    with pytest.warns(UnwrittenOutputWarning, match=r"rows 128:200 of output c_output \[200, 512\]"):
        _half_written(np.ones((128, 512), np.float32))
