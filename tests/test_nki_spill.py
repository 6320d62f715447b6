"""SBUF spilling: a kernel whose tiles do not fit in SBUF even freed at their last use runs
as the Neuron compiler compiles it, storing the tile used furthest ahead to HBM and
loading it back before its next use; what cannot fit even so is refused."""

from __future__ import annotations

import numpy as np
import pytest

import trnsim.nki.language as nl
from trnsim import nki
from trnsim.isa import DmaCopy, Memory
from trnsim.nki.tracer import KernelError
from trnsim.simulator import run_timing

RNG = np.random.default_rng(11)


@nki.jit
def keep_many(a):
    """Seven [128, 8192] fp32 tiles (32 KiB per partition each) and an accumulator live at
    once: trn1's 192 KiB per partition holds six."""
    out = nl.ndarray(a.shape[1:], nl.float32, buffer=nl.shared_hbm)
    tiles = [nl.load(a[i]) for i in range(a.shape[0])]
    acc = nl.zeros(a.shape[1:], nl.float32, buffer=nl.sbuf)
    for t in tiles:
        acc[...] = nl.add(acc, nl.exp(t))
    nl.store(out, acc)
    return out


def _spills(program):
    """(tile stored, tile loaded back into) for each spill and reload DMA, in order."""
    out = []
    for inst in program.instructions:
        if isinstance(inst, DmaCopy) and "_spill" in (inst.src.tensor.name + inst.dst.tensor.name):
            out.append((inst.src.tensor.name, inst.dst.tensor.name))
    return out


def test_tiles_that_do_not_fit_spill_to_hbm_and_come_back_with_their_values():
    a = RNG.standard_normal((7, 128, 8192)).astype(np.float32) * 0.1
    out = nki.simulate(keep_many, chip="trn1")(a)
    np.testing.assert_allclose(out, np.exp(a).sum(0), rtol=1e-5)
    program = nki.trace_program(keep_many, a, chip="trn1")
    moves = _spills(program)
    stores = [src for src, dst in moves if dst.endswith("_spill_0")]
    loads = [dst for src, dst in moves if src.endswith("_spill_0")]
    # the tiles pushed out are those used furthest ahead: the last ones loaded, which the
    # loop reaches last (Belady's choice); each comes back once, before its use
    assert stores == ["sbuf_5", "sbuf_6", "sbuf_4"]
    assert sorted(loads) == ["sbuf_4_r_0", "sbuf_5_r_0", "sbuf_6_r_0"]
    assert all(t.memory is Memory.HBM for t in program.tensors if t.name.endswith("_spill_0"))
    # simulated time is deterministic: the spill and reload DMAs are timed as any other
    assert run_timing(program).total_ps == run_timing(nki.trace_program(keep_many, a, chip="trn1")).total_ps


def test_a_kernel_that_fits_does_not_spill():
    assert _spills(nki.trace_program(keep_many, np.zeros((3, 128, 8192), np.float32), chip="trn1")) == []
    assert _spills(nki.trace_program(keep_many, np.zeros((7, 128, 4096), np.float32), chip="trn1")) == []


def test_an_accumulator_spilled_between_its_updates_keeps_accumulating():
    @nki.jit
    def far_apart(a, b):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        side = nl.ndarray(b.shape[1:], nl.float32, buffer=nl.shared_hbm)
        acc = nl.exp(nl.load(a))
        tiles = [nl.load(b[i]) for i in range(b.shape[0])]   # push acc out: it is used next only at the end
        total = nl.zeros(b.shape[1:], nl.float32, buffer=nl.sbuf)
        for t in tiles:
            total[...] = nl.add(total, t)
        nl.store(side, total)
        acc += nl.load(a)
        nl.store(out, acc)
        return out, side

    a = RNG.standard_normal((128, 8192)).astype(np.float32)
    b = RNG.standard_normal((6, 128, 8192)).astype(np.float32)
    out, side = nki.simulate(far_apart, chip="trn1")(a, b)
    np.testing.assert_allclose(out, np.exp(a) + a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(side, b.sum(0), rtol=1e-5, atol=1e-5)
    moves = _spills(nki.trace_program(far_apart, a, b, chip="trn1"))
    # acc (sbuf_1, used next at the very end) goes out first and comes back last
    assert moves[0] == ("sbuf_1", "sbuf_1_spill_0") and moves[-1] == ("sbuf_1_spill_0", "sbuf_1_r_0")


def test_operands_of_one_instruction_larger_than_sbuf_are_refused():
    @nki.jit
    def too_wide(a, b):
        out = nl.ndarray(a.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(b)))
        return out

    wide = np.zeros((128, 40000), np.float32)   # 156 KiB per partition each: two cannot sit together
    with pytest.raises(KernelError, match="SBUF allocation .* does not fit on trn1"):
        nki.trace_program(too_wide, wide, wide, chip="trn1")


def test_a_tile_updated_in_place_never_waits_for_itself():
    """``acc[...] = nl.add(acc, x)`` on a tile too large for a second copy: the add reads
    and writes acc; it once waited for itself, and the run could not finish."""
    a = RNG.standard_normal((3, 128, 8192)).astype(np.float32) * 0.1
    program = nki.trace_program(keep_many, a, chip="trn1")
    assert all(i.index not in i.deps for i in program.instructions)
    np.testing.assert_allclose(nki.simulate(keep_many, chip="trn1")(a), np.exp(a).sum(0), rtol=1e-5)
