"""The compiler's copies of a rewritten SBUF tile (trnsim.nki.hazards): a loop that
refills one tile waits for the readers of the copy it takes over, not of the last fill;
a tile the kernel placed itself, a write that covers nothing earlier, and a tile with no
room for a copy keep every wait. Values are the program's, in program order."""

import numpy as np
import pytest

from trnsim import nki
from trnsim.isa import DmaCopy, TensorReduce
from trnsim.nki import isa as nisa
from trnsim.nki import language as nl
from trnsim.nki.hazards import RENAME_BUFFERS

N = 10


@nki.jit
def window_sums(x):
    """nki-samples' adaptive average pool in small: one SBUF tile refilled per window."""
    out = nl.ndarray((128, N), dtype=nl.float32, buffer=nl.shared_hbm)
    window = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
    sums = nl.ndarray((128, N), dtype=nl.float32, buffer=nl.sbuf)
    for i in nl.static_range(N):
        nisa.dma_copy(dst=window, src=x[:, i * 8:(i + 1) * 8])
        sums[:, i:i + 1] = nisa.tensor_reduce(np.add, window, axis=(1,))
    nl.store(out, sums)
    return out


def _x():
    return np.random.default_rng(0).standard_normal((128, 8 * N)).astype(np.float32)


def _fills_and_reads(program):
    loads = [i for i, inst in enumerate(program.instructions) if isinstance(inst, DmaCopy)
             and inst.dst.tensor.on_chip]
    reduces = [i for i, inst in enumerate(program.instructions) if isinstance(inst, TensorReduce)]
    return loads, reduces


def test_a_refilled_tile_waits_for_the_readers_of_the_copy_it_takes_over():
    program = nki.trace_program(window_sums, _x(), chip="trn2")
    loads, reduces = _fills_and_reads(program)
    assert len(loads) == len(reduces) == N
    for k in range(1, N):
        deps = program.instructions[loads[k]].deps
        # the fill k copies back read its copy last; nothing newer is waited for
        assert (reduces[k - RENAME_BUFFERS] in deps) == (k >= RENAME_BUFFERS), (k, deps)
        assert not any(reduces[j] in deps for j in range(max(0, k - RENAME_BUFFERS + 1), k)), (k, deps)


def test_the_values_are_the_programs_in_program_order():
    x = _x()
    got = nki.simulate(window_sums, chip="trn2")(x)
    np.testing.assert_allclose(got, x.reshape(128, N, 8).sum(axis=2), rtol=1e-5, atol=1e-5)


def test_the_copies_let_the_fills_overlap_the_reads():
    x = _x()
    renamed = nki.benchmark(window_sums, chip="trn2")(x).latency_ns

    @nki.jit
    def placed(x):
        out = nl.ndarray((128, N), dtype=nl.float32, buffer=nl.shared_hbm)
        window = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf, address=(0, 0))
        sums = nl.ndarray((128, N), dtype=nl.float32, buffer=nl.sbuf, address=(0, 1024))
        for i in nl.static_range(N):
            nisa.dma_copy(dst=window, src=x[:, i * 8:(i + 1) * 8])
            sums[:, i:i + 1] = nisa.tensor_reduce(np.add, window, axis=(1,))
        nl.store(out, sums)
        return out

    serial = nki.benchmark(placed, chip="trn2")(x).latency_ns
    program = nki.trace_program(placed, x, chip="trn2")
    loads, reduces = _fills_and_reads(program)
    # the kernel placed the tile itself: each fill waits for the read of the one before
    assert all(reduces[k - 1] in program.instructions[loads[k]].deps for k in range(1, N))
    assert renamed == 8275.934    # simulated nanoseconds, exact
    assert serial == 25028.883
    assert renamed < serial


def test_a_write_over_part_of_an_earlier_read_keeps_its_wait():
    @nki.jit
    def halves(x):
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[:, 0:8])
        s[:, 0:1] = nisa.tensor_reduce(np.add, t, axis=(1,))    # reads all of t
        nisa.dma_copy(dst=t[:, 0:4], src=x[:, 8:12])             # refills half of it
        s[:, 1:2] = nisa.tensor_reduce(np.add, t, axis=(1,))
        nl.store(out, s)
        return out

    x = np.random.default_rng(1).standard_normal((128, 12)).astype(np.float32)
    program = nki.trace_program(halves, x, chip="trn2")
    loads, reduces = _fills_and_reads(program)
    assert reduces[0] in program.instructions[loads[1]].deps
    got = nki.simulate(halves, chip="trn2")(x)
    np.testing.assert_allclose(got[:, 1], x[:, 8:12].sum(axis=1) + x[:, 4:8].sum(axis=1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("free_kib, renamed", [(100, False), (40, True)])
def test_a_tile_is_copied_only_where_sbuf_has_room(free_kib, renamed):
    """A tile of ``free_kib`` per partition beside a 100 KiB one on trn2 (192 KiB per
    partition): a second copy of a 100 KiB tile does not fit, of a 40 KiB one it does."""
    cols = free_kib * 1024 // 4

    @nki.jit
    def big(x):
        out = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        keep = nl.ndarray((128, 100 * 1024 // 4), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(keep, 0.0)
        t = nl.ndarray((128, cols), dtype=nl.float32, buffer=nl.sbuf)
        s = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.static_range(2):
            nisa.dma_copy(dst=t, src=x[:, i * cols:(i + 1) * cols])
            s[:, i:i + 1] = nisa.tensor_reduce(np.add, t, axis=(1,))
        s[:, 0:1] = nisa.tensor_tensor(s[:, 0:1], keep[:, 0:1], op=np.add)
        nl.store(out, s)
        return out

    x = np.zeros((128, 2 * cols), np.float32)
    program = nki.trace_program(big, x, chip="trn2")
    loads, reduces = _fills_and_reads(program)
    assert (reduces[0] in program.instructions[loads[1]].deps) is not renamed
