"""Indirect DMA: gather and scatter of HBM rows through an index tile, in the spellings
AWS's NKI code uses (``x[idx_tile, i_f]`` in nl.load/nl.store, ``nisa.dma_copy`` with an
indexed src or dst, ``.ap(vector_offset=..., indirect_dim=...)`` and ``scalar_offset``).

Values are checked against numpy; the instruction is checked for its dependency on the
index tile, its per-index descriptors and its cost."""

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.hw.dma import plan_dma
from trnsim.isa import DmaCopy, DmaIndirect
from trnsim.simulator import run_timing

RNG = np.random.default_rng(5)
TABLE = RNG.standard_normal((100, 48)).astype(np.float32)
ROWS = RNG.permutation(100)[:32].astype(np.int32)


@nki.jit
def gather_rows(table, idx):
    out = nl.ndarray((idx.shape[0], table.shape[1]), table.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(table.shape[1])[None, :]
    rows = nl.load(idx[i_p])
    nl.store(out, nl.load(table[rows[i_p, 0], i_f]))
    return out


def test_gather_rows_with_nl_load():
    np.testing.assert_array_equal(gather_rows(TABLE, ROWS), TABLE[ROWS])


def test_scatter_rows_with_nl_store_leaves_other_rows():
    @nki.jit
    def k(table, src, idx):
        out = nl.ndarray(table.shape, table.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(table))
        rows = nl.load(idx.reshape((idx.shape[0], 1)))
        nl.store(out[rows, :], nl.load(src))
        return out
    src = RNG.standard_normal((32, 48)).astype(np.float32)
    want = TABLE.copy()
    want[ROWS] = src
    np.testing.assert_array_equal(k(TABLE, src, ROWS), want)


def test_dma_copy_gathers_elements_of_a_flattened_tensor():
    # one element per index: the indexed axis of a [N, 1] view of the flattened tensor
    @nki.jit
    def k(table, idx):
        out = nl.ndarray((idx.shape[0], 1), table.dtype, buffer=nl.shared_hbm)
        pos = nl.load(idx.reshape((idx.shape[0], 1)))
        got = nl.ndarray((idx.shape[0], 1), table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=got, src=table.reshape((table.shape[0] * table.shape[1], 1))[pos, :])
        nl.store(out, got)
        return out
    flat = RNG.integers(0, TABLE.size, 64).astype(np.int32)
    np.testing.assert_array_equal(k(TABLE, flat)[:, 0], TABLE.reshape(-1)[flat])


def test_dma_copy_scatter_with_rmw_add():
    @nki.jit
    def k(base, src, idx):
        out = nl.ndarray(base.shape, base.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.load(base))
        rows = nl.load(idx.reshape((idx.shape[0], 1)))
        nisa.dma_copy(dst=out[rows, :], src=nl.load(src), dst_rmw_op=nl.add)
        return out
    src = RNG.standard_normal((32, 48)).astype(np.float32)
    want = TABLE.copy()
    want[ROWS] += src
    np.testing.assert_allclose(k(TABLE, src, ROWS), want, rtol=1e-6)


def test_index_on_a_middle_axis_under_a_mask():
    # x[b, idx, :] with the last tile of rows masked, as nki-samples' resize kernel does:
    # the index tile comes from nisa.iota of i_p, so a mask on i_p clips it
    x = RNG.standard_normal((2, 50, 16)).astype(np.float32)
    n = 100

    @nki.jit
    def k(x):
        out = nl.ndarray((2, n, 16), x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(16)[None, :]
        for b in nl.affine_range(2):
            half = nl.multiply(nisa.iota(i_p, dtype=nl.int32), 0.5, dtype=nl.float32)
            rows = nl.floor(half, dtype=nl.int32)
            t = nl.load(x[b, rows, i_f], mask=(i_p < n))
            nl.store(out[b, i_p, i_f], t, mask=(i_p < n))
        return out
    np.testing.assert_array_equal(k(x), x[:, np.arange(n) // 2, :])


def test_ap_vector_offset_and_scalar_offset():
    @nki.jit
    def k(table, idx, start):
        out = nl.ndarray((32, 48), table.dtype, buffer=nl.shared_hbm)
        ids = nl.ndarray((32, 1), idx.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=ids, src=idx.reshape((32, 1)))
        got = nl.ndarray((32, 48), table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=got, src=table.ap(pattern=[[48, 32], [1, 48]], vector_offset=ids, indirect_dim=0))
        nl.store(out, got)
        first = nl.ndarray((1, 1), start.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=first, src=start.reshape((1, 1)))
        block = nl.ndarray((4, 48), table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=block, src=table.ap(pattern=[[48, 4], [1, 48]], offset=0, scalar_offset=first,
                                              indirect_dim=0))
        nisa.dma_copy(dst=out.ap(pattern=[[48, 4], [1, 48]], offset=0, scalar_offset=first, indirect_dim=0),
                      src=block)
        return out
    start = np.array([7], np.int32)
    want = TABLE[ROWS].copy()
    want[7:11] = TABLE[7:11]
    np.testing.assert_array_equal(k(TABLE, ROWS, start), want)


def test_out_of_bounds_index_raises_index_error_or_is_skipped():
    bad = ROWS.copy()
    bad[3] = 100

    with pytest.raises(IndexError, match="index 4800 is out of bounds for axis 0 with size 4800") as err:
        gather_rows(TABLE, bad)
    assert "index 100 at position 3" in str(err.value.__cause__)

    @nki.jit
    def skipping(table, idx):
        out = nl.ndarray((idx.shape[0], table.shape[1]), table.dtype, buffer=nl.shared_hbm)
        rows = nl.load(idx.reshape((idx.shape[0], 1)))
        got = nl.full((idx.shape[0], table.shape[1]), -1.0, table.dtype)
        nisa.dma_copy(dst=got, src=table[rows, :], oob_mode=nisa.oob_mode.skip)
        nl.store(out, got)
        return out
    want = TABLE[np.minimum(bad, 99)]
    want[3] = -1.0
    np.testing.assert_array_equal(skipping(TABLE, bad), want)


def test_float_index_tile_is_refused_by_name():
    @nki.jit
    def k(table, idx):
        out = nl.ndarray((32, 48), table.dtype, buffer=nl.shared_hbm)
        rows = nl.load(idx.reshape((32, 1)))
        nl.store(out, nl.load(table[rows, :]))
        return out
    with pytest.raises(Exception, match="indices must be an integer dtype"):
        k(TABLE, ROWS.astype(np.float32))


def test_indirect_dma_waits_for_the_index_tile_and_costs_a_descriptor_per_row():
    program = nki.trace_program(gather_rows, TABLE, ROWS)
    (gather,) = [i for i in program.instructions if isinstance(i, DmaIndirect)]
    producer = max(i.index for i in program.instructions
                   if i.index < gather.index and any(w.tensor is gather.indices.tensor for w in i.writes()))
    assert producer in gather.deps
    assert gather.indices.size == 32 and gather.bound == 100 and gather.step == 48

    plan = plan_dma(program.chip, gather)
    assert plan.descriptors == 32 and plan.chunk_bytes == 48 * 4
    # the same rows read in place: as many descriptors (SBUF splits by partition), none generated
    direct = plan_dma(program.chip, DmaCopy(gather.dst, program.inputs[0].view()[0:32, :]))
    assert direct.descriptors == 32
    d = program.chip.dma
    assert plan.fixed_ps - direct.fixed_ps == round(32 * d.swdge_descriptor_ns * 1000)
    # into HBM the rows would be one contiguous run, but an indirect read ends a run per index
    scratch = program.hbm((32, 48), program.inputs[0].dtype, "scratch")
    into_hbm = DmaIndirect(scratch.view(), gather.src, 0, indices=gather.indices, dim=0, step=48, bound=100)
    assert plan_dma(program.chip, into_hbm).descriptors == 32
    assert plan_dma(program.chip, DmaCopy(scratch.view(), program.inputs[0].view()[0:32, :])).descriptors == 1
    timed = run_timing(program)
    assert timed.ends[gather.index] - timed.starts[gather.index] >= plan.fixed_ps + plan.own_ps
