"""Semantics AWS's public NKI kernels rely on (nki-samples' allocated_fused_linear):
ordered NeuronCore versions, nc_matmul's transpose mode, an HBM access wholly past the
end under a mask that turns it off, and a whole-access value stored under a mask."""

import numpy as np
import pytest

from trnsim import nki
from trnsim.nki import KernelError
from trnsim.nki import isa as nisa
from trnsim.nki import language as nl


def test_nc_versions_are_ordered():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        if nisa.get_nc_version() >= nisa.nc_version.gen3:
            t = nl.multiply(t, 2.0)
        nl.store(out, t)
        return out

    a = np.ones((4, 8), np.float32)
    assert nisa.nc_version.gen2 < nisa.nc_version.gen3 < nisa.nc_version.gen4
    np.testing.assert_array_equal(nki.simulate(k, chip="trn2")(a), 2 * a)
    np.testing.assert_array_equal(nki.simulate(k, chip="trn1")(a), a)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_nc_matmul_transpose_mode_moves_the_stationary_through_an_identity(dtype):
    @nki.jit
    def k(a, eye):
        out = nl.ndarray((64, 128), dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        i = nl.load(eye)
        res = nl.ndarray((64, 128), dtype=a.dtype, buffer=nl.psum)
        res[...] = nisa.nc_matmul(t, i, is_transpose=True)
        nl.store(out, nl.copy(res))
        return out

    a = np.random.default_rng(0).standard_normal((128, 64)).astype(dtype)
    a[3, 5] = np.inf
    got = nki.simulate_kernel(k, a, np.identity(128, dtype=dtype))
    np.testing.assert_array_equal(got, a.T)   # Inf passes through, as the mode's bit-exact move does


def test_nc_matmul_transpose_mode_needs_a_square_moving_operand():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        res = nl.ndarray((64, 32), dtype=nl.float32, buffer=nl.psum)
        res[...] = nisa.nc_matmul(nl.load(a), nl.load(b), is_transpose=True)
        nl.store(out, nl.copy(res))
        return out

    with pytest.raises(nki.KernelError, match="moving must be square"):
        nki.simulate_kernel(k, np.zeros((128, 64), np.float32), np.zeros((128, 32), np.float32))


def test_an_access_wholly_past_the_end_is_fine_under_a_mask_that_turns_it_off():
    seqlen = 128

    @nki.jit
    def k(a):
        out = nl.ndarray((seqlen, 16), dtype=a.dtype, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:16]
        for g in nl.affine_range(2):
            t = nl.load(a[g * 128 + ix, iy], mask=(g * 128 < seqlen))
            nl.store(out[g * 128 + ix, iy], value=nl.multiply(t, 3.0, mask=(g * 128 < seqlen)), mask=(g * 128 < seqlen))
        return out

    a = np.arange(seqlen * 16, dtype=np.float32).reshape(seqlen, 16)
    np.testing.assert_array_equal(nki.simulate_kernel(k, a), 3 * a)


def test_a_whole_access_value_stored_under_a_mask_keeps_its_leading_part():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 384), dtype=a.dtype, buffer=nl.shared_hbm)
        i = nl.mgrid[0:128, 0:512]
        t = nl.load(a)
        nl.store(out[i.p, i.x], value=t, mask=(i.x < 384))
        return out

    a = np.random.default_rng(1).standard_normal((128, 512)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(k, a), a[:, :384])


def test_load_transpose2d_of_a_batch_slice_indexed_by_arange_grids():
    # nki-samples' SD attention: k[b, t * 64 + nl.arange(64)[:, None], nl.arange(32)[None, :]]
    @nki.jit
    def k(x):
        out = nl.ndarray((2, 32, 128), dtype=x.dtype, buffer=nl.shared_hbm)
        for b in nl.affine_range(2):
            for t in nl.affine_range(2):
                tile = nl.load_transpose2d(x[b, t * 64 + nl.arange(64)[:, None], nl.arange(32)[None, :]])
                nl.store(out[b, nl.arange(32)[:, None], t * 64 + nl.arange(64)[None, :]], value=tile)
        return out

    x = np.random.default_rng(2).standard_normal((2, 128, 32)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(k, x), x.transpose(0, 2, 1))


def test_static_cast_to_bfloat16_gives_a_bfloat16_array_that_kernels_see_as_such():
    import ml_dtypes

    x = nl.static_cast(np.array([[1.0, 1.00390625, 1.01171875, -3.0]]), nl.bfloat16)
    assert x.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(x.astype(np.float32), [[1.0, 1.0, 1.015625, -3.0]])   # ties to even
    # the NeuronCore's e4m3 is IEEE 754 style (past 240: infinity); OCP's e4m3fn saturates at 448
    assert nl.static_cast(np.array([500.0, -1e9]), nl.float8_e4m3).astype(np.float32).tolist() == [np.inf, -np.inf]
    assert nl.static_cast(np.array([500.0, -1e9]), nl.float8_e4m3fn).astype(np.float32).tolist() == [448.0, -448.0]

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        assert a.dtype == nl.bfloat16 and a.itemsize == 2
        nl.store(out, nl.copy(nl.load(a), dtype=nl.float32))
        return out

    np.testing.assert_array_equal(nki.simulate_kernel(k, x), x.astype(np.float32))


def test_a_masked_off_iteration_may_read_a_psum_block_another_block_wrote():
    # allocated_fused_linear: the second iteration's matmuls are masked off, its copy of the
    # PSUM block (bank 7 for both iterations) is not, and its store is masked off again
    from trnsim.nki import compiler as ncc

    n = 1

    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        for g in nl.affine_range(2):
            acc = nl.ndarray((1, nl.par_dim(128), 64), dtype=nl.float32,
                             buffer=ncc.psum.mod_alloc(base_bank=7, num_bank_tiles=(1,)))
            acc[0] += nisa.nc_matmul(nl.load(a), nl.load(b), mask=(g < n))
            t = nl.copy(acc[0])
            nl.store(out, value=t, mask=(g < n))
        return out

    a = np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32)
    b = np.random.default_rng(4).standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(k, a, b), a.T @ b, rtol=1e-5, atol=1e-5)


def test_a_benchmark_computes_values_for_small_programs_and_times_large_ones_only(monkeypatch):
    from trnsim.nki import launch

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        for _ in range(4):
            t = nl.multiply(t, 2.0)
        nl.store(out, t)
        return out

    a = np.ones((8, 8), np.float32)
    small = nki.benchmark(k)(a)
    np.testing.assert_array_equal(small.outputs, 16 * a)
    monkeypatch.setattr(launch, "AUTO_NUMERICS_MAX_INSTRUCTIONS", 3)
    large = nki.benchmark(warmup=1, iters=2)(k)(a)
    assert large.outputs is None and large.latency_ns == small.latency_ns
    np.testing.assert_array_equal(nki.benchmark(k, numerics=True)(a).outputs, 16 * a)


def test_a_column_of_a_tile_keeps_its_free_axis_and_blocks_index_one_at_a_time():
    # nki-samples' flash attention: l_buffer[:, i] is [128, 1] and is indexed [:, 0];
    # dy_o_sum[h] of a tile with two block dimensions is still blocked by the second
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 3), dtype=nl.float32, buffer=nl.shared_hbm)
        cols = nl.full((nl.par_dim(128), 3), fill_value=0.0, dtype=nl.float32, lazy_initialization=False)
        blocks = nl.zeros((2, 3, nl.par_dim(128), 1), dtype=nl.float32, lazy_initialization=True)
        t = nl.load(a)
        for i in nl.affine_range(3):
            col = cols[:, i]
            assert tuple(col.shape) == (128, 1)
            per_head = blocks[1]
            per_head[i] = nl.multiply(t[:, i:i + 1], 2.0)
            cols[:, i] = nl.copy(per_head[i][:, 0])
        nl.store(out, cols)
        return out

    a = np.random.default_rng(5).standard_normal((128, 3)).astype(np.float32)
    np.testing.assert_array_equal(nki.simulate_kernel(k, a), 2 * a)


@pytest.mark.parametrize("sa,sb", [((16, 4, 1), (16, 4, 8)), ((16, 1, 8), (16, 4, 8)), ((1, 4, 8), (16, 4, 1)),
                                   ((16, 4, 8), (16, 4, 8))])
def test_binary_ops_broadcast_axis_by_axis_as_numpy_does(sa, sb):
    # nki-samples' select_and_scatter compares a [P, a, 1] window maximum with its [P, a, b] window
    @nki.jit
    def k(a, b):
        shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape))
        out = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
        eq = nl.ndarray(shape, dtype=nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        nl.store(out, nl.subtract(ta, tb))
        nl.store(eq, nl.where(nl.equal(ta, tb), ta, 0.0))
        return out, eq

    rng = np.random.default_rng(1)
    a = rng.integers(0, 3, sa).astype(np.float32)
    b = rng.integers(0, 3, sb).astype(np.float32)
    out, eq = nki.simulate_kernel(k, a, b)
    np.testing.assert_array_equal(out, a - b)
    np.testing.assert_array_equal(eq, np.where(a == b, np.broadcast_to(a, out.shape), 0.0))


def test_shapes_that_do_not_broadcast_are_refused_by_name():
    @nki.jit
    def k(a, b):
        out = nl.ndarray((16, 4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out

    with pytest.raises(nki.KernelError, match=r"nl.add of \[16, 4, 3\] and \[16, 4, 8\]: the shapes do not broadcast"):
        nki.simulate_kernel(k, np.zeros((16, 4, 3), np.float32), np.zeros((16, 4, 8), np.float32))


def test_loop_reduce_keeps_one_running_result_per_iteration_of_the_loops_it_does_not_name():
    # nki-samples' flash attention backward: dq[i_q] = nl.loop_reduce(x, np.add, [i_k])
    # in a loop over i_q inside the loop over i_k sums over i_k for each i_q on its own
    @nki.jit
    def k(a):
        out = nl.ndarray((3, 128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((3, nl.par_dim(128), 4), dtype=nl.float32)
        for i_k in nl.sequential_range(2):
            for i_q in nl.affine_range(3):
                x = nl.load(a[i_k, i_q])
                acc[i_q] = nl.loop_reduce(x, np.add, [i_k], dtype=nl.float32)
        for i_q in nl.affine_range(3):
            nl.store(out[i_q], acc[i_q])
        return out

    a = np.random.default_rng(7).standard_normal((2, 3, 128, 4)).astype(np.float32)
    np.testing.assert_allclose(nki.simulate_kernel(k, a), a.sum(axis=0), rtol=1e-6)


def test_each_grid_instance_starts_its_loop_reduce_afresh_even_when_it_skips_the_first_iteration():
    # nki-samples' flash attention backward with a sliding window: the tiles a window
    # leaves out are skipped, the first (i_k = 0) among them, so a later grid instance
    # must not go on from the running result the instance before it left
    @nki.jit
    def k(a):
        pid = nl.program_id(0)
        out = nl.ndarray((nl.num_programs(0), 128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((nl.par_dim(128), 4), dtype=nl.float32)
        for i_k in range(3):
            if i_k >= 1:
                x = nl.load(a[pid, i_k])
                acc[...] = nl.loop_reduce(x, np.add, [i_k], dtype=nl.float32)
        nl.store(out[pid], acc)
        return out

    a = np.random.default_rng(8).standard_normal((3, 3, 128, 4)).astype(np.float32)
    for grid in (2, 3):   # 2: one instance per core of trn2's logical NeuronCore; 3: in turn on one core
        np.testing.assert_allclose(nki.simulate_kernel(k[grid], a), a[:grid, 1:].sum(axis=1), rtol=1e-6)


def test_a_single_hbm_element_loads_as_a_one_by_one_tile():
    # nki-samples' flash attention backward loads one sink value: nl.load(sinks[b, h])
    @nki.jit
    def k(x, sinks):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        s = nl.load(sinks[1, 2])
        assert tuple(s.shape) == (1, 1)
        nl.store(out, nl.add(nl.load(x), nl.broadcast_to(s, (128, 4))))
        return out

    x = np.random.default_rng(3).standard_normal((128, 4)).astype(np.float32)
    sinks = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(nki.simulate_kernel(k, x, sinks), x + sinks[1, 2])


def _max_pool_rows(h_in, k, masked):
    """A stride-1 max pool over rows of ``x[h_in, w]`` whose last row tile reads
    ``x[i_h + i_kh, :]`` past the end unless a mask bounds i_h (nki-samples' maxpooling)."""

    @nki.jit
    def pool(x):
        w = x.shape[1]
        h_out = h_in - (k - 1)
        out = nl.ndarray((h_out, w), dtype=x.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range((h_in + 127) // 128):
            i_h, i_kh, i_w = nl.mgrid[0:128, 0:k, 0:w]
            i_h = t * 128 + i_h
            rows = nl.load(x[i_h + i_kh, i_w], mask=(i_h < h_out) if masked else None)
            i_p, i_r, i_f = nl.mgrid[0:128, 0:k, 0:w]
            best = nl.max(rows[i_p, i_r, i_f], axis=[1], mask=(t * 128 + i_p < h_out))
            i_o, i_c = nl.mgrid[0:128, 0:w]
            nl.store(out[t * 128 + i_o, i_c], value=best, mask=(t * 128 + i_o < h_out))
        return out

    return pool


def test_an_index_of_several_terms_may_run_past_the_end_under_a_mask_that_keeps_it_inside():
    x = np.random.default_rng(0).standard_normal((200, 24)).astype(np.float32)
    k = 3
    expected = np.max(np.stack([x[j:200 - (k - 1) + j] for j in range(k)]), axis=0)
    np.testing.assert_array_equal(nki.simulate(_max_pool_rows(200, k, masked=True))(x), expected)
    with pytest.raises(nki.KernelError, match=r"runs 58 elements past its end on axis 0; pass mask="):
        nki.simulate(_max_pool_rows(200, k, masked=False))(x)


def test_a_kernel_returns_its_output_reshaped():
    """nki-samples' interpolation kernels work on [n * c, h, w] and return
    ``dst.reshape((n, c, h, w))``: the caller gets the reshaped array."""

    @nki.jit
    def double(x):
        n, c, h, w = x.shape
        flat = x.reshape((n * c, h, w))
        out = nl.ndarray((n * c, h, w), dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(flat), 2.0))
        return out.reshape((n, c, h, w))

    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    got = nki.simulate(double)(x)
    assert got.shape == (2, 3, 4, 5)
    np.testing.assert_array_equal(got, 2 * x)
    import torch

    for device in ("cpu", "neuron"):
        t = torch.from_numpy(x).to(device)
        got = double(t)
        assert got.device.type == device and tuple(got.shape) == (2, 3, 4, 5)
        np.testing.assert_array_equal(got.cpu().numpy(), 2 * x)


def test_loop_reduce_accumulates_in_the_tile_its_result_is_assigned_to():
    """``acc[i] = nl.loop_reduce(x, np.add, [k])`` over 64 accumulators of 2 KiB per
    partition each (128 KiB): the running sums live in ``acc`` itself, as the Neuron
    compiler reads the pattern, so they need no second 128 KiB (nki-samples' flash
    attention backward at 8192 tokens)."""

    @nki.jit
    def sums(x):
        n_k, n_q = x.shape[0], x.shape[1]
        out = nl.ndarray((n_q, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((n_q, nl.par_dim(128), 512), dtype=nl.float32)
        for k in nl.affine_range(n_k):
            for q in nl.affine_range(n_q):
                acc[q] = nl.loop_reduce(nl.load(x[k, q]), np.add, loop_indices=[k])
        for q in nl.affine_range(n_q):
            nl.store(out[q], acc[q])
        return out

    x = np.random.default_rng(1).standard_normal((3, 64, 128, 512)).astype(np.float32)
    got = nki.simulate(sums, chip="trn2")(x)
    np.testing.assert_allclose(got, x.sum(axis=0), rtol=1e-6, atol=1e-5)
    program = nki.trace_program(sums, x, chip="trn2")
    assert program.sbuf_alloc.peak_bytes < 192 * 1024 * 128


def test_a_masked_op_reads_its_per_partition_operands_on_the_partitions_it_keeps():
    """AWS's softmax tutorial on a [2, 5] input: a 128-row tile masked to 2 rows minus its
    row maxima ([128, 1], also masked); nisa.activation's bias and nisa.tensor_scalar's
    operand under the same mask."""

    @nki.jit
    def softmaxish(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ix = nl.arange(128)[:, None]
        iy = nl.arange(a.shape[1])[None, :]
        rows = a.shape[0]
        t = nl.load(a[ix, iy], mask=(ix < rows))
        m = nl.max(t, axis=[1], keepdims=True, mask=(ix < rows))
        shifted = nl.subtract(t, m, mask=(ix < rows))
        e = nisa.activation(op=nl.exp, data=t, bias=m, scale=-1.0, mask=(ix < rows))
        s = nisa.tensor_scalar(e, np.multiply, m, mask=(ix < rows))
        nl.store(out[ix, iy], value=shifted, mask=(ix < rows))
        nl.store(out2[ix, iy], value=s, mask=(ix < rows))
        return out, out2

    a = np.array([[1.0, 2.0, 3.0, 4.0, 5.0], [5.0, 4.0, 3.0, 2.0, 1.0]], np.float32)
    shifted, scaled = nki.simulate(softmaxish)(a)
    m = a.max(axis=1, keepdims=True)
    np.testing.assert_array_equal(shifted, a - m)
    np.testing.assert_allclose(scaled, np.exp(-a + m) * m, rtol=1e-5)


def _psum_reuse(conflict):
    """Two tiles placed at PSUM address (0, 0): a [128, 512] matmul result, read, then a
    [64, 128] transpose into the first 64 partitions, read (nki-library's attention_cte).
    With ``conflict`` the matmul writes again between the transpose and its read."""

    @nki.jit
    def k(q, a, b):
        out = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        out2 = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        mm = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, 0))
        ta, tb = nl.load(a), nl.load(b)
        nisa.nc_matmul(mm[...], ta, tb)
        r = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(r, mm)
        nl.store(out2, r)
        buf = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.psum, address=(0, 0))
        nisa.nc_transpose(buf[:64, :128], nl.load(q)[:128, :64])
        if conflict:
            nisa.nc_matmul(mm[...], ta, tb)
        o = nl.ndarray((64, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(o, buf)
        nl.store(out, o)
        return out, out2

    return k


def test_a_psum_tile_written_over_part_of_another_reads_its_own_data():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((128, 64)).astype(np.float32)
    a = rng.standard_normal((128, 128)).astype(np.float32)
    b = rng.standard_normal((128, 512)).astype(np.float32)
    t, prod = nki.simulate(_psum_reuse(False), chip="trn2")(q, a, b)
    np.testing.assert_array_equal(t, q.T)
    np.testing.assert_allclose(prod, a.T @ b, rtol=1e-4, atol=1e-3)
    with pytest.raises(nki.KernelError, match=r"reads PSUM tile buf\[64, 128\], but mm shares its space"):
        nki.simulate(_psum_reuse(True), chip="trn2")(q, a, b)


def test_per_partition_operands_with_more_partitions_are_read_on_the_instructions_rows():
    """nki-library's attention_cte hands a [128, 1] zero bias to a range_select over 81
    rows: the engine reads the bound of each row it works on, from the operand's first."""

    @nki.jit
    def k(x, lo, hi):
        out = nl.ndarray((81, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        out2 = nl.ndarray((81, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        b0, b1 = nl.load(lo), nl.load(hi)
        sel = nisa.range_select(on_true_tile=t[:81, :], comp_op0=nl.greater_equal, comp_op1=nl.less,
                                bound0=b0, bound1=b1[:81, :], reduce_op=nl.maximum,
                                reduce_res=nl.ndarray((81, 1), dtype=nl.float32, buffer=nl.sbuf), range_start=0)
        shifted = nisa.activation(op=nl.copy, data=t[:81, :], bias=b1)
        nl.store(out, sel)
        nl.store(out2, shifted)
        return out, out2

    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 64)).astype(np.float32)
    lo = np.zeros((128, 1), np.float32)
    hi = rng.integers(1, 64, (128, 1)).astype(np.float32)
    sel, shifted = nki.simulate(k, chip="trn2")(x, lo, hi)
    cols = np.arange(64)[None, :]
    fp32_min = np.finfo(np.float32).min
    np.testing.assert_array_equal(sel, np.where(cols < hi[:81], x[:81], fp32_min))
    np.testing.assert_allclose(shifted, x[:81] + hi[:81], rtol=1e-6)


def test_the_accumulator_registers_share_no_space_with_a_tile_placed_at_an_address():
    """A kernel that places its tiles at addresses of its own (nki-library's modular
    allocator, from byte 0) and chains accumulating instructions, whose registers are
    not SBUF on the chip."""

    @nki.jit
    def k(x):
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
        nisa.dma_copy(dst=t, src=x)
        res = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf, address=(0, 256))
        e = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf, address=(0, 260))
        nisa.tensor_scalar_reduce(dst=e, data=t, op0=nl.multiply, operand0=2.0, reduce_op=nl.add, reduce_res=res,
                                  reduce_cmd=nisa.reduce_cmd.reset_reduce)
        # a tile placed while the registers hold that sum, over the bytes that follow the others
        later = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf, address=(0, 516))
        nisa.tensor_copy(dst=later[:, 0:64], src=e)
        res2 = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf, address=(0, 4612))
        nisa.tensor_scalar_reduce(dst=e, data=later[:, 0:64], op0=nl.multiply, operand0=1.0, reduce_op=nl.add,
                                  reduce_res=res2, reduce_cmd=nisa.reduce_cmd.reduce)
        nisa.dma_copy(dst=out, src=res2)
        return out

    x = np.random.default_rng(4).standard_normal((128, 64)).astype(np.float32)
    program = nki.trace_program(k, x, chip="trn2")
    (regs,) = [t for t in program.tensors if t.name.startswith("vector_accumulator")]
    assert regs.byte_offset >= program.chip.sbuf.partition_bytes   # past every byte a kernel places tiles in
    # the second sum continues the first: 2 x summed, then the 2 x it copied
    np.testing.assert_allclose(nki.simulate(k, chip="trn2")(x)[:, 0], 4 * x.astype(np.float64).sum(axis=1),
                               rtol=1e-5, atol=1e-4)


def test_nl_abs_is_a_unary_alu_operator_with_an_operand_of_zero():
    """nki-library's rmsnorm_quant: tensor_scalar_reduce(op0=nl.abs, operand0=0.0,
    reduce_op=nl.maximum) is each row's largest magnitude (NKI's tensor_scalar docs:
    the operand of a unary operator must be None or 0)."""

    def kernel(operand0):
        @nki.jit
        def k(x):
            out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
            mags = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
            t = nl.load(x)
            a = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
            r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar_reduce(dst=a, data=t, op0=nl.abs, operand0=operand0, reduce_op=nl.maximum, reduce_res=r)
            nl.store(out, r)
            nl.store(mags, nisa.tensor_scalar(t, nl.abs, None, op1=np.multiply, operand1=2.0))
            return out, mags
        return k

    x = np.random.default_rng(5).standard_normal((128, 64)).astype(np.float32)
    peak, mags = nki.simulate(kernel(0.0))(x)
    np.testing.assert_array_equal(peak[:, 0], np.abs(x).max(axis=1))
    np.testing.assert_array_equal(mags, 2 * np.abs(x))
    with pytest.raises(nki.KernelError, match="nl.abs is a unary operator, so its operand must be None or 0"):
        nki.simulate(kernel(1.5))(x)


def test_gelu_apprx_sigmoid_is_a_scalar_engine_activation_function():
    """nki-library's MLP kernels pass nl.gelu_apprx_sigmoid as nisa.activation's op."""

    @nki.jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out, nisa.activation(op=nl.gelu_apprx_sigmoid, data=t, scale=2.0))
        return out

    x = np.random.default_rng(6).standard_normal((128, 64)).astype(np.float32)
    z = 2.0 * x.astype(np.float64)
    np.testing.assert_allclose(nki.simulate(k)(x), z / (1 + np.exp(-1.702 * z)), rtol=1e-5, atol=1e-6)
    acts = [i for i in nki.trace_program(k, x).instructions if i.opcode == "activation"]
    assert [a.func.value for a in acts] == ["gelu_apprx_sigmoid"]


def test_a_dtype_survives_asdict_and_pickle_as_itself():
    """nki-library's tests call the kernel with ``**asdict(test_cfg)``, whose ``dtype`` is
    ``nl.bfloat16``: it must stay the dtype (NKI's are ml_dtypes types, not dataclasses)."""
    import copy
    import dataclasses
    import pickle

    @dataclasses.dataclass
    class Config:
        rows: int
        dtype: object

    assert dataclasses.asdict(Config(4, nl.bfloat16)) == {"rows": 4, "dtype": nl.bfloat16}
    for dt in (nl.bfloat16, nl.float32, nl.float8_e4m3fn_x4):
        assert pickle.loads(pickle.dumps(dt)) is dt and copy.deepcopy(dt) is dt
    with pytest.raises(AttributeError, match="cannot change its itemsize"):
        nl.bfloat16.itemsize = 4


def test_a_tensor_read_as_another_dtype_shares_its_bytes():
    # NKI's t.view(dtype) (AWS's nc_matmul test loads uint8 input bytes as float8_e5m2) and
    # t.ap(..., dtype=) (the mxfp matmul tutorial); the last dimension scales with the size
    @nki.jit
    def k(a_bytes, x):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        as_f8 = nl.load(a_bytes.view(nl.float8_e5m2))       # same size, HBM
        nl.store(out[:, 0:16], nl.copy(as_f8, dtype=nl.float32))
        t = nl.load(x)                                       # [128, 16] float32
        words = t.view(nl.int32)                             # same size, SBUF
        half = t.ap([[32, 128], [1, 32]], dtype=nl.bfloat16)  # 4 bytes -> two bf16 each
        nl.store(out[:, 16:32], nl.copy(words, dtype=nl.float32))
        nl.store(out[:, 32:64], nl.copy(half, dtype=nl.float32))
        return out

    rng = np.random.default_rng(9)
    a_bytes = rng.integers(0, 120, size=(128, 16)).astype(np.uint8)   # finite float8_e5m2 patterns
    x = rng.standard_normal((128, 16)).astype(np.float32)
    out = nki.simulate_kernel(k, a_bytes, x)
    np.testing.assert_array_equal(out[:, 0:16], a_bytes.view(nl.float8_e5m2).astype(np.float32))
    np.testing.assert_array_equal(out[:, 16:32], x.view(np.int32).astype(np.float32))
    np.testing.assert_array_equal(out[:, 32:64], x.view(nl.bfloat16).astype(np.float32))


def test_reading_as_another_dtype_says_what_it_needs():
    @nki.jit
    def part(x):
        nl.load(x[0:64, :].view(nl.int32))
        return x

    x = np.zeros((128, 6), np.float16)
    with pytest.raises(Exception, match=r"reinterpret the whole tensor x\[128, 6\], then index"):
        nki.simulate_kernel(part, x)

    @nki.jit
    def odd(x):
        nl.load(x.view(nl.float32))
        return x

    x = np.zeros((128, 3), np.float16)
    with pytest.raises(Exception, match="the last dimension's 6 bytes do not divide into 4-byte elements"):
        nki.simulate_kernel(odd, x)


def test_the_two_e4m3_formats_round_as_the_chip_and_ocp_do():
    """nl.float8_e4m3 is the NeuronCore's IEEE 754 style e4m3 (largest 240, overflow to
    infinity), nl.float8_e4m3fn OCP's finite-only one (largest 448, saturating); AWS's
    range_select API test stores fp32.min into an e4m3 tile and expects -inf back."""

    @nki.jit
    def k(a):
        fp8 = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        fn = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        nl.store(fp8, value=nl.copy(nl.copy(t, dtype=nl.float8_e4m3), dtype=nl.float32))
        nl.store(fn, value=nl.copy(nl.copy(t, dtype=nl.float8_e4m3fn), dtype=nl.float32))
        return fp8, fn

    a = np.tile(np.array([[250.0, 300.0, -1000.0, 200.0, 240.0, -3.4e38]], np.float32), (128, 1))
    fp8, fn = k(a)
    assert fp8[0].tolist() == [np.inf, np.inf, -np.inf, 192.0, 240.0, -np.inf]
    assert fn[0].tolist() == [256.0, 288.0, -448.0, 192.0, 240.0, -448.0]


@nki.jit
def six_free_axes(x):
    """A tile of six free axes, read through an index that reverses their order: no
    access pattern walks it in four free dimensions, and no two adjacent axes merge."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.load(x)
    i_p, a, b, c, d, e, f = nl.mgrid[0:128, 0:2, 0:2, 0:2, 0:2, 0:2, 0:2]
    y = nl.add(t[i_p, a, b, c, d, e, f], t[i_p, f, e, d, c, b, a])
    nl.store(out, value=y)
    return out


def test_accesses_of_more_than_four_free_axes_are_split_as_the_compiler_splits_them():
    """contributed/interpolate_trilinear_fwd.py computes on 7-D tiles: an elementwise
    instruction whose operands walk more than 4 free dimensions runs as several, over
    the leading axes no operand can merge; contiguous axes merge (the whole-tile load
    and store are one DMA each)."""
    x = np.random.default_rng(3).standard_normal((128, 2, 2, 2, 2, 2, 2)).astype(np.float32)
    np.testing.assert_array_equal(six_free_axes(x), x + x.transpose(0, 6, 5, 4, 3, 2, 1))
    program = nki.trace_program(six_free_axes, x, chip="trn2")
    ops = [i for i in program.instructions if i.opcode == "tensor_tensor"]
    # six free axes, none mergeable: split over the first two, four pieces of four axes
    assert len(ops) == 4 and all(len(v.dims) == 5 for i in ops for v in i.reads() + i.writes())
    assert sum(i.opcode == "dma_copy" for i in program.instructions) == 2


def test_a_reduction_over_more_than_four_free_axes_is_refused_by_name():
    @nki.jit
    def k(x):
        out = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        i_p, a, b, c, d, e, f = nl.mgrid[0:128, 0:2, 0:2, 0:2, 0:2, 0:2, 0:2]
        nl.store(out, value=nl.sum(t[i_p, f, e, d, c, b, a], axis=[1, 2, 3, 4, 5, 6]))
        return out

    with pytest.raises(KernelError, match="more than 4 free dimensions"):
        k(np.zeros((128, 2, 2, 2, 2, 2, 2), np.float32))


def test_an_engine_result_assigned_to_a_tile_of_another_float_dtype_is_written_there_by_one_instruction():
    """``bf16_tile[...] = nisa.activation(np.exp, fp32_tile)``: the engine rounds into
    its destination's dtype as it writes, so there is no fp32 temporary and no copy (as
    nki-samples' attention kernels assign); the values are the copy's."""
    from trnsim.isa import Activation, TensorCopy

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        y[...] = nisa.activation(np.exp, x)
        nl.store(out, y)
        return out

    a = np.random.default_rng(2).standard_normal((128, 64)).astype(np.float32)
    program = nki.trace_program(k, a, chip="trn2")
    kinds = [type(i) for i in program.instructions]
    assert kinds.count(Activation) == 1 and TensorCopy not in kinds
    import ml_dtypes

    got = nki.simulate(k, chip="trn2")(a)
    want = np.exp(a.astype(np.float64)).astype(np.float32).astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2 ** -8)


def test_an_activation_that_also_reduces_keeps_its_own_dtype_and_a_copy():
    """With a reduction, the engine sums what it wrote: writing bf16 directly would sum
    the bf16-rounded values, so the fp32 result and a converting copy stay."""
    from trnsim.isa import Activation, TensorCopy

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.shared_hbm)
        s = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.ndarray(a.shape, dtype=nl.bfloat16, buffer=nl.sbuf)
        r = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        y[...] = nisa.activation_reduce(np.exp, x, reduce_op=np.add, reduce_res=r)
        nl.store(out, y)
        nl.store(s, r)
        return out, s

    a = np.random.default_rng(3).standard_normal((128, 64)).astype(np.float32)
    kinds = [type(i) for i in nki.trace_program(k, a, chip="trn2").instructions]
    assert kinds.count(Activation) == 1 and kinds.count(TensorCopy) == 1
    _, sums = nki.simulate(k, chip="trn2")(a)
    np.testing.assert_allclose(sums[:, 0], np.exp(a.astype(np.float64)).sum(axis=1), rtol=1e-5)


def _scalar_reduce_kernel(res_dtype, then=None):
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        red = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        y = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.sbuf)
        m = nl.ndarray((128, 1), dtype=res_dtype, buffer=nl.sbuf)
        y[...] = nisa.tensor_scalar_reduce(data=x, op0=np.multiply, operand0=2.0, reduce_op=np.max, reduce_res=m)
        if then is not None:
            then(x, m)
        nl.store(out, y)
        nl.store(red, nl.copy(m, dtype=nl.float32))
        return out, red
    return k


def test_tensor_scalar_reduce_is_one_instruction_writing_its_result_and_the_assigned_tile():
    """nki-samples' allocated attention: ``buf[...] = nisa.tensor_scalar_reduce(...,
    reduce_res=m)`` is one vector instruction on the chip, which writes ``buf`` and the
    [P, 1] reduction in one pass."""
    from trnsim.isa import DmaCopy, TensorCopy, TensorReduce, TensorScalar

    k = _scalar_reduce_kernel(nl.float32)
    a = np.random.default_rng(4).standard_normal((128, 64)).astype(np.float32)
    program = nki.trace_program(k, a, chip="trn2")
    kinds = [type(i) for i in program.instructions]
    assert kinds.count(TensorScalar) == 1 and TensorReduce not in kinds
    assert kinds.count(TensorCopy) == 1            # the kernel's own nl.copy of m
    fused = next(i for i in program.instructions if isinstance(i, TensorScalar))
    stores = [i for i in program.instructions if isinstance(i, DmaCopy) and not i.dst.tensor.on_chip]
    assert fused.reduce_dst is not None and stores[0].src.tensor is fused.dst.tensor   # it wrote y itself
    y, m = nki.simulate(k, chip="trn2")(a)
    np.testing.assert_array_equal(y, 2 * a)
    np.testing.assert_array_equal(m[:, 0], (2 * a).max(axis=1))


def test_a_later_reduce_continues_from_the_fused_result():
    def more(x, m):
        nisa.tensor_scalar_reduce(data=x, op0=np.add, operand0=100.0, reduce_op=np.max, reduce_res=m,
                                  reduce_cmd=nisa.reduce_cmd.reduce)

    a = np.random.default_rng(5).standard_normal((128, 64)).astype(np.float32)
    _, m = nki.simulate(_scalar_reduce_kernel(nl.float32, more), chip="trn2")(a)
    np.testing.assert_array_equal(m[:, 0], np.maximum((2 * a).max(axis=1), (a + 100).max(axis=1)))


def test_a_reduce_after_the_fused_result_was_overwritten_is_refused_by_name():
    def clobber(x, m):
        nisa.memset(m, 0.0)
        nisa.tensor_scalar_reduce(data=x, op0=np.add, operand0=1.0, reduce_op=np.max, reduce_res=m,
                                  reduce_cmd=nisa.reduce_cmd.reduce)

    a = np.zeros((128, 64), np.float32)
    with pytest.raises(KernelError, match="something wrote reduce_res since"):
        nki.trace_program(_scalar_reduce_kernel(nl.float32, clobber), a, chip="trn2")


def test_a_bfloat16_reduce_res_keeps_the_fp32_registers_path():
    """Into a bf16 ``reduce_res`` the registers (fp32) hold the unrounded value, which a
    later ``reduce`` continues from: the registers' own path, with its copy out."""
    from trnsim.isa import TensorReduce

    a = np.random.default_rng(6).standard_normal((128, 64)).astype(np.float32)
    k = _scalar_reduce_kernel(nl.bfloat16)
    assert any(isinstance(i, TensorReduce) for i in nki.trace_program(k, a, chip="trn2").instructions)
    _, m = nki.simulate(k, chip="trn2")(a)
    np.testing.assert_allclose(m[:, 0], (2 * a).max(axis=1), rtol=2 ** -8)


def test_an_engine_result_assigned_into_a_directly_allocated_block_is_written_there():
    """``buf[0, ip, cols] = nisa.tensor_scalar_reduce(...)`` into a ``mod_alloc`` tile:
    the instruction writes the block itself, as into any tile (no copy)."""
    from trnsim.isa import TensorCopy
    from trnsim.nki import compiler as ncc

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 512), dtype=nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=8192, num_free_tiles=(1,)))
        x[...] = nl.load(a)
        y = nl.ndarray((2, nl.par_dim(128), 512), dtype=nl.float32,
                       buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(1,)))
        m = nl.ndarray((2, nl.par_dim(128), 4), dtype=nl.float32,
                       buffer=ncc.sbuf.mod_alloc(base_addr=4096, num_free_tiles=(2,)))
        ip, jf = nl.arange(128)[:, None], nl.arange(128)[None, :]
        for i in nl.affine_range(4):
            y[0, ip, i * 128 + jf] = nisa.tensor_scalar_reduce(data=x[ip, i * 128 + jf], op0=np.multiply, operand0=3.0,
                                                               reduce_op=np.max, reduce_res=m[0, ip, i])
        nl.store(out, y[0])
        return out

    a = np.random.default_rng(7).standard_normal((128, 512)).astype(np.float32)
    assert not any(isinstance(i, TensorCopy) for i in nki.trace_program(k, a, chip="trn2").instructions)
    np.testing.assert_array_equal(nki.simulate(k, chip="trn2")(a), 3 * a)
