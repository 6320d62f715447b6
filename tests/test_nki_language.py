"""nki.language, nki.typing, nki.compiler, the dtypes and indexing: values against numpy references."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.collectives as ncc_coll
import trnsim.nki.compiler as ncc
import trnsim.nki.language as nl
import trnsim.nki.typing as nt
from trnsim.isa import TensorReduce
from trnsim.nki import KernelError, apitable

RNG = np.random.default_rng(11)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# -- dtypes -------------------------------------------------------------------

def test_numpy_accepts_nl_dtypes():
    assert np.ones(3, dtype=nl.float8_e5m2).tolist() == [1.0, 1.0, 1.0]
    # the narrow floats are ml_dtypes' as in NKI, so an ml_dtypes array's dtype equals them
    import ml_dtypes

    assert np.zeros(2, dtype=nl.bfloat16).dtype == ml_dtypes.bfloat16
    assert np.zeros(2, dtype=ml_dtypes.bfloat16).dtype == nl.bfloat16
    assert np.zeros(2, dtype=ml_dtypes.float8_e5m2).dtype == nl.float8_e5m2 != np.float32
    assert np.zeros(2, dtype=nl.bool_).dtype == np.bool_
    assert np.zeros(2, dtype=nl.int16).dtype == np.int16
    assert np.zeros(2, dtype=nl.float8_e4m3fn_x4).dtype == np.uint32
    # two formats: the NeuronCore's IEEE 754 style e4m3 and OCP's finite-only e4m3fn
    assert nl.float8_e4m3fn is not nl.float8_e4m3
    assert np.zeros(2, dtype=nl.float8_e4m3).dtype == ml_dtypes.float8_e4m3
    assert np.zeros(2, dtype=nl.float8_e4m3fn).dtype == ml_dtypes.float8_e4m3fn


def test_bfloat16_input_made_with_numpy_rounds_on_load():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, nl.bfloat16, buffer=nl.shared_hbm)
        nl.store(out, nl.load(a, dtype=nl.bfloat16))
        return out

    x = np.full((4, 8), 1.0 + 2.0 ** -10, dtype=nl.float32)
    assert np.all(k(x).astype(np.float32) == 1.0)


def test_boolean_input():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.copy(nl.load(a), dtype=nl.float32))
        return out

    m = RNG.random((8, 16)) > 0.5
    np.testing.assert_array_equal(k(m), m.astype(np.float32))


# -- indexing -------------------------------------------------------------------

def test_transpose_written_as_swapped_arange_indices():
    @nki.jit
    def k(a):
        out = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
        ix = nl.arange(a.shape[0])[:, None]
        iy = nl.arange(a.shape[1])[None, :]
        nl.store(out[iy, ix], nl.load(a[ix, iy]))
        return out

    a = rand(64, 48)
    np.testing.assert_array_equal(k(a), a.T)


def test_several_arange_terms_in_one_index():
    @nki.jit
    def k(a):
        out = nl.ndarray((a.shape[0], 4, 8), a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(a.shape[0])[:, None, None]
        i_a = nl.arange(4)[None, :, None]
        i_b = nl.arange(8)[None, None, :]
        t = nl.load(a[i_p, 8 * i_a + i_b + 16])
        nl.store(out, t)
        return out

    a = rand(32, 48)
    np.testing.assert_array_equal(k(a), a[:, 16:48].reshape(32, 4, 8))


def test_mgrid_ellipsis_and_ds():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.mgrid[0:a.shape[0], 0:64]
        nl.store(out[i_p, i_f], nl.load(a[i_p, i_f]))
        nl.store(out[:, nl.ds(64, 64)], nl.load(a[..., 64:128]))
        return out

    a = rand(16, 128)
    np.testing.assert_array_equal(k(a), a)


def test_mgrid_fields_name_the_partition_and_free_axes():
    """``grid = nl.mgrid[...]`` read by name, as AWS's tutorials do (``grid.p``, ``grid.x``),
    indexes as the unpacked form does; a 3-axis grid has ``.y``; a field past its axes is
    refused by name."""
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        grid = nl.mgrid[0:a.shape[0], 0:a.shape[1]]
        nl.store(out[grid.p, grid.x], nl.load(a[grid.p, grid.x]) * 2.0)
        return out

    a = rand(16, 32)
    np.testing.assert_array_equal(k(a), a * 2.0)

    @nki.jit
    def k3(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        g = nl.mgrid[0:a.shape[0], 0:a.shape[1], 0:a.shape[2]]
        i_p, i_x, i_y = g
        assert (g.p, g.x, g.y) == (i_p, i_x, i_y)
        nl.store(out[g.p, g.x, g.y], nl.load(a[g.p, g.x, g.y]))
        return out

    b = rand(8, 4, 6)
    np.testing.assert_array_equal(k3(b), b)
    with pytest.raises(AttributeError, match=r"this nl.mgrid has 2 axes, so no .y: its axes are .p, .x"):
        _ = nl.mgrid[0:4, 0:8].y


def test_ap_and_broadcast_to_methods():
    @nki.jit
    def k(a, row):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        out2 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        p, f = a.shape
        t = nl.load(a.ap([[f, p], [1, f]]))
        nl.store(out, t)
        r = nl.load(row)
        nl.store(out2, r.broadcast_to((p, f)))
        return out, out2

    a, row = rand(8, 32), rand(1, 32)
    o1, o2 = k(a, row)
    np.testing.assert_array_equal(o1, a)
    np.testing.assert_array_equal(o2, np.broadcast_to(row, a.shape))


def _broadcast_kernel(hold_psum):
    @nki.jit
    def k(row):
        p, f = 128, row.shape[1]
        out = nl.ndarray((p, f), row.dtype, buffer=nl.shared_hbm)
        kept = nl.ndarray((8, 1), nl.float32, buffer=nl.shared_hbm)
        # a kernel holding all eight PSUM banks leaves the tensor engine no room
        held = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8 if hold_psum else 0)]
        nl.store(out, nl.broadcast_to(nl.load(row), (p, f)))
        for i, h in enumerate(held):
            nl.store(kept[i:i + 1, :], nl.copy(h[0:1, 0:1]))
        return out
    return k


@pytest.mark.parametrize("dtype", [np.float32, nl.bfloat16, np.int32])
@pytest.mark.parametrize("hold_psum", [False, True])
@pytest.mark.parametrize("cols", [700, 1024])
def test_partition_broadcast_copies_every_bit_through_the_tensor_engine_or_dma(dtype, hold_psum, cols):
    from trnsim.isa import DmaCopy, Memory, MultiplyMoving, TensorCopy
    from trnsim.nki.launch import launch

    row = (RNG.standard_normal((1, cols)) * 100).astype(np.float32)
    if dtype is not np.int32:
        row[0, 3], row[0, 4], row[0, 5] = np.nan, np.inf, -np.inf
    row[0, 6] = -0.0
    row = row.astype(dtype)
    run = launch(_broadcast_kernel(hold_psum), (row,), {}, chip="trn1", numerics=True)
    out = np.asarray(run.outputs[0])
    want = np.broadcast_to(row.astype(out.dtype), (128, cols))
    np.testing.assert_array_equal(out, want)
    insts = run.program.instructions
    on_pe = any(isinstance(i, MultiplyMoving) for i in insts)
    # the DMA copies bits; through the PE array -0.0 is a sum from zero: +0.0
    assert (np.signbit(out) == (np.signbit(want) & ~(on_pe & (want == 0)))).all()
    dmas = sum(isinstance(i, DmaCopy) and i.dst.memory is not Memory.HBM for i in insts)
    # NKI broadcasts a float row with a matmul by ones (two pieces of <= 512 columns);
    # an integer row, or a float one while PSUM is full, takes one DMA
    assert on_pe == (dtype is not np.int32 and not hold_psum)
    assert dmas == (1 if on_pe else 2)   # the row's load, and the broadcast's DMA
    # an fp32 row stays in PSUM (the first 700 or 1024 columns of two banks); a narrower
    # float is copied out piece by piece into SBUF in its own dtype
    copies = sum(isinstance(i, TensorCopy) and i.src.memory is Memory.PSUM and i.src.partitions == 128
                 and i.src.free_size <= 512 for i in insts)
    assert copies == (0 if not on_pe or dtype is np.float32 else 2)


def test_a_broadcast_kept_in_psum_gives_way_to_a_kernel_that_needs_all_of_psum():
    """A 4096-column fp32 broadcast fits PSUM whole, but the kernel then needs all eight
    banks while it is still live: PSUM is never spilled, so the kernel is traced again
    with the broadcast by DMA, and runs."""
    from trnsim.isa import MultiplyMoving
    from trnsim.nki.launch import launch

    @nki.jit
    def k(row, x):
        out = nl.ndarray((128, 4096), nl.float32, buffer=nl.shared_hbm)
        wide = nl.broadcast_to(nl.load(row), (128, 4096))
        acc = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(8)]
        xt = nl.load(x)
        for j, a in enumerate(acc):
            a += nl.matmul(xt[:, 0:128], xt, transpose_x=True)
            nl.store(out[:, j * 512:(j + 1) * 512], nl.add(a, wide[:, j * 512:(j + 1) * 512]))
        return out

    row, x = rand(1, 4096), rand(128, 512)
    run = launch(k, (row, x), {}, chip="trn1", numerics=True)
    assert not any(isinstance(i, MultiplyMoving) and i.src.partitions == 1 for i in run.program.instructions)
    want = np.tile(x[:, :128].T @ x, (1, 8)) + row
    np.testing.assert_allclose(np.asarray(run.outputs[0]), want, rtol=1e-4, atol=1e-3)


def test_a_row_off_partition_zero_or_in_psum_is_broadcast_by_dma():
    @nki.jit
    def k(x):
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(out[0], nl.broadcast_to(t[5:6, :], (128, 64)))
        row = nl.matmul(t[0:1, 0:1], t[0:1, :], transpose_x=True)   # [1, 64] in PSUM
        nl.store(out[1], nl.broadcast_to(row, (128, 64)))
        return out

    x = rand(8, 64)
    out = np.asarray(k(x))
    np.testing.assert_array_equal(out[0], np.broadcast_to(x[5], (128, 64)))
    np.testing.assert_allclose(out[1], np.broadcast_to(x[0, 0] * x[0], (128, 64)), rtol=1e-6)


def test_a_kernel_traced_again_makes_its_first_traces_broadcast_choices():
    """Four named 64 KiB tiles overflow SBUF, so the kernel is traced again with tiles
    freed at their last use, which leaves PSUM room the first trace did not have: the
    broadcasts must still go where they went in the first trace, or every lifetime
    counted in its instructions is off (a row read before its load, a tile freed early)."""
    from trnsim.nki.launch import launch

    @nki.jit
    def k(x, rows):
        out = nl.ndarray((128, 2048), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 2048), nl.float32)
        held = []
        for i in range(4):
            big = nl.load(x[i])                      # [128, 16384] fp32: 64 KiB per partition
            held.append(big)                         # named to the end: four do not fit in SBUF
            b = nl.broadcast_to(nl.load(rows[i:i + 1, :]), (128, 2048))
            c = nl.broadcast_to(nl.load(rows[i + 4:i + 5, :]), (128, 2048))
            acc += nl.multiply(b, c) + big[:, 0:2048]
        nl.store(out, acc)
        return out

    x, rows = rand(4, 128, 16384), rand(8, 2048)
    run = launch(k, (x, rows), {}, chip="trn1", numerics=True)
    want = sum(rows[i][None] * rows[i + 4][None] + x[i][:, :2048] for i in range(4))
    np.testing.assert_allclose(np.asarray(run.outputs[0]), want, rtol=1e-6, atol=1e-5)


def test_broadcasting_operands():
    @nki.jit
    def k(a, s, r, c):
        o1 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(o1, nl.load(a) + nl.load(s))
        nl.store(o2, nl.load(r) * nl.load(c))
        return o1, o2

    a, s, r, c = rand(128, 512), rand(1, 1), rand(128, 1), rand(1, 512)
    o1, o2 = k(a, s, r, c)
    np.testing.assert_allclose(o1, a + s, rtol=1e-6)
    np.testing.assert_allclose(o2, r * c, rtol=1e-6)


def test_store_a_python_scalar():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, 2.5)
        return out

    np.testing.assert_array_equal(k(rand(16, 8)), np.full((16, 8), 2.5, np.float32))


def test_masked_reduction_clips_its_output():
    def k(a):
        out = nl.ndarray((64, 1), a.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(a.shape[1])[None, :]
        t = nl.load(a[i_p, i_f])
        s = nl.sum(t[i_p, i_f], axis=1, mask=(i_p < 64))
        nl.store(out, s[0:64, :])
        return out

    a = rand(128, 32)
    program = nki.trace_program(k, a)
    (red,) = [i for i in program.instructions if isinstance(i, TensorReduce)]
    assert red.dst.partitions == 64 and red.src.partitions == 64
    np.testing.assert_allclose(nki.jit(k)(a)[:, 0], a[:64].astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_indexing_with_a_tile_gathers_rows():
    @nki.jit
    def k(a, idx):
        out = nl.ndarray((8, 4), dtype=a.dtype, buffer=nl.shared_hbm)
        i = nl.load(idx)
        nl.store(out, nl.load(a[i, :]))
        return out

    a = rand(8, 4)
    idx = np.array([[3], [0], [7], [7], [1], [2], [6], [5]], np.int32)
    np.testing.assert_array_equal(k(a, idx), a[idx[:, 0]])


def test_partition_axis_moved_off_a_tile_is_refused():
    @nki.jit
    def k(a):
        t = nl.load(a)
        i_p = nl.arange(8)[:, None]
        i_f = nl.arange(8)[None, :]
        return nl.copy(t[i_f, i_p])

    with pytest.raises(KernelError, match="partition axis"):
        k(rand(8, 8))


# -- language names --------------------------------------------------------------

def test_rounding_and_remainders_match_numpy():
    @nki.jit
    def k(a, b):
        outs = [nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm) for _ in range(5)]
        x, y = nl.load(a), nl.load(b)
        for out, v in zip(outs, (nl.floor(x), nl.ceil(x), nl.trunc(x), nl.mod(x, y), nl.fmod(x, y))):
            nl.store(out, v)
        return tuple(outs)

    a = np.concatenate([rand(4, 32) * 10, np.array([[-2.5, -2.0, 2.5, 3.0] * 8], np.float32)])
    b = np.full(a.shape, 3.0, np.float32)
    fl, ce, tr, md, fm = k(a, b)
    np.testing.assert_array_equal(fl, np.floor(a))
    np.testing.assert_array_equal(ce, np.ceil(a))
    np.testing.assert_array_equal(tr, np.trunc(a))
    np.testing.assert_allclose(md, np.mod(a, b), atol=1e-5)
    np.testing.assert_allclose(fm, np.fmod(a, b), atol=1e-5)


def test_logical_and_composed_ops_match_numpy():
    @nki.jit
    def k(a, b):
        names = ("logical_and", "logical_or", "logical_xor", "abs_max", "abs_min")
        outs = [nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm) for _ in range(len(names) + 4)]
        x, y = nl.load(a), nl.load(b)
        vals = [getattr(nl, n)(x, y, dtype=nl.float32) for n in names]
        vals += [nl.logical_not(x, dtype=nl.float32), nl.tan(x), nl.mish(x), nl.gelu_apprx_sigmoid(x)]
        for out, v in zip(outs, vals):
            nl.store(out, v)
        return tuple(outs)

    a = np.round(rand(8, 16))
    b = np.round(rand(8, 16))
    land, lor, lxor, amax, amin, lnot, tan, mish, gas = k(a, b)
    np.testing.assert_array_equal(land, np.logical_and(a, b))
    np.testing.assert_array_equal(lor, np.logical_or(a, b))
    np.testing.assert_array_equal(lxor, np.logical_xor(a, b))
    np.testing.assert_array_equal(lnot, np.logical_not(a))
    np.testing.assert_array_equal(amax, np.maximum(np.abs(a), np.abs(b)))
    np.testing.assert_array_equal(amin, np.minimum(np.abs(a), np.abs(b)))
    np.testing.assert_allclose(tan, np.tan(a), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(mish, a * np.tanh(np.log1p(np.exp(a))), rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(gas, a / (1 + np.exp(-1.702 * a)), rtol=2e-2, atol=2e-2)


def test_loops_grid_and_annotations():
    class Config(nl.NKIObject):
        pass

    cfg = Config(scale=2.0)

    @ncc.skip_middle_end_transformations
    @nki.jit
    def k(a: nt.tensor[8, 16]):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.ndarray((nl.par_dim(8), 16), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))

        def body(i):
            nl.store(out[:, nl.ds(i * 4, 4)], nl.multiply(nl.load(a[:, nl.ds(i * 4, 4)]), cfg.scale))

        nl.fori_loop(0, 4, body)
        nl.device_print("t", t)
        assert nl.program_ndim() == 1 and nl.num_programs(0) == 4
        return out

    a = rand(8, 16)
    np.testing.assert_array_equal(k[nl.spmd_dim(nl.nc(2), 2)](a), a * 2)
    assert nl.static_cast(3.7, nl.int32) == 3  # numpy's astype, as NKI casts at trace time


def test_load_transpose2d_identity_and_expand_dims():
    @nki.jit
    def k(a):
        o1 = nl.ndarray((a.shape[1], a.shape[0]), a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray((16, 16), nl.float32, buffer=nl.shared_hbm)
        nl.store(o1, nl.load_transpose2d(a))
        nl.store(o2, nl.expand_dims(nl.shared_identity_matrix(16, dtype=nl.float32), 2).reshape((16, 16)))
        return o1, o2

    a = rand(16, 32)
    o1, o2 = k(a)
    np.testing.assert_array_equal(o1, a.T)
    np.testing.assert_array_equal(o2, np.eye(16, dtype=np.float32))


def test_refused_names_raise_naming_the_name():
    with pytest.raises(KernelError, match=r"nki\.language\.atomic_rmw is not supported by trnsim: "):
        nl.atomic_rmw(1, 2)
    with pytest.raises(KernelError, match=r"nki\.collectives\.all_gather_v is not supported"):
        _ = ncc_coll.all_gather_v.something


def test_documented_name_table_is_current_and_complete():
    rows = apitable.entries()
    mine = [r for r in rows if r.name.split(".")[1] in ("language", "typing", "compiler")]
    assert [r.name for r in mine if r.status == "missing"] == []
    assert all(r.note for r in rows if r.status in ("refused", "differs"))
    assert apitable.main(["--check"]) == 0, "run python -m trnsim.nki.apitable"


def test_mask_on_softmax_var_where_and_transpose():
    @nki.jit
    def k(a):
        o1 = nl.ndarray((64, a.shape[1]), nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray((64, 1), nl.float32, buffer=nl.shared_hbm)
        o3 = nl.ndarray((64, a.shape[1]), nl.float32, buffer=nl.shared_hbm)
        o4 = nl.ndarray((a.shape[1], 64), nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(a.shape[1])[None, :]
        t = nl.load(a[i_p, i_f])
        keep = i_p < 64
        nl.store(o1, nl.softmax(t, axis=1, mask=keep)[0:64, :])
        nl.store(o2, nl.var(t, axis=1, mask=keep)[0:64, :])
        nl.store(o3, nl.where(nl.greater(t, 0.0), t, 0.0, mask=keep)[0:64, :])
        nl.store(o4, nl.copy(nl.transpose(t, mask=keep)))
        return o1, o2, o3, o4

    a = rand(128, 32)
    o1, o2, o3, o4 = k(a)
    h = a[:64]
    e = np.exp(h - h.max(axis=1, keepdims=True))
    np.testing.assert_allclose(o1, e / e.sum(axis=1, keepdims=True), rtol=2e-2, atol=1e-3)
    np.testing.assert_allclose(o2[:, 0], h.var(axis=1), rtol=1e-3)
    np.testing.assert_array_equal(o3, np.where(h > 0, h, 0))
    np.testing.assert_array_equal(o4, h.T)


def test_tensor_view_methods():
    @nki.jit
    def k(a):
        p, f = a.shape
        o1 = nl.ndarray((f, p), a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray((p, 4), a.dtype, buffer=nl.shared_hbm)
        o3 = nl.ndarray((p, f), a.dtype, buffer=nl.shared_hbm)
        nl.store(o1, nl.load(a.permute((1, 0))))
        nl.store(o2, nl.load(a.slice(1, 8, 16, 2)))
        t = nl.load(a.reshape_dim(1, (4, -1)))
        nl.store(o3, nl.copy(t.flatten_dims(1, 2)))
        assert a.is_contiguous() and not a.permute((1, 0)).is_contiguous() and not a.is_indirect()
        assert a.get_pattern() == [[f, p], [1, f]]
        assert a.assert_shape((p, f)) is a and a.itemsize == 4
        assert t.astype(nl.bfloat16).dtype is nl.bfloat16
        assert a.select(0, 3).shape == (f,) and a.expand_dim(1).squeeze_dim(1).shape == (p, f)
        return o1, o2, o3

    a = rand(16, 32)
    o1, o2, o3 = k(a)
    np.testing.assert_array_equal(o1, a.T)
    np.testing.assert_array_equal(o2, a[:, 8:16:2])
    np.testing.assert_array_equal(o3, a)


def test_series_and_derivative_ops_match_numpy():
    import math

    @nki.jit
    def k(a):
        outs = [nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm) for _ in range(3)]
        po = nl.ndarray((a.shape[0], 1), nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        for out, v in zip(outs, (nl.arctan(x), nl.erf_dx(x), nl.gelu_apprx_sigmoid_dx(x))):
            nl.store(out, v)
        nl.store(po, nl.prod(x, axis=1))
        return (*outs, po)

    a = rand(8, 6) * 3
    a[2, 3] = 0.0
    at, ed, gd, pr = k(a)
    s = 1 / (1 + np.exp(-1.702 * a))
    np.testing.assert_allclose(at, np.arctan(a), atol=1e-5)
    np.testing.assert_allclose(ed, 2 / math.sqrt(math.pi) * np.exp(-a * a), atol=1e-5)
    np.testing.assert_allclose(gd, s + 1.702 * a * s * (1 - s), atol=1e-4)
    np.testing.assert_allclose(pr[:, 0], np.prod(a, axis=1), rtol=1e-4)
    assert pr[2, 0] == 0.0


def test_collectives_over_a_world_of_one_rank():
    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a)
        r = nl.ndarray(a.shape, a.dtype, buffer=nl.sbuf)
        ncc_coll.all_reduce([t], [r], ncc_coll.ReplicaGroup([[0]]), op=nl.add)
        nl.store(out, r)
        assert ncc_coll.rank_id() == 0
        return out

    @nki.jit
    def two_ranks(a):
        t = nl.load(a)
        ncc_coll.all_gather([t], [t], ncc_coll.ReplicaGroup([[0, 1]]), collective_dim=0)
        return None

    a = rand(8, 16)
    np.testing.assert_array_equal(k(a), a)
    with pytest.raises(KernelError, match=r"all_gather over ranks \[0, 1\]: a trnsim kernel runs on one"):
        two_ranks(a)


def test_shared_constant_is_an_input_the_kernel_makes():
    table = np.arange(64, dtype=np.float32).reshape(8, 8)

    @nki.jit
    def k(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        c = nl.shared_constant(table)
        nl.store(out, nl.add(nl.load(a), nl.load(c)))
        return out

    a = rand(8, 8)
    np.testing.assert_array_equal(k(a), a + table)


def test_rand_dropout_and_loop_reduce():
    @nki.jit
    def k(a):
        o1 = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        o2 = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        o3 = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.random_seed(7)
        nl.store(o1, nl.rand((128, 64), nl.float32))
        nl.store(o2, nl.dropout(nl.load(a), 0.5))
        b = nl.zeros(a.shape, nl.float32)
        for i in nl.affine_range(3):
            b = nl.loop_reduce(nl.multiply(nl.load(a), float(i + 1)), np.maximum, [i], dtype=nl.float32)
        nl.store(o3, b)
        return o1, o2, o3

    a = np.abs(rand(16, 32)) + 0.1
    r, d, m = k(a)
    assert r.min() >= 0.0 and r.max() < 1.0 and 0.45 < r.mean() < 0.55
    np.testing.assert_array_equal(k(a)[0], r)
    dropped = d == 0
    assert 0.3 < dropped.mean() < 0.7
    np.testing.assert_array_equal(d[~dropped], a[~dropped])
    np.testing.assert_allclose(m, a * 3, rtol=1e-6)


def test_legacy_block_dimension_before_par_dim():
    @nki.jit
    def k(a, b):
        # a [K=256, M=128] and b [K=256, N=64]: a.T @ b with K in two blocks of 128
        out = nl.ndarray((a.shape[1], b.shape[1]), nl.float32, buffer=nl.shared_hbm)
        at = nl.ndarray((2, nl.par_dim(128), a.shape[1]), nl.float32, buffer=nl.sbuf)
        bt = nl.ndarray((2, nl.par_dim(128), b.shape[1]), nl.float32, buffer=nl.sbuf)
        acc = nl.zeros((1, nl.par_dim(a.shape[1]), b.shape[1]), nl.float32, buffer=nl.psum)
        for kk in nl.affine_range(2):
            at[kk] = nl.load(a[kk * 128:(kk + 1) * 128, :])
            bt[kk, :, :] = nl.load(b[kk * 128:(kk + 1) * 128, :])
        for kk in nl.affine_range(2):
            acc[0] += nl.matmul(at[kk], bt[kk], transpose_x=True)
        nl.store(out, nl.copy(acc[0]))
        return out

    a, b = rand(256, 128), rand(256, 64)
    np.testing.assert_allclose(k(a, b), a.T @ b, rtol=1e-4, atol=1e-3)


def test_tile_comparisons_are_elementwise():
    x = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    y = x.copy()
    y[:, ::2] = 0

    @nki.jit
    def compare(a, b):
        out = nl.ndarray((6,) + a.shape, nl.float32, buffer=nl.shared_hbm)
        ta, tb = nl.load(a), nl.load(b)
        for i, t in enumerate((ta == tb, ta != tb, ta > tb, ta >= tb, ta < tb, ta <= tb)):
            nl.store(out[i], value=nl.multiply(t, 1.0))
        return out

    got = compare(x, y)
    for i, want in enumerate((x == y, x != y, x > y, x >= y, x < y, x <= y)):
        assert np.array_equal(got[i], want.astype(np.float32)), i


def test_a_tile_has_no_truth_value():
    @nki.jit
    def branch(a):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        if t > 0:
            nl.store(out, value=t)
        return out

    with pytest.raises(KernelError, match="no truth value"):
        branch(np.ones((128, 8), np.float32))


def test_integer_division_of_int32_tiles_truncates_toward_zero():
    # all-int32 arithmetic runs in native integers (nki.isa.tensor_tensor's docs), so
    # 2224 / 38 is 58, not 58.53 rounded to 59; a float operand keeps float32 division
    @nki.jit
    def k(a, b):
        out = nl.ndarray((4, 3), dtype=nl.int32, buffer=nl.shared_hbm)
        x = nl.load(a)
        q = nl.divide(x, 38, dtype=nl.int32)
        r = nl.divide(x, nl.load(b), dtype=nl.int32)
        f = nl.divide(x, 38.0, dtype=nl.float32)
        nl.store(out[:, 0:1], q)
        nl.store(out[:, 1:2], r)
        nl.store(out[:, 2:3], nl.floor(f, dtype=nl.int32))
        return out

    a = np.array([[2224], [-2224], [37], [75]], np.int32)
    b = np.array([[38], [38], [-2], [-4]], np.int32)
    got = k(a, b)
    np.testing.assert_array_equal(got[:, 0], [58, -58, 0, 1])
    np.testing.assert_array_equal(got[:, 1], [58, -58, -18, -18])
    np.testing.assert_array_equal(got[:, 2], np.floor(a[:, 0] / 38.0))
