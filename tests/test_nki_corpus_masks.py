"""NKI's mask semantics as AWS's public kernels use them, against numpy references:
masks on the iteration space of tiles sliced with ``:``, HBM slices past the end under
a mask, masks that are Python bools (conditions on loop counters), and ``and``."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.errors import UnwrittenOutputWarning
from trnsim.isa import TensorReduce
from trnsim.nki import KernelError

RNG = np.random.default_rng(7)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# -- a mask on nl.arange indices no operand was indexed with ---------------------

def test_mask_bounds_the_grid_axis_of_sliced_tiles():
    """The rows past the end of a [72, 6, 5] tensor, read in tiles of 64 with slices:
    the partition mask sits on grid axis 0, the free masks on axes 1 and 2."""
    @nki.jit
    def k(a):
        n, h, w = a.shape
        out = nl.ndarray((n, 1), nl.float32, buffer=nl.shared_hbm)
        for t in nl.affine_range(2):
            start = t * 64
            i_p = nl.arange(64)[:, None, None] + start
            i_h = nl.arange(4)[None, :, None] + 1
            i_w = nl.arange(4)[None, None, :] + 2
            buf = nl.ndarray((64, 4, 4), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=buf[:, 0:4, 0:4], src=a[start:start + 64, 1:5, 2:6],
                          mask=(i_p < n) & (i_h < h) & (i_w < w))
            s = nl.sum(buf[:, 0:4, 0:4], axis=[-2, -1], mask=(i_h < h) & (i_w < w))
            nl.store(out[start:start + 64, :], s, mask=(i_p < n))
        return out

    a = rand(72, 6, 5)
    np.testing.assert_allclose(k(a)[:, 0], a[:, 1:5, 2:5].sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_grid_mask_on_a_reduced_axis_leaves_the_output_whole():
    def k(a):
        out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
        i_f = nl.arange(16)[None, :]
        t = nl.load(a)
        nl.store(out, nl.sum(t[:, :], axis=1, mask=(i_f < 10)))
        return out

    a = rand(128, 16)
    program = nki.trace_program(k, a)
    (red,) = [i for i in program.instructions if isinstance(i, TensorReduce)]
    assert (red.src.partitions, red.src.free_size, red.dst.partitions) == (128, 10, 128)
    np.testing.assert_allclose(nki.jit(k)(a)[:, 0], a[:, :10].sum(axis=1), rtol=1e-5, atol=1e-5)


def test_hbm_slice_past_the_end_needs_a_mask():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out[64:128, :], nl.load(a[64:128, :]))
        return out

    with pytest.raises(KernelError, match="runs 36 elements past its end on axis 0"):
        k(rand(92, 8))


# -- masks that are Python bools -------------------------------------------------

def test_bool_masks_keep_or_skip_whole_instructions():
    """True masks nothing; False skips the instruction, and assigning or adding what a
    skipped call returned leaves the destination as it was."""
    @nki.jit
    def k(a, b):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray(a.shape, nl.float32, buffer=nl.sbuf)
        acc[...] = nl.load(a)
        bt = nl.load(b)
        for i in nl.affine_range(4):
            acc[...] = nl.add(acc, 1.0, mask=(i < 2))                          # twice
            acc[...] = nisa.tensor_scalar(acc, np.multiply, 2.0, mask=(i == 3))  # once
            acc[...] = nl.load(b, mask=(i > 7))                                # never
        ps = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        for j in nl.affine_range(3):
            ps[...] += nisa.nc_matmul(bt[:, 0:8], bt[:, 0:8], mask=(j > 0) & True)
        res = nl.add(acc, 0.0)
        i_p = nl.arange(16)[:, None]
        for j in nl.affine_range(2):
            nl.store(out, res, mask=(j == 0) & (i_p < 10))
            nl.store(out[10:16, :], res[10:16, :], mask=False & (i_p < 16))
        extra = nl.ndarray((8, 8), nl.float32, buffer=nl.shared_hbm)
        nl.store(extra, nl.copy(ps), mask=True)
        return out, extra

    a, b = rand(16, 8), rand(16, 8)
    with pytest.warns(UnwrittenOutputWarning, match="rows 10:16"):
        out, extra = k(a, b)
    np.testing.assert_allclose(out[:10], ((a + 2) * 2)[:10], rtol=1e-6)
    assert np.isnan(out[10:]).all()  # never stored
    np.testing.assert_allclose(extra, 2 * b[:, :8].T @ b[:, :8], rtol=1e-4, atol=1e-4)


def test_reading_a_masked_off_destination_is_allowed():
    """A tile only a masked-off call would have written reads as its old contents (as
    nki-samples' rmsnorm_qkv copies a PSUM tile whose matmuls were all masked off)."""
    @nki.jit
    def k(a):
        out = nl.ndarray((8, 8), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        ps = nl.ndarray((8, 8), nl.float32, buffer=nl.psum)
        ps[...] += nisa.nc_matmul(t[:, 0:8], t[:, 0:8], mask=False)
        staged = nl.copy(ps)
        nl.store(out, staged, mask=False)
        nl.store(out, 3.0)
        return out

    np.testing.assert_array_equal(k(rand(16, 8)), np.full((8, 8), 3.0, np.float32))


# -- ``and`` between conditions ----------------------------------------------------

def test_and_of_conditions_is_both_conditions():
    @nki.jit
    def k(a):
        n, m = a.shape
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((n, 8), nl.uint32, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:n, 0:m]
        t = nl.load(a)
        idx_t = nisa.memset(shape=(n, 8), value=0, dtype=nl.uint32)
        top = nisa.max8(src=t[ix, iy], mask=(ix < n // 2 and iy < m // 2))
        r = nisa.nc_match_replace8(dst_idx=idx_t[:, :], data=t[ix, iy], vals=top, imm=-1.0,
                                   mask=(ix < n // 2 and iy < m // 2))
        nl.store(out, t)
        nl.store(out[ix, iy], r[ix, iy], mask=(ix < n // 2 and iy < m // 2))
        nl.store(idx, idx_t)
        return out, idx

    a = rand(16, 32)
    out, idx = k(a)
    part = a[:8, :16]
    order = np.argsort(-part, axis=1, kind="stable")[:, :8]
    want = a.copy()
    np.put_along_axis(want[:8, :16], order, -1.0, axis=1)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(np.sort(idx[:8], axis=1), np.sort(order, axis=1))
    assert (idx[8:] == 0).all()


def test_chained_comparison_is_both_conditions():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(64)[:, None]
        nl.store(out, 0.0)
        nl.store(out[i_p, 0:4], nl.load(a[i_p, 0:4]), mask=(32 <= i_p < 40))
        return out

    a = rand(64, 4)
    want = np.zeros_like(a)
    want[32:40] = a[32:40]
    np.testing.assert_array_equal(k(a), want)


def test_control_flow_on_a_mask_is_refused():
    @nki.jit
    def k(a):
        ix = nl.arange(8)[:, None]
        if ix < 4:
            return a
        return a

    with pytest.raises(KernelError, match="err_control_flow_condition_depending_on_arange"):
        k(rand(8, 8))
