"""A kernel launched over the physical cores of a logical NeuronCore (``kernel[2]`` on
trn2/trn3): one instance per core, at once, each core with its own SBUF, PSUM, engines
and DMA queues, HBM shared; ``nisa.sendrecv`` and ``nisa.core_barrier`` between them."""

import numpy as np
import pytest

import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim import nki
from trnsim.errors import ProgramError
from trnsim.isa import DmaCopy, Engine, Memory, TensorTensor, split_track
from trnsim.nki.tracer import KernelError
from trnsim.program import Program
from trnsim.simulator import simulate
from trnsim.trace.events import track_label, track_sort_key

RNG = np.random.default_rng(7)
A = RNG.standard_normal((256, 64)).astype(np.float32)


@nki.jit
def swap_add(a):
    """Each core loads its half, swaps it with the other core and adds the two."""
    pid = nl.program_id(0)
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    mine = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    theirs = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=mine, src=a[pid * 128:(pid + 1) * 128, :])
    nisa.sendrecv(src=mine, dst=theirs, send_to_rank=1 - pid, recv_from_rank=1 - pid, pipe_id=0)
    total = nl.ndarray((128, 64), a.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=total, data1=mine, data2=theirs, op=nl.add)
    nisa.dma_copy(dst=out[pid * 128:(pid + 1) * 128, :], src=total)
    return out


def test_sendrecv_swaps_tiles_between_the_two_cores():
    out = nki.simulate(swap_add[2])(A)
    half = A[:128] + A[128:]
    np.testing.assert_array_equal(out, np.concatenate([half, half]))


def test_each_core_has_its_own_tracks_memory_and_instructions():
    program = nki.trace_program(swap_add[2], A, chip="trn2")
    assert program.cores == 2
    by_core = {0: [], 1: []}
    for inst in program.instructions:
        by_core[inst.core].append(inst)
        assert split_track(inst.track)[1] == inst.core
        for v in inst.reads() + inst.writes():
            if v.tensor.on_chip and not isinstance(inst, DmaCopy):
                assert v.tensor.core == inst.core   # an engine touches its own core's SBUF only
    assert [type(i).__name__ for i in by_core[0]] == [type(i).__name__ for i in by_core[1]]
    # the send is one DMA on the sending core's queue, into the other core's tile
    sends = [i for i in program.instructions if isinstance(i, DmaCopy) and i.src.tensor.on_chip
             and i.dst.tensor.on_chip]
    assert [(s.core, s.src.tensor.core, s.dst.tensor.core) for s in sends] == [(0, 0, 1), (1, 1, 0)]
    # each core's add waits for the tile the other core sent it
    adds = {i.core: i for i in program.instructions if isinstance(i, TensorTensor)}
    for core, add in adds.items():
        assert any(program.instructions[d] in sends and program.instructions[d].core != core for d in add.deps)
    # tiles of the two cores sit at the same addresses, each in its own SBUF
    tiles = [t for t in program.tensors if t.memory is Memory.SBUF]
    assert {(t.byte_offset, t.core) for t in tiles} >= {(0, 0), (0, 1)}


def test_the_cores_run_at_once():
    @nki.jit
    def halves(a):
        pid = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        n = a.shape[0] // nl.num_programs(0)
        for i in nl.affine_range(n // 128):
            t = nl.load(a[pid * n + i * 128:pid * n + (i + 1) * 128, :])
            nl.store(out[pid * n + i * 128:pid * n + (i + 1) * 128, :], nl.exp(t))
        return out

    big = RNG.standard_normal((1024, 512)).astype(np.float32)
    two = nki.benchmark(halves[2], warmup=1, iters=1)(big)
    np.testing.assert_allclose(two.outputs, np.exp(big), rtol=1e-5) if two.outputs is not None else None
    one = nki.benchmark(halves, warmup=1, iters=1)(big)
    # the same work split over two cores takes half the time, less what does not split
    assert 0.45 < two.latency_ns / one.latency_ns < 0.6
    one_core_in_turn = nki.benchmark(halves[2], warmup=1, iters=1, chip="trn1")(big)
    assert one_core_in_turn.latency_ns > 0.9 * nki.benchmark(halves, warmup=1, iters=1, chip="trn1")(big).latency_ns


def test_a_launch_traces_the_same_program_every_time():
    listings = {nki.trace_program(swap_add[2], A, chip="trn2").listing("x") for _ in range(3)}
    assert len(listings) == 1


def test_core_barrier_orders_every_core_after_what_all_issued_before_it():
    @nki.jit
    def publish(a):
        pid = nl.program_id(0)
        scratch = nl.ndarray((2, 128, 64), a.dtype, buffer=nl.shared_hbm)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        t = nl.load(a[pid * 128:(pid + 1) * 128, :])
        nl.store(scratch[pid], t)
        nisa.core_barrier(scratch, (0, 1))
        other = nl.load(scratch[1 - pid])   # the other core's half, written before the barrier
        nl.store(out[pid * 128:(pid + 1) * 128, :], other)
        return out

    np.testing.assert_array_equal(nki.simulate(publish[2])(A), np.concatenate([A[128:], A[:128]]))
    program = nki.trace_program(publish[2], A, chip="trn2")
    stores = [i.index for i in program.instructions if isinstance(i, DmaCopy) and i.dst.tensor.name.startswith("hbm")
              and i.src.tensor.memory is not Memory.HBM][:2]
    after = [i for i in program.instructions if isinstance(i, DmaCopy) and i.src.tensor.memory is Memory.HBM
             and i.index > max(stores)]
    for load in after:
        assert set(stores) <= set(load.deps)


def test_private_hbm_is_each_cores_own_and_shared_hbm_is_one():
    @nki.jit
    def private(a):
        pid = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        mine = nl.ndarray((128, 64), a.dtype, buffer=nl.private_hbm)
        nisa.dma_copy(dst=mine, src=a[pid * 128:(pid + 1) * 128, :])
        t = nl.load(mine)
        nl.store(out[pid * 128:(pid + 1) * 128, :], t)
        return out

    np.testing.assert_array_equal(nki.simulate(private[2])(A), A)
    program = nki.trace_program(private[2], A, chip="trn2")
    hbm = [t.name for t in program.tensors if t.memory is Memory.HBM]
    assert len(hbm) == 4   # the input, the one shared output, a private tensor per core


def test_a_sendrecv_no_core_answers_names_where_each_core_stands():
    @nki.jit
    def lonely(a):
        pid = nl.program_id(0)
        t = nl.load(a[0:128, :])
        if pid == 0:
            nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out[0:128, :], t)
        return out

    with pytest.raises(KernelError, match=r"core 0 waits at nisa.sendrecv at .*test_nki_cores.py:\d+ \(waits for core 1 "
                                          r"to receive and core 1 to send\); core 1 ended"):
        nki.simulate(lonely[2])(A)


def test_cores_waiting_on_each_other_fail_instead_of_hanging():
    @nki.jit
    def crossed(a):
        pid = nl.program_id(0)
        t = nl.load(a[0:128, :])
        if pid == 0:
            nisa.sendrecv(src=t, dst=t, send_to_rank=1, recv_from_rank=1, pipe_id=0)
        else:
            nisa.core_barrier(a, (0, 1))
        return a

    with pytest.raises(KernelError, match="core 0 waits at nisa.sendrecv.*core 1 waits at nisa.core_barrier over cores"):
        nki.simulate(crossed[2])(A)


def test_bad_ranks_and_a_failing_core_are_clear_errors():
    @nki.jit
    def far(a):
        t = nl.load(a[0:128, :])
        nisa.sendrecv(src=t, dst=t, send_to_rank=2, recv_from_rank=0, pipe_id=0)
        return a

    with pytest.raises(KernelError, match="send_to_rank=2 names no core of this launch; the kernel runs on cores 0..1"):
        nki.simulate(far[2])(A)

    @nki.jit
    def breaks_on_core_1(a):
        assert nl.program_id(0) == 0, "only core 0 may run this"
        return a

    with pytest.raises(AssertionError, match="only core 0 may run this"):
        nki.simulate(breaks_on_core_1[2])(A)

    @nki.jit
    def not_a_member(a):
        if nl.program_id(0) == 1:
            nisa.core_barrier(a, (0,))
        return a

    with pytest.raises(KernelError, match=r"core_barrier over cores \[0\] is called on core 1"):
        nki.simulate(not_a_member[2])(A)


def test_on_a_chip_of_one_core_per_logical_core_the_instances_take_turns():
    @nki.jit
    def rows(a):
        pid = nl.program_id(0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out[pid * 128:(pid + 1) * 128, :], nl.load(a[pid * 128:(pid + 1) * 128, :]))
        return out

    assert nki.trace_program(rows[2], A, chip="trn1").cores == 1
    assert nki.trace_program(rows[2], A, chip="trn2").cores == 2
    np.testing.assert_array_equal(nki.simulate(rows[2], chip="trn1")(A), A)
    with pytest.raises(KernelError, match="send_to_rank=1 names another rank; this launch runs on one core"):
        nki.simulate(swap_add[2], chip="trn1")(A)


def test_an_engine_cannot_touch_another_cores_memory():
    p = Program("trn2")
    a = p.sbuf((128, 64))
    p.use_core(1)
    b = p.sbuf((128, 64))
    assert (a.core, b.core, a.byte_offset, b.byte_offset) == (0, 1, 0, 0)
    with pytest.raises(ProgramError, match="in the memory of physical core 1, and the instruction runs on core 0"):
        p.add(TensorTensor(a.view(), a.view(), b.view(), engine=Engine.VECTOR))
    p.add(DmaCopy(b.view(), a.view()))   # a DMA moves data between the cores
    inst = TensorTensor(b.view(), b.view(), b.view(), engine=Engine.VECTOR, core=1)
    p.add(inst)
    assert inst.track == "vector@nc1"
    run = simulate(p)
    assert run.ends[1] > run.starts[1]
    with pytest.raises(ProgramError, match="core -1 must be a non-negative int"):
        p.use_core(-1)


def test_track_names_and_order_by_core():
    assert track_label("vector@nc1") == "VectorE (core 1)"
    assert track_label("dma.q3@nc1") == "DMA queue 3 (core 1)"
    assert track_label("vector") == "VectorE"
    tracks = ["dma.q0@nc1", "vector@nc1", "dma.q1", "tensor", "vector"]
    assert sorted(tracks, key=track_sort_key) == ["tensor", "vector", "dma.q1", "vector@nc1", "dma.q0@nc1"]


def test_tiles_freed_at_their_last_use_on_every_core():
    @nki.jit
    def many_tiles(a):
        pid = nl.program_id(0)
        out = nl.ndarray((2, 128, 16384), a.dtype, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 16384), nl.float32, buffer=nl.sbuf)
        for i in range(6):   # six 64 KiB tiles per partition: they fit only one after another
            t = nl.ndarray((128, 16384), nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=t, value=float(i + pid))
            nisa.tensor_tensor(dst=acc, data1=acc, data2=t, op=nl.add)
        nl.store(out[pid], acc)
        return out

    out = nki.simulate(many_tiles[2])(A)
    np.testing.assert_array_equal(out[0], np.full((128, 16384), 15.0, np.float32))
    np.testing.assert_array_equal(out[1], np.full((128, 16384), 21.0, np.float32))


@nki.jit
def copy_rows(a):
    """Each grid instance copies its own block of rows through SBUF, 128 rows at a time."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    n = a.shape[0] // nl.num_programs(None)
    flat = nl.program_id(0) * nl.num_programs(1) + nl.program_id(1) if nl.program_ndim() == 2 else nl.program_id(0)
    first = flat * n
    for r in nl.affine_range(n // 128):
        rows = slice(first + r * 128, first + (r + 1) * 128)
        nl.store(out[rows, :], nl.load(a[rows, :]))
    return out


def test_a_grid_runs_over_the_two_cores_where_nl_nc_says_as_aws_spmd_example_lays_out():
    from trnsim.hw.spec import load_chip

    trn1, trn2 = load_chip("trn1"), load_chip("trn2")
    outer = [[(0, 0), (0, 1), (1, 0), (1, 1)], [(2, 0), (2, 1), (3, 0), (3, 1)]]
    inner = [[(0, 0), (0, 1), (2, 0), (2, 1)], [(1, 0), (1, 1), (3, 0), (3, 1)]]
    assert copy_rows[nl.spmd_dim(nl.nc(2), 2), 2].instances_by_core(trn2) == outer
    assert copy_rows[nl.nc(2) * 2, 2].instances_by_core(trn2) == outer
    assert copy_rows[nl.spmd_dim(2, nl.nc(2)), 2].instances_by_core(trn2) == inner
    assert copy_rows[2 * nl.nc(2), 2].instances_by_core(trn2) == inner
    assert copy_rows[4, 2].instances_by_core(trn2) == outer            # unmarked: contiguous halves
    assert copy_rows[5].instances_by_core(trn2) == [[(0,), (1,), (2,)], [(3,), (4,)]]
    assert copy_rows[nl.nc(2)].instances_by_core(trn2) == [[(0,)], [(1,)]]
    assert copy_rows[1].instances_by_core(trn2) == [[(0,)]]
    assert copy_rows[nl.nc(2) * 2, 2].instances_by_core(trn1) == [sorted(outer[0] + outer[1])]
    for grid, rows in (((nl.nc(2) * 2, 2), 1024), ((2 * nl.nc(2), 2), 1024), ((4, 2), 1024), ((5,), 640)):
        a = RNG.standard_normal((rows, 64)).astype(np.float32)
        np.testing.assert_array_equal(nki.simulate(copy_rows[grid], chip="trn2")(a), a)
    with pytest.raises(KernelError, match="more than one axis over the cores"):
        copy_rows[nl.nc(2), nl.nc(2)]
    with pytest.raises(TypeError, match="names nl.nc more than once"):
        nl.spmd_dim(nl.nc(2), nl.nc(2))
    with pytest.raises(TypeError, match="positive integer"):
        nl.spmd_dim(2, 0)


def test_a_dma_bound_grid_on_two_cores_takes_what_each_cores_engines_need_for_its_half():
    """Hand calculation: each physical core has its own 16 DMA engines and share of HBM,
    so a copy that keeps them busy takes, on each core, the bytes of its own instances
    over the busier of the two, plus one DMA's issue latency and the last store's own
    transfer that nothing overlaps."""
    from trnsim.hw.dma import plan_dma
    from trnsim.hw.spec import load_chip

    chip = load_chip("trn2")
    a = RNG.standard_normal((8192, 2048)).astype(np.float32)     # 64 MiB: 64 tiles of [128, 2048]
    spread = nki.trace_program(copy_rows[nl.nc(2) * 2], a, chip="trn2")
    one = nki.trace_program(copy_rows[4], a, chip="trn1")
    assert spread.cores == 2 and one.cores == 1
    run = simulate(spread)
    ends = {c: max(run.ends[i] for i, inst in enumerate(spread.instructions) if inst.core == c) for c in (0, 1)}
    starts = {c: min(run.starts[i] for i, inst in enumerate(spread.instructions) if inst.core == c) for c in (0, 1)}
    assert starts[0] == starts[1] == 0                        # both cores start at launch
    assert ends[0] == ends[1] == run.total_ps                  # and run to the end: at once, not in turn
    dmas = [inst for inst in spread.instructions if isinstance(inst, DmaCopy) and inst.core == 0]
    assert len(dmas) == 64                                     # 32 loads and 32 stores per core
    plans = [plan_dma(chip, inst) for inst in dmas]
    busy = max(sum(p.pool_ps for p in plans), sum(p.hbm_ps for p in plans))
    hand = plans[0].fixed_ps + busy + plans[-1].own_ps - plans[-1].pool_ps
    assert run.total_ps == hand == 195_249_024
    # each core's half takes what the whole half takes on a core of its own
    alone = simulate(nki.trace_program(copy_rows[2], a[:4096], chip="trn1"))
    assert simulate(nki.trace_program(copy_rows[1], a[:4096], chip="trn2")).total_ps == run.total_ps
    assert alone.program.cores == 1
    # and the trace shows both cores' DMA queues busy
    labels = {track_label(t) for t in run.tracks}
    assert {"DMA queue 0", "DMA queue 0 (core 1)", "DMA queue 12", "DMA queue 12 (core 1)"} <= labels
