"""``t[i] = op(...)`` writes ``t[i]`` with the op's own instruction, as NKI's compiler
has it: no copy through a temporary tile (the copy would cost an engine instruction the
chip never runs). A value that is named, or that the assignment converts, is copied."""

import numpy as np

from trnsim import nki
from trnsim.isa import TensorCopy, TensorReduce, TensorScalar
from trnsim.nki import isa as nisa
from trnsim.nki import language as nl

A = np.random.default_rng(3).standard_normal((128, 256)).astype(np.float32)


def _opcodes(kernel, *args):
    return [type(i) for i in nki.trace_program(kernel, *args, chip="trn2")]


def test_an_assigned_result_is_written_in_place_by_its_instruction():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(a)
        buf[:, 0:128] = nl.exp(t[:, 0:128])
        buf[:, 128:256] = nl.copy(t[:, 128:256])
        nl.store(out, buf)
        return out

    ops = _opcodes(k, A)
    assert ops.count(TensorCopy) == 1   # nl.copy's own; no copy of either result into buf
    got = nki.simulate(k, chip="trn2")(A)
    np.testing.assert_allclose(got[:, :128], np.exp(A[:, :128]), rtol=1e-5)
    np.testing.assert_array_equal(got[:, 128:], A[:, 128:])


def test_a_named_result_read_again_is_copied_and_keeps_its_values():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(a)
        e = nl.multiply(t[:, 0:128], 2.0)
        buf[...] = e
        nl.store(out[:, 0:128], buf)
        nl.store(out[:, 128:256], nl.add(e, 1.0))   # e is still its own tile
        return out

    assert _opcodes(k, A).count(TensorCopy) == 1
    got = nki.simulate(k, chip="trn2")(A)
    np.testing.assert_array_equal(got[:, :128], A[:, :128] * 2)
    np.testing.assert_array_equal(got[:, 128:], A[:, :128] * 2 + 1)


def test_an_assignment_that_converts_the_dtype_is_written_by_its_instruction_rounding_as_it_writes():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((128, 128), dtype=nl.bfloat16, buffer=nl.sbuf)
        buf[...] = nl.multiply(nl.load(a[:, 0:128]), 3.0)   # a float32 result, written into bf16 by the multiply
        nl.store(out, nl.copy(buf, dtype=nl.float32))
        return out

    assert _opcodes(k, A).count(TensorCopy) == 1       # only the kernel's own nl.copy
    got = nki.simulate(k, chip="trn2")(A)
    want = (A[:, :128] * 3).astype(nl.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_a_negated_reduction_is_one_instruction():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(a)
        for i in nl.affine_range(4):
            acc[:, i:i + 1] = nisa.tensor_reduce(np.max, data=t[:, i * 64:(i + 1) * 64], axis=(1,), negate=True)
        nl.store(out, acc)
        return out

    ops = _opcodes(k, A)
    assert ops.count(TensorReduce) == 4 and TensorScalar not in ops and TensorCopy not in ops
    got = nki.simulate(k, chip="trn2")(A)
    np.testing.assert_array_equal(got, -A.reshape(128, 4, 64).max(axis=2))


def test_an_assignment_into_a_slot_of_another_rank_is_written_in_place():
    """``out[:, h, w] = nl.divide(acc, n)`` ([P] or [P, 1, 1] against the [P, 1] result):
    axes of size 1 do not stand in the way."""
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 2, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        res = nl.ndarray((128, 2, 2), dtype=nl.float32, buffer=nl.sbuf)
        t = nl.load(a)
        for h in nl.static_range(2):
            for w in nl.static_range(2):
                res[:, h, w] = nl.divide(nl.sum(t[:, (2 * h + w) * 64:(2 * h + w + 1) * 64], axis=1), 64.0)
        nl.store(out, res)
        return out

    assert TensorCopy not in _opcodes(k, A)
    got = nki.simulate(k, chip="trn2")(A)
    np.testing.assert_allclose(got.reshape(128, 4), A.reshape(128, 4, 64).mean(axis=2), rtol=1e-5)


def test_an_assignment_into_a_block_of_a_blocked_tile_is_written_in_place():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.shared_hbm)
        blocks = nl.ndarray((2, nl.par_dim(128), 128), dtype=nl.float32, buffer=nl.sbuf)
        for i in nl.affine_range(2):
            blocks[i, :, :] = nl.load(a[:, i * 128:(i + 1) * 128])
            nl.store(out[:, i * 128:(i + 1) * 128], nl.multiply(blocks[i], 2.0))
        return out

    assert TensorCopy not in _opcodes(k, A)
    np.testing.assert_array_equal(nki.simulate(k, chip="trn2")(A), 2 * A)
