"""API gaps that AWS's public NKI tests and examples ran into, each checked with a small
kernel against numpy: legacy names (``nki.trace``, ``nl.rand`` without a dtype), kernel
arguments (numpy scalars, optional HBM tensors), the vector engine's accumulator
registers carried by ``reduce_cmd`` across instructions, ``select_reduce`` with a
per-partition ``on_false``, and tiles returned under ``jit(mode="simulation")``."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from tests.nki_isa_support import run, run_on

RNG = np.random.default_rng(23)
X = RNG.standard_normal((128, 64)).astype(np.float32)
Y = RNG.standard_normal((128, 64)).astype(np.float32)
FMIN = np.finfo(np.float32).min


def test_nki_trace_marks_a_kernel_for_simulate_kernel():
    @nki.trace
    def double(a, out):
        nl.store(out, nl.multiply(nl.load(a), 2.0))

    out = np.zeros_like(X)
    nki.simulate_kernel(double, X, out)
    np.testing.assert_array_equal(out, X * 2)


def test_rand_without_dtype_gives_float32_in_unit_interval():
    @nki.jit
    def k():
        out = nl.ndarray((32, 128), nl.float32, buffer=nl.shared_hbm)
        r = nl.rand((32, 128))
        assert r.dtype == nl.float32
        nl.store(out, r)
        return out

    v = k()
    assert v.shape == (32, 128) and (v >= 0).all() and (v < 1).all() and np.unique(v).size > 1000


def test_numpy_scalar_arguments_are_numbers():
    @nki.jit
    def k(a, scale, shift):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nisa.tensor_scalar(data=nl.load(a), op0=nl.multiply, operand0=scale, op1=nl.add, operand1=float(shift))
        nl.store(out, t)
        return out

    np.testing.assert_allclose(k(X, np.float32(3.0), np.float32(0.5)), X * np.float32(3) + np.float32(0.5), rtol=1e-6, atol=1e-6)


def test_an_optional_hbm_argument_is_true_when_given():
    @nki.jit
    def k(a, b=None):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        extra = nl.load(b) if b else None
        nl.store(out, nl.add(t, extra) if extra is not None else t)
        return out

    np.testing.assert_array_equal(k(X), X)
    np.testing.assert_array_equal(k(X, Y), X + Y)


def test_a_tile_still_has_no_truth_value():
    def body(x):
        return x if x else x
    with pytest.raises(KernelError, match="a tile has no truth value"):
        run(body, X)


@pytest.mark.parametrize("op, ufunc", [(nl.max, np.maximum), (nl.min, np.minimum), (np.max, np.maximum)])
def test_reductions_name_alu_operations(op, ufunc):
    def body(x, y):
        return nisa.tensor_tensor(data1=x, data2=y, op=op)
    np.testing.assert_array_equal(run(body, X, Y), ufunc(X, Y))


def test_tensor_scalar_cumulative_continues_the_accumulator():
    def body(x):
        dst = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(src=x, dst=dst, op0=nl.multiply, op1=nl.add, imm0=2.0,
                                      reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.tensor_scalar_cumulative(src=x, dst=dst, op0=nl.multiply, op1=nl.add, imm0=2.0,
                                      reduce_cmd=nisa.reduce_cmd.reduce)
        return dst
    first = np.cumsum(X.astype(np.float64) * 2, axis=1)
    np.testing.assert_allclose(run(body, X), first[:, -1:] + first, rtol=1e-5, atol=1e-4)


def test_tensor_scalar_cumulative_loads_a_tile_and_keeps_fp32_registers():
    init = RNG.standard_normal((128, 1)).astype(np.float32)

    def body(x, i):
        low = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(src=x, dst=low, op0=nl.add, op1=nl.maximum, imm0=0.0, imm1=i,
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(data=x[:, 0:1], op0=nl.multiply, operand0=0.0, reduce_op=nl.maximum, reduce_res=res,
                                  reduce_cmd=nisa.reduce_cmd.reduce)
        return res
    # the running max ends at max(init, max(x)) in fp32, not rounded through dst's bfloat16
    expected = np.maximum(np.maximum(init[:, 0], X.max(axis=1)), 0.0)
    np.testing.assert_array_equal(run(body, X, init, shape=(128, 1))[:, 0], expected)


def test_range_select_chain_reduces_across_instructions():
    lo = np.zeros((128, 1), np.float32)
    hi = np.full((128, 1), 100.0, np.float32)

    def body(x, b0, b1):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        for i in range(3):
            nisa.range_select(on_true_tile=nl.add(x, float(i)), comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0,
                              bound1=b1, range_start=64 * i, reduce_op=nl.maximum,
                              reduce_cmd=nisa.reduce_cmd.reset_reduce if i == 0 else nisa.reduce_cmd.reduce,
                              reduce_res=res if i == 2 else None)
        return res
    idx = np.arange(64)[None, :]
    parts = [np.where((64 * i + idx >= 0) & (64 * i + idx < 100), X + i, FMIN).max(axis=1) for i in range(3)]
    np.testing.assert_array_equal(run_on("trn2", body, X, lo, hi, shape=(128, 1))[:, 0], np.max(parts, axis=0))


def test_select_reduce_takes_a_per_partition_on_false_and_accumulates():
    pred = (X > 0).astype(np.uint8)
    fill = RNG.standard_normal((128, 1)).astype(np.float32)

    def body(p, x, f):
        dst = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=dst, predicate=p, on_true=x, on_false=f, reduce_cmd=nisa.reduce_cmd.reset_reduce,
                           reduce_op=nl.max)
        nisa.select_reduce(dst=dst, predicate=p, on_true=nl.multiply(x, -1.0), on_false=f, reverse_pred=True,
                           reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=res)
        return nl.add(dst, res)
    first = np.where(pred != 0, X, fill)
    second = np.where(pred == 0, -X, fill)
    acc = np.maximum(first.max(axis=1), second.max(axis=1))[:, None]
    np.testing.assert_array_equal(run(body, pred, X, fill), second + acc)


def test_tensor_scalar_reduce_and_exponential_share_the_registers():
    init = RNG.standard_normal((128, 1)).astype(np.float32)

    def body(x, i):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(data=x, op0=nl.multiply, operand0=0.5, reduce_op=nl.add,
                                  reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=i)
        nisa.exponential(src=x, max_value=1.0, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=res)
        return res
    x64 = X.astype(np.float64)
    expected = init[:, 0] + (x64 * 0.5).sum(axis=1) + np.exp(x64 - 1.0).sum(axis=1)
    np.testing.assert_allclose(run(body, X, init, shape=(128, 1))[:, 0], expected, rtol=1e-5, atol=1e-5)


def test_reduce_after_idle_is_refused_with_the_reason():
    def body(x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.exponential(src=x, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.select_reduce(predicate=x, on_true=x, on_false=0.0, reduce_cmd=nisa.reduce_cmd.idle)
        nisa.exponential(src=x, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res=res)
        return res
    with pytest.raises(KernelError, match="reduce_cmd=reduce continues the accumulator, but no earlier instruction"):
        run(body, X, shape=(128, 1))


def test_simulation_mode_returns_an_sbuf_tile_and_other_modes_refuse():
    def body(a):
        t = nl.load(a)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, t)
        return nl.multiply(t, 3.0), out

    got, copy = nki.jit(body, mode="simulation")(X)
    np.testing.assert_array_equal(got, X * 3)
    np.testing.assert_array_equal(copy, X)
    with pytest.raises(KernelError, match="a kernel returns HBM tensors"):
        nki.jit(body)(X)


def test_a_write_to_a_partition_the_engines_cannot_start_on_goes_by_dma():
    @nki.jit
    def k(a):
        out = nl.ndarray((32, 10), nl.uint32, buffer=nl.shared_hbm)
        idx = nl.zeros((32, 10), dtype=nl.uint32)
        for i in nl.static_range(3):
            for j in nl.static_range(10):
                idx[i + 1, j] = 5 * j + i
        t = nl.load(a)
        idx[7:8, :] = t[9:10, :]
        nl.store(out, idx)
        return out

    src = RNG.integers(0, 1000, (32, 10)).astype(np.uint32)
    expected = np.zeros((32, 10), np.uint32)
    expected[1:4] = 5 * np.arange(10)[None, :] + np.arange(3)[:, None]
    expected[7] = src[9]
    np.testing.assert_array_equal(k(src), expected)
    with pytest.raises(KernelError, match="start partition 1 is misaligned"):
        run(lambda x: nl.exp(x[1:2, :]), X, shape=(1, 64))


@pytest.mark.parametrize("dtype, largest", [(nl.float32, np.finfo(np.float32).max), (nl.float16, 65504.0),
                                            (nl.bfloat16, 3.3895313892515355e38), (nl.float8_e4m3, 240.0),
                                            (nl.float8_e4m3fn, 448.0), (nl.float8_e5m2, 57344.0)])
def test_finfo_gives_the_limits_the_chip_rounds_to(dtype, largest):
    info = nl.finfo(dtype)
    assert info.max == largest and info.min == -largest

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nl.copy(nl.load(a), dtype=dtype), dtype=nl.float32))
        return out

    # the most negative finite value, 1 + eps and the smallest normal survive the dtype; 1 + eps / 4 rounds to 1
    values = np.array([[info.min, 1 + info.eps, 1 + info.eps / 4, info.tiny]], np.float64).astype(np.float32)
    np.testing.assert_array_equal(k(values), values * np.array([[1, 1, 0, 1]], np.float32) + [[0, 0, 1, 0]])
    with pytest.raises(Exception, match="not a float dtype"):
        nl.finfo(nl.int32)


def test_reductions_over_free_axes_that_are_not_trailing():
    a = RNG.standard_normal((128, 6, 5, 4)).astype(np.float32)

    @nki.jit
    def k(x):
        s = nl.ndarray((128, 5), nl.float32, buffer=nl.shared_hbm)
        m = nl.ndarray((128, 6, 1, 4), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(s, nl.sum(t, axis=(1, 3)))
        nl.store(m, nl.max(t, axis=2, keepdims=True))
        return s, m

    s, m = k(a)
    np.testing.assert_allclose(s, a.astype(np.float64).sum(axis=(1, 3)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m, a.max(axis=2, keepdims=True))
    with pytest.raises(KernelError, match="must be the trailing free axes for nl.var"):
        run(lambda x: nl.var(x, axis=1), a[:, :, 0, 0:1].reshape(128, 6, 1), shape=(128, 1))


def test_a_windowed_max_reduces_the_window_axes_of_an_index_grid():
    a = RNG.standard_normal((128, 3, 20)).astype(np.float32)

    def body(t):
        i_h, i_kh, i_w, i_kw = nl.mgrid[0:128, 0:3, 0:18, 0:3]
        return nl.max(t[i_h, i_kh, i_w + i_kw], axis=[1, 3])
    windows = np.stack([a[:, :, j:j + 18] for j in range(3)], axis=-1)
    np.testing.assert_array_equal(run(body, a, shape=(128, 18)), windows.max(axis=(1, 3)))


def test_nl_matmul_copies_a_psum_operand_to_sbuf():
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    b = RNG.standard_normal((64, 128)).astype(np.float32)

    @nki.jit
    def k(x, y):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        y_t = nl.transpose(nl.load(y))          # [128, 64] in PSUM
        assert y_t.buffer is nl.psum
        nl.store(out, nl.matmul(nl.load(x), nl.transpose(y_t), transpose_x=False))
        return out

    np.testing.assert_allclose(k(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@nki.jit
def test_kernel_named_like_a_test(a):
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(a))
    return out


def test_pytest_does_not_collect_a_kernel_named_test(request):
    names = {item.name for item in request.session.items}
    assert "test_pytest_does_not_collect_a_kernel_named_test" in names
    assert "test_kernel_named_like_a_test" not in names
    np.testing.assert_array_equal(test_kernel_named_like_a_test(X), X)
