"""Loop iterations overlap as far as their data allow: ``sequential_range`` orders a
loop-carried value through its tile's dependencies, not with a barrier; a load assigned
into a block keeps no dependency of the temporary tile it was traced into; and such
temporaries do not push later tiles along SBUF."""

from __future__ import annotations

import numpy as np

from trnsim import dtypes
from trnsim.hw.placement import OnChipAllocator
from trnsim.isa import DmaCopy, LoadStationary, Memory, MultiplyMoving
from trnsim.nki import isa as nisa, jit, language as nl, trace_program, typed
from trnsim.simulator import run_timing


def _loop_kernel(loop):
    @jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for i in loop(x.shape[0] // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, :])
            nl.store(out[i * 128:(i + 1) * 128, :], value=nl.exp(t))
        return out
    return kernel


def _load_starts(loop):
    program = trace_program(_loop_kernel(loop), np.zeros((512, 512), np.float32), chip="trn2")
    run = run_timing(program)
    loads = [i for i, inst in enumerate(program.instructions)
             if isinstance(inst, DmaCopy) and inst.dst.memory is Memory.SBUF]
    stores = [i for i, inst in enumerate(program.instructions)
              if isinstance(inst, DmaCopy) and inst.dst.memory is Memory.HBM]
    return run, [run.starts[i] for i in loads], [run.ends[i] for i in stores]


def test_sequential_range_iterations_overlap_like_affine_range():
    seq, seq_loads, seq_stores = _load_starts(nl.sequential_range)
    aff, aff_loads, _ = _load_starts(nl.affine_range)
    # the second iteration's load starts before the first iteration's store ends
    assert seq_loads[1] < seq_stores[0]
    assert seq.time_ns == aff.time_ns and seq_loads == aff_loads


def test_a_loop_the_device_branches_on_starts_each_iteration_after_the_last():
    run, loads, stores = _load_starts(nl.dynamic_range)
    assert all(loads[k + 1] >= stores[k] for k in range(len(stores) - 1))
    assert run.time_ns > _load_starts(nl.sequential_range)[0].time_ns


def test_a_loop_carried_value_stays_in_order():
    @jit
    def running_sum(x):
        out = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.sequential_range(x.shape[0] // 128):
            t = nl.load(x[i * 128:(i + 1) * 128, :])
            acc[...] = nl.add(acc, t)
        nl.store(out, value=acc)
        return out

    x = np.arange(4 * 128 * 512, dtype=np.float32).reshape(512, 512) % 7
    np.testing.assert_allclose(running_sum(x), x.reshape(4, 128, 512).sum(0))


def _blocked_matmul(blocks: int):
    """The matmul tutorial's pattern at a small size: per K block (a sequential loop), the
    blocks of both operands are loaded into fresh tiles by assignment, then multiplied."""
    @jit
    def kernel(lhs_t, rhs):
        k, m = lhs_t.shape
        _, n = rhs.shape
        out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
        res = nl.zeros((nl.par_dim(128), n), dtype=nl.float32, buffer=nl.sbuf)
        for kb in nl.sequential_range(blocks):
            lhs = nl.ndarray((2, nl.par_dim(128), m), dtype=lhs_t.dtype, buffer=nl.sbuf)
            rhs_tiles = nl.ndarray((2, nl.par_dim(128), n), dtype=rhs.dtype, buffer=nl.sbuf)
            for j in nl.affine_range(2):
                row = (kb * 2 + j) * 128
                lhs[j, :, :] = nl.load(lhs_t[row:row + 128, :])
                rhs_tiles[j, :, :] = nl.load(rhs[row:row + 128, :])
            psum = nl.zeros((128, n), dtype=nl.float32, buffer=nl.psum)
            for j in nl.affine_range(2):
                psum[...] += nisa.nc_matmul(lhs[j, :, :], rhs_tiles[j, :, :])
            res[...] += psum
        nl.store(out, value=res)
        return out
    return kernel


def test_block_loads_wait_for_no_matmul_while_sbuf_has_room():
    blocks = 4
    lhs_t = typed(np.zeros((blocks * 256, 128), np.float32), dtypes.bfloat16)
    rhs = typed(np.zeros((blocks * 256, 512), np.float32), dtypes.bfloat16)
    program = trace_program(_blocked_matmul(blocks), lhs_t, rhs, chip="trn2")
    pe = {i for i, inst in enumerate(program.instructions) if isinstance(inst, (MultiplyMoving, LoadStationary))}
    loads = [inst for inst in program.instructions if isinstance(inst, DmaCopy) and inst.dst.memory is Memory.SBUF]
    assert len(loads) == 4 * blocks
    # every block's tiles are fresh and SBUF is nearly empty: no load waits on the tensor engine
    assert not any(set(inst.deps) & pe for inst in loads)


def test_block_matmul_values():
    blocks = 2
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((blocks * 256, 128)), rng.standard_normal((blocks * 256, 512))
    got = _blocked_matmul(blocks)(typed(a.astype(np.float32), dtypes.bfloat16),
                                  typed(b.astype(np.float32), dtypes.bfloat16))
    ref = a.astype(np.float32).T @ b.astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=0.05, atol=0.5)


def test_a_temporary_that_was_not_needed_leaves_the_cursor_where_it_was():
    alloc = OnChipAllocator(Memory.SBUF, 128, 4096, "trn2", next_fit=True)
    a = alloc.allocate("a", 0, 128, 1024)
    temp = alloc.allocate("temp", 0, 128, 512)
    alloc.release("temp")
    alloc.forget_placement("temp")
    assert (a, temp) == (0, 1024)
    assert alloc.allocate("b", 0, 128, 1024) == 1024   # where the temporary was
    # only the last allocation can be forgotten
    alloc.allocate("c", 0, 128, 256)
    alloc.forget_placement("b")
    assert alloc.allocate("d", 0, 128, 256) == 2304
