"""The rest of nki.isa (scans, fused ops, top-8, gathers, shuffles, random numbers,
constants, refusals), each checked against an independent numpy computation."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki import KernelError
from tests.test_nki_isa import run

RNG = np.random.default_rng(11)
X = RNG.standard_normal((128, 64)).astype(np.float32)
Y = RNG.standard_normal((128, 64)).astype(np.float32)
F32 = np.float32


def run_on(chip, body, *arrays, shape=(128, 64), dtype=nl.float32):
    @nki.jit(chip=chip)
    def kernel(*xs):
        out = nl.ndarray(shape, dtype, buffer=nl.shared_hbm)
        nl.store(out, value=body(*[nl.load(x) for x in xs]))
        return out

    return kernel(*arrays)


def test_tensor_tensor_scan_both_styles():
    a, b = X[:, :16], Y[:, :16]
    expect = np.empty_like(a)
    prev = np.full(128, F32(0.5))
    for i in range(16):
        prev = (a[:, i] * prev).astype(F32)
        prev = (prev + b[:, i]).astype(F32)
        expect[:, i] = prev
    got = run(lambda x, y: nisa.tensor_tensor_scan(x, y, 0.5, nl.multiply, nl.add), a, b, shape=(128, 16))
    np.testing.assert_array_equal(got, expect)

    def dst_style(x, y):
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor_scan(dst=out, data0=x, data1=y, initial=0.5, op0=nl.multiply, op1=nl.add)
        return out
    np.testing.assert_array_equal(run(dst_style, a, b, shape=(128, 16)), expect)


def test_tensor_scalar_cumulative_running_max_and_load_reduce():
    got = run(lambda x: nisa.tensor_scalar_cumulative(src=x, op0=nl.multiply, op1=nl.maximum, imm0=2.0), X)
    np.testing.assert_array_equal(got, np.maximum.accumulate(X * F32(2), axis=1))

    def body(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_cumulative(dst=out, src=x, op0=nl.add, op1=nl.add, imm0=0.0, imm1=10.0,
                                      reduce_cmd=nisa.reduce_cmd.load_reduce)
        return out
    expect = np.empty_like(X)
    acc = np.full(128, F32(10))
    for i in range(64):
        acc = (X[:, i] + acc).astype(F32)
        expect[:, i] = acc
    np.testing.assert_array_equal(run(body, X), expect)


def test_scalar_tensor_tensor_and_reverse():
    got = run(lambda x, y: nisa.scalar_tensor_tensor(data=x, op0=nl.multiply, operand0=2.0, op1=nl.subtract,
                                                     operand1=y, reverse1=True), X, Y)
    np.testing.assert_array_equal(got, Y - (X * F32(2)))

    def dst_style(x, y):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=out, data=x, op0=nl.add, operand0=1.0, op1=nl.maximum, operand1=y)
        return out
    np.testing.assert_array_equal(run(dst_style, X, Y), np.maximum(X + F32(1), Y))


def test_reciprocal_costs_more_than_a_copy():
    got = run(lambda x: nisa.reciprocal(x), X)
    np.testing.assert_array_equal(got, (F32(1) / X))

    @nki.jit
    def k(x, which):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nisa.reciprocal(t) if which else nisa.tensor_copy(t))
        return out
    recip = nki.benchmark(k, numerics=False)(X, True).latency_ns
    copy = nki.benchmark(k, numerics=False)(X, False).latency_ns
    assert recip > copy


def test_tensor_scalar_reduce_and_activation_reduce():
    def body(x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(data=x, op0=nl.multiply, operand0=3.0, reduce_op=nl.maximum, reduce_res=res)
        return res
    np.testing.assert_array_equal(run(body, X, shape=(128, 1))[:, 0], (X * F32(3)).max(axis=1))

    def body2(x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(op=nl.exp, data=x, reduce_op=nl.add, reduce_res=res)
        return res
    np.testing.assert_allclose(run(body2, X, shape=(128, 1))[:, 0], np.exp(X.astype(np.float64)).sum(axis=1), rtol=1e-5)


def test_activate2_scale_bias_then_function():
    b = RNG.standard_normal((128, 1)).astype(np.float32)

    def body(x, bias):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.activate2(dst=out, op=nl.exp, data=x, imm0=0.5, imm1=bias, op0=nl.multiply, op1=nl.subtract,
                       reduce_op=nl.add, reduce_res=res)
        return res
    expect = np.exp((X * F32(0.5) - b).astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(run_on("trn3", body, X, b, shape=(128, 1))[:, 0], expect, rtol=1e-5)
    with pytest.raises(KernelError, match="activate2 is available only on NeuronCore-v4"):
        run(body, X, b, shape=(128, 1))


def test_exponential_subtracts_the_max():
    m = X.max(axis=1, keepdims=True)

    def body(x, mx):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.exponential(dst=out, src=x, max_value=mx)
        return out
    np.testing.assert_allclose(run(body, X, m), np.exp(X.astype(np.float64) - m), rtol=1e-6)


def test_max8_find_index8_match_replace8():
    data = RNG.permutation(128 * 64).reshape(128, 64).astype(np.float32)
    top = -np.sort(-data, axis=1)[:, :8]
    np.testing.assert_array_equal(run(lambda x: nisa.max8(src=x), data, shape=(128, 8)), top)
    idx = run(lambda x, v: nisa.nc_find_index8(data=x, vals=v), data, top, shape=(128, 8), dtype=nl.uint32)
    np.testing.assert_array_equal(idx, np.argsort(-data, axis=1, kind="stable")[:, :8])

    def body(x, v):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.nc_match_replace8(dst=out, data=x, vals=v, imm=-1.0)
        return out
    expect = data.copy()
    np.put_along_axis(expect, np.argsort(-data, axis=1)[:, :8], -1.0, axis=1)
    np.testing.assert_array_equal(run(body, data, top), expect)


def test_match_replace8_duplicates_fill_slots_last_first():
    data = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0]], np.float32)
    vals = np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32)

    def body(x, v):
        idx = nl.ndarray((1, 8), nl.uint32, buffer=nl.sbuf)
        nisa.nc_match_replace8(data=x, vals=v, imm=0.0, dst_idx=idx)
        return idx
    np.testing.assert_array_equal(run(body, data, vals, shape=(1, 8), dtype=nl.uint32), [[2, 10, 9, 8, 7, 6, 5, 4]])


def test_range_select_and_select_reduce():
    lo = RNG.integers(0, 32, (128, 1)).astype(np.float32)
    hi = lo + 16
    fmin = np.finfo(np.float32).min

    def body(x, b0, b1):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.range_select(on_true_tile=x, comp_op0=nl.greater_equal, comp_op1=nl.less, bound0=b0, bound1=b1,
                          reduce_res=res, range_start=4)
        return res
    i = 4 + np.arange(64)[None, :]
    keep = (i >= lo) & (i < hi)
    np.testing.assert_array_equal(run_on("trn2", body, X, lo, hi, shape=(128, 1))[:, 0],
                                  np.where(keep, X, fmin).max(axis=1))
    with pytest.raises(KernelError, match="on_false_value must be FP32_MIN"):
        run_on("trn2", lambda x, b0, b1: nisa.range_select(on_true_tile=x, comp_op0=nl.less, comp_op1=nl.less, bound0=b0,
                                                       bound1=b1, on_false_value=0.0), X, lo, hi)

    pred = (X > 0).astype(np.float32)

    def body2(p, x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(dst=out, predicate=p, on_true=x, on_false=-5.0, reduce_res=res, reverse_pred=True)
        return res
    np.testing.assert_array_equal(run(body2, pred, X, shape=(128, 1))[:, 0], np.where(pred != 0, -5.0, X).max(axis=1))


def test_tensor_copy_predicated_keeps_dst_elsewhere():
    pred = (X > 0.5).astype(np.float32)

    def body(p, x, y):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=y)
        nisa.tensor_copy_predicated(dst=out, src=x, predicate=p)
        return out
    np.testing.assert_array_equal(run(body, pred, X, Y), np.where(pred != 0, X, Y))


def test_sequence_bounds_matches_the_documented_example():
    ids = np.array([[0, 1, 1, 2, 2, 2, 0, 3, 3]], np.float32)
    got = run(lambda s: nisa.sequence_bounds(segment_ids=s), ids, shape=(1, 2, 9))
    np.testing.assert_array_equal(got[0], [[9, 1, 1, 3, 3, 3, 9, 7, 7], [-1, 3, 3, 6, 6, 6, -1, 9, 9]])


def test_nc_stream_shuffle_within_quadrants():
    mask = list(RNG.permutation(32))
    mask[5] = 255

    def body(x, y):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out, src=y)
        nisa.nc_stream_shuffle(src=x, dst=out, shuffle_mask=mask)
        return out
    expect = Y.copy()
    for p in range(128):
        if mask[p % 32] != 255:
            expect[p] = X[(p // 32) * 32 + mask[p % 32]]
    np.testing.assert_array_equal(run(body, X, Y), expect)
    with pytest.raises(KernelError, match="shuffle_mask must hold 32"):
        run(lambda x: nisa.nc_stream_shuffle(src=x, dst=x, shuffle_mask=[0] * 31), X)


def test_partition_reduce_and_gathers():
    got = run(lambda x: nisa.tensor_partition_reduce(nl.maximum, x), X, shape=(1, 64))
    np.testing.assert_array_equal(got[0], X.max(axis=0))

    idx = RNG.integers(0, 64, (128, 10)).astype(np.int32)
    got = run(lambda x, i: nisa.nc_n_gather(data=x, indices=i), X, idx, shape=(128, 10))
    np.testing.assert_array_equal(got, np.take_along_axis(X, idx, axis=1))

    src = RNG.standard_normal((128, 32, 4)).astype(np.float32)
    per_core = RNG.integers(0, 32, (16, 2))
    index = np.tile(per_core, (8, 1)) * 4
    got = run(lambda s, i: nisa.local_gather(s, i, 4, 20), src, index.astype(np.int32), shape=(128, 20, 4))
    expect = np.empty((128, 20, 4), np.float32)
    for core in range(8):
        rows = slice(16 * core, 16 * core + 16)
        flat = (index[rows] // 4).reshape(-1, order="F")[:20]
        expect[rows] = np.take(src[rows], flat, axis=1)
    np.testing.assert_array_equal(got, expect)


def test_gather_index_errors_name_the_bad_index_and_the_kernel_line():
    idx = RNG.integers(0, 64, (128, 10)).astype(np.int32)
    idx[7, 2], idx[90, 9] = -3, 64   # the first bad index in order is -3, though 64 is the largest
    with pytest.raises(KernelError, match=r"test_nki_isa_more\.py:\d+: nc_n_gather index -3 \(partition 7, "
                                          r"element 2 of .*\) is outside 0\.\.63, the 64 elements per partition"):
        run(lambda x, i: nisa.nc_n_gather(data=x, indices=i), X, idx, shape=(128, 10))

    src = RNG.standard_normal((128, 32, 4)).astype(np.float32)
    index = np.zeros((128, 2), np.int32)
    index[5, 0], index[3, 1] = 126, 200   # 126 is read first (indices are read column by column)
    with pytest.raises(KernelError, match=r"test_nki_isa_more\.py:\d+: local_gather index 126 \(partition 5, "
                                          r"element 0 of .*\) is outside 0\.\.124"):
        run(lambda s, i: nisa.local_gather(s, i, 4, 20), src, index, shape=(128, 20, 4))


def test_iota_and_affine_select_with_patterns():
    def body(x):
        out = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf)
        nisa.iota(out, [[1, 8], [10, 8]], offset=3, channel_multiplier=100)
        return out
    p, k = np.indices((128, 64))
    expect = 3 + 100 * p + (k // 8) + 10 * (k % 8)
    np.testing.assert_array_equal(run(body, X, dtype=nl.int32), expect)

    def body2(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.affine_select(out, [[-1, 64]], 1, x, -7.0, cmp_op=nl.greater_equal)
        return out
    np.testing.assert_array_equal(run(body2, X), np.where(p - k >= 0, X, -7.0))

    def body3(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.iota(dst=out, pattern=[[2, 64]], offset=-5, name="idx")
        return out
    np.testing.assert_array_equal(run(body3, X), -5 + 2 * k)


def test_vector_engine_transpose():
    a = X[:32, :16]
    got = run(lambda x: nisa.nc_transpose(x, engine=nisa.vector_engine), a, shape=(16, 32))
    np.testing.assert_array_equal(got, a.T)
    with pytest.raises(KernelError, match="at most 32x32"):
        run(lambda x: nisa.nc_transpose(x, engine=nisa.engine.vector), X, shape=(64, 128))


def test_dma_transpose_and_dma_copy_converts_fp32_to_bf16():
    @nki.jit
    def k(a):
        out = nl.ndarray((64, 128), nl.float32, buffer=nl.shared_hbm)
        t = nisa.dma_transpose(a[:, :])
        nl.store(out, t)
        return out
    np.testing.assert_array_equal(k(X), X.T)

    @nki.jit
    def k_sbuf(a):
        out = nl.ndarray((16, 128), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nisa.dma_transpose(nl.load(a)))
        return out
    np.testing.assert_array_equal(k_sbuf(X[:, :16]), X[:, :16].T)

    @nki.jit
    def k2(a):
        out = nl.ndarray((128, 64), nl.bfloat16, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=nl.load(a))
        return out
    import torch
    np.testing.assert_array_equal(k2(X), torch.from_numpy(X).bfloat16().float().numpy())


def test_nonzero_with_count_on_gpsimd_core_partitions():
    src = (RNG.random((128, 8)) < 0.4).astype(np.float32)
    src[0] = [0, 1, 1, 0, 0, 1, 0, 0]

    def body(s):
        out = nl.ndarray((128, 9), nl.int32, buffer=nl.sbuf)
        nisa.memset(out, 7, engine=nisa.vector_engine)
        nisa.nonzero_with_count(dst=out, src=s, index_offset=16, padding_val=-1)
        return out
    got = run_on("trn2", body, src, shape=(128, 9), dtype=nl.int32)
    np.testing.assert_array_equal(got[0], [17, 18, 21, -1, -1, -1, -1, -1, 3])
    for p in range(128):
        if p % 16:
            assert (got[p] == 7).all()
        else:
            nz = np.flatnonzero(src[p]) + 16
            np.testing.assert_array_equal(got[p], [*nz, *[-1] * (8 - nz.size), nz.size])
    with pytest.raises(KernelError, match="only on NeuronCore-v3 and newer"):
        run_on("trn1", body, src, shape=(128, 9), dtype=nl.int32)


def test_random_numbers_and_dropout():
    def body(x):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.rand2(out, -2.0, 3.0)
        return out
    u = run_on("trn3", body, X)
    assert u.min() >= -2.0 and u.max() < 3.0 and abs(u.mean() - 0.5) < 0.1
    np.testing.assert_array_equal(run_on("trn3", body, X), u)   # one program, one stream
    with pytest.raises(KernelError, match="rand2 is available only on NeuronCore-v4"):
        run(body, X)

    got = run(lambda x: nisa.dropout(x, prob=0.3), X)
    dropped = got == 0
    np.testing.assert_array_equal(got[~dropped], X[~dropped])
    assert 0.25 < dropped.mean() < 0.35
    assert (run(lambda x: nisa.dropout(x, prob=1.0), X) == 0).all()
    np.testing.assert_array_equal(run(lambda x: nisa.dropout(x, prob=0.0), X), X)

    def bits(x):
        out = nl.ndarray((128, 64), nl.int32, buffer=nl.sbuf)
        nisa.rng(out)
        return out
    r = run(bits, X, dtype=nl.int32)
    assert len(np.unique(r)) > 8000
    with pytest.raises(KernelError, match="must be an integer type"):
        run(lambda x: nisa.rng(x), X)


def test_constants_registers_and_version():
    assert nisa.reduce_cmd.reset_reduce.value == 3 and nisa.dge_mode.hwdge.value == 2
    assert nisa.oob_mode.skip.value == 1 and nisa.constants.dge_mode is nisa.dge_mode
    assert nisa.engine.vector is nisa.vector_engine
    seen = {}

    @nki.jit(chip="trn2")
    def k(a):
        seen["v"] = nisa.get_nc_version()
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a, dge_mode=nisa.dge_mode.hwdge)
        return out
    np.testing.assert_array_equal(k(X), X)
    assert seen["v"] is nisa.nc_version.gen3
    r = nisa.register_alloc(4)
    nisa.register_move(r, 9)
    assert int(r) == 9


@pytest.mark.parametrize("name", ["quantize_mx", "register_load", "topk", "NkiInstruction"])
def test_refused_by_name(name):
    with pytest.raises(KernelError, match=rf"nki\.isa\.{name} is not supported by trnsim"):
        getattr(nisa, name)()
    with pytest.raises(KernelError, match=rf"nki\.isa\.{name} is not supported"):
        run(lambda x: getattr(nisa, name)(x), X)


def test_reduce_cmd_accumulation_is_refused_with_the_reason():
    def body(x):
        res = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar_reduce(data=x, op0=nl.add, operand0=0.0, reduce_op=nl.add, reduce_res=res,
                                  reduce_cmd=nisa.reduce_cmd.reduce)
        return res
    with pytest.raises(KernelError, match="accumulator registers across instructions"):
        run(body, X, shape=(128, 1))


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("op0,op1", [("multiply", "add"), ("subtract", "maximum"), ("divide", "minimum")])
def test_scan_kernel_matches_a_plain_loop_on_both_backends(backend, op0, op1):
    from trnsim.compute import get_backend
    fns = {"multiply": np.multiply, "add": np.add, "subtract": np.subtract, "maximum": np.maximum,
           "divide": np.divide, "minimum": np.minimum}
    rng = np.random.default_rng(5)
    a, b, init = (rng.standard_normal(s).astype(F32).astype(np.float64) for s in ((8, 40), (8, 40), 8))
    for reverse0 in (False, True):
        for reverse1 in (False, True):
            got = get_backend(backend).scan(a, b, init, op0, op1, reverse0, reverse1)
            prev = init.astype(F32)
            for i in range(40):
                x0 = (prev, a[:, i].astype(F32)) if reverse0 else (a[:, i].astype(F32), prev)
                t = fns[op0](*x0).astype(F32)
                t = (fns[op1](b[:, i].astype(F32), t) if reverse1 else fns[op1](t, b[:, i].astype(F32))).astype(F32)
                np.testing.assert_array_equal(got[:, i], t)
                prev = t


def test_new_instructions_cost_on_their_engines():
    @nki.jit
    def k(x, y):
        out = nl.ndarray((128, 8), nl.float32, buffer=nl.shared_hbm)
        a, b = nl.load(x), nl.load(y)
        s = nisa.tensor_tensor_scan(a, b, 0.0, nl.multiply, nl.add)
        nl.store(out, nisa.max8(src=s))
        return out
    result = nki.benchmark(k, numerics=False)(X, Y)
    busy = result.summary()
    assert result.latency_ns > 0
    assert "vector" in str(busy).lower()


def test_converting_dma_moves_the_destination_bytes_into_hbm():
    from trnsim import Program, dtypes
    from trnsim.hw.dma import plan_dma
    from trnsim.isa import DmaCopy
    p = Program("trn1")
    s = p.sbuf([128, 64], dtypes.float32, "s")
    h = p.hbm([128, 64], dtypes.bfloat16, "h")
    plan = plan_dma(p.chip, DmaCopy(h.view(), s.view()))
    assert plan.hbm_bytes == 128 * 64 * 2
    same = plan_dma(p.chip, DmaCopy(p.hbm([128, 64], dtypes.float32, "f").view(), s.view()))
    assert same.hbm_bytes == 128 * 64 * 4


def test_set_rng_seed_repeats_the_stream():
    def body(seed):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.sbuf)
        nisa.set_rng_seed(seed)
        return nisa.dropout(out, nisa.memset((128, 64), 1.0, nl.float32), 0.5)
    a = run(body, np.full((1, 1), 3, np.float32))
    b = run(body, np.full((1, 1), 3, np.float32))
    c = run(body, np.full((1, 1), 4, np.float32))
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
