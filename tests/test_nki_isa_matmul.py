"""nki.isa's tensor engine: nc_matmul and nc_transpose (PE array and vector engine).

Each is checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from trnsim.testing import assert_allclose
from tests.nki_isa_support import run

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)


def test_transpose_and_matmul_without_transpose_x():
    a = RNG.standard_normal((64, 128)).astype(np.float32)  # [M, K]
    b = RNG.standard_normal((128, 256)).astype(np.float32)  # [K, N]

    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((64, 256), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        nl.store(out, value=nl.copy(nl.matmul(ta, tb)))
        nl.store(t, value=nisa.nc_transpose(ta))
        return out, t

    out, t = kernel(a, b)
    assert_allclose(out, a.astype(np.float64) @ b, "float32")
    np.testing.assert_array_equal(t, a.T)


def test_vector_engine_transpose():
    a = X[:32, :16]
    got = run(lambda x: nisa.nc_transpose(x, engine=nisa.vector_engine), a, shape=(16, 32))
    np.testing.assert_array_equal(got, a.T)
    with pytest.raises(KernelError, match="at most 32x32"):
        run(lambda x: nisa.nc_transpose(x, engine=nisa.engine.vector), X, shape=(64, 128))


def _fp8(a):
    """Values that float8_e4m3 holds exactly (small integers)."""
    return np.round(a * 2).clip(-4, 4).astype(np.float32)


@nki.jit
def double_row_kernel(a, b, perf_mode="double_row"):
    """stationary a [K, 2, M] and moving b [K, 2, N], both fp8, contracted over 2K."""
    k, _, m = a.shape
    n = b.shape[2]
    out = nl.ndarray((m, n), nl.float32, buffer=nl.shared_hbm)
    ta = nl.load(a)
    tb = nl.load(b)
    acc = nl.ndarray((m, n), nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, ta, tb, perf_mode=perf_mode)
    nl.store(out, value=nl.copy(acc))
    return out


def _double_row_case(k=128, m=96, n=384):
    a = _fp8(RNG.standard_normal((k, 2, m)))
    b = _fp8(RNG.standard_normal((k, 2, n)))
    # row r * K + k of the contraction is [k, r] (the first tile is the first half)
    want = np.einsum("krm,krn->mn", a.astype(np.float64), b.astype(np.float64))
    return nki.typed(a, "float8_e4m3"), nki.typed(b, "float8_e5m2"), want


@pytest.mark.parametrize("mode", ["double_row", "double_row_gen3", nisa.matmul_perf_mode.double_row],
                         ids=["name", "gen3 name", "enum"])
def test_double_row_contracts_over_both_rows(mode):
    a, b, want = _double_row_case()
    got = double_row_kernel(a, b, perf_mode=mode)
    np.testing.assert_array_equal(got, want)


def test_double_row_takes_the_time_of_a_bf16_matmul_over_half_the_rows():
    """The arch guide: a double-row load and multiply over 256 rows take the time of a
    bf16 pair over 128; fp8 without the mode streams at the bf16 rate."""
    from trnsim.hw.engines import cost_ps
    from trnsim.isa import LoadStationary, MultiplyMoving

    a, b, _ = _double_row_case()
    program = nki.trace_program(double_row_kernel, a, b, chip="trn2")
    load = next(i for i in program.instructions if isinstance(i, LoadStationary))
    mult = next(i for i in program.instructions if isinstance(i, MultiplyMoving))
    assert load.double_row and mult.double_row
    assert program.flops() == 2 * 256 * 96 * 384
    p = program
    bf16_load = LoadStationary(p.sbuf([128, 96], "bfloat16", "s16").view(), engine=nisa.tensor_engine)
    bf16_mult = MultiplyMoving(p.psum([96, 384], "float32", "o16").view(), p.sbuf([128, 384], "bfloat16", "m16").view(),
                               engine=nisa.tensor_engine)
    fp8_mult = MultiplyMoving(mult.dst, p.sbuf([128, 384], "float8_e5m2", "m8").view(), engine=nisa.tensor_engine)
    assert cost_ps(p.chip, load) == cost_ps(p.chip, bf16_load)
    assert cost_ps(p.chip, mult, stationary_free=96) == cost_ps(p.chip, bf16_mult, stationary_free=96)
    assert cost_ps(p.chip, fp8_mult, stationary_free=96) == cost_ps(p.chip, bf16_mult, stationary_free=96)


@pytest.mark.parametrize("change, message", [
    (lambda a, b: (a, b, "trn1"), "needs NeuronCore-v3 or later; trn1"),
    (lambda a, b: (nki.typed(np.zeros((128, 2, 96), np.float32), "bfloat16"), b, "trn2"), "stationary is bfloat16"),
    (lambda a, b: (a, nki.typed(np.zeros((128, 3, 128), np.float32), "float8_e5m2"), "trn2"), "must be \\[K, 2, X\\]"),
])
def test_double_row_refuses_what_the_compiler_refuses(change, message):
    a, b, _ = _double_row_case()
    a, b, chip = change(a, b)
    with pytest.raises(KernelError, match=message):
        nki.trace_program(double_row_kernel, a, b, chip=chip)


def test_perf_mode_must_be_a_mode():
    a, b, _ = _double_row_case()
    with pytest.raises(KernelError, match="perf_mode='fast' is not a performance mode"):
        nki.trace_program(double_row_kernel, a, b, perf_mode="fast", chip="trn2")


def test_double_row_takes_ml_dtypes_fp8_arrays_as_they_are():
    """AWS's API test passes ``np.ones(shape, dtype=nl.float8_e5m2)``: an ml_dtypes array
    (numpy kind "f" in newer ml_dtypes releases, "V" in older ones) is an fp8 argument."""
    a = np.ones((128, 2, 1), dtype=nl.float8_e5m2)
    b = np.ones((128, 2, 512), dtype=nl.float8_e5m2)
    assert a.dtype.name == "float8_e5m2"
    np.testing.assert_array_equal(double_row_kernel(a, b), np.full((1, 512), 256.0))
