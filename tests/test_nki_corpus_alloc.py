"""SBUF and PSUM allocation as the Neuron compiler does it: tiles freed at their last use
(so loop-local tiles take turns in the space), direct allocation (``ncc.sbuf.mod_alloc``,
``ncc.psum.mod_alloc``) with more logical blocks than physical tiles, and what really
does not fit refused with what is live."""

from __future__ import annotations

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.compiler as ncc
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim.nki.tracer import KernelError
from trnsim.simulator import simulate


def _rng(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# 8 row tiles of [128, 16384] fp32: 64 KiB each. Named in the loop body, each lives until
# the next iteration reassigns it, so two iterations' three tiles (384 KiB) do not fit in
# trn1's 192 KiB; freed at their last use, a tile lives one iteration.
@nki.jit
def scaled_rows(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        u = nl.multiply(t, 2.0)
        v = nl.add(u, 1.0)
        nl.store(out[i * 128:(i + 1) * 128, :], value=v)
    return out


def test_loop_local_tiles_fit_when_freed_at_last_use():
    x = _rng(0, 1024, 16384)
    traced = scaled_rows.trace(x, chip="trn1")
    assert traced.tracer.lifetimes is not None  # it needed the compiler's lifetimes
    result = simulate(traced.tracer.program, traced.inputs, fidelity="instruction")
    got = result.outputs[traced.output_tensors[0].tensor.name]
    np.testing.assert_allclose(got, x * 2 + 1, rtol=1e-6)


def test_a_reused_tile_waits_for_its_last_reader():
    traced = scaled_rows.trace(_rng(0, 1024, 16384), chip="trn1")
    program = traced.tracer.program
    kinds = [type(i).__name__ for i in program.instructions[:5]]
    assert kinds == ["DmaCopy", "TensorScalar", "TensorScalar", "DmaCopy", "DmaCopy"]
    # iteration 1's load lands where iteration 0's loaded tile was (byte 0): it waits for
    # that tile's last reader (the multiply, instruction 1), as well as its writer
    load = program.instructions[4]
    assert load.writes()[0].tensor.byte_offset == program.instructions[0].writes()[0].tensor.byte_offset == 0
    assert load.deps == (0, 1)
    assert simulate(program).total_ps == 534081108


@nki.jit
def too_big(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    a = nl.load(x)
    b = nl.ndarray((128, 48 * 1024), nl.float32, buffer=nl.sbuf)  # too-big
    b[:, 0:512] = a
    nl.store(out, value=nl.add(a, b[:, 0:512]))
    return out


def test_what_does_not_fit_even_freed_at_last_use_is_refused_with_what_is_live():
    with pytest.raises(KernelError) as info:
        too_big.trace(_rng(1, 128, 512), chip="trn1")
    message = str(info.value)
    assert "SBUF allocation 'b' of 192 KiB per partition" in message
    assert "live there: a (2 KiB" in message
    assert "test_nki_corpus_alloc.py:" in message


# 16 logical PSUM blocks of one bank each over 8 banks: block (i, j) in bank 4 * i + j % 4,
# so blocks j and j + 4 take turns in a bank.
@nki.jit
def psum_rotation(a, b):
    out = nl.ndarray((128, 8 * 512), dtype=nl.float32, buffer=nl.shared_hbm)
    a_sb = nl.load(a)
    acc = nl.ndarray((2, 8, nl.par_dim(128), 512), dtype=nl.float32, name="acc",
                     buffer=ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(2, 4)))
    for i in nl.affine_range(2):
        for j in nl.affine_range(4):
            b_sb = nl.load(b[:, (i * 4 + j) * 512:(i * 4 + j + 1) * 512])
            acc[i, j] = nisa.nc_matmul(a_sb, b_sb)
            acc[i, j + 4] = nisa.nc_matmul(a_sb, nl.multiply(b_sb, 2.0))
            nl.store(out[:, (i * 4 + j) * 512:(i * 4 + j + 1) * 512], value=nl.add(acc[i, j + 4], 0.0))
    return out


def test_psum_modulo_allocation_maps_blocks_onto_banks_and_computes():
    a, b = _rng(2, 128, 128), _rng(3, 128, 8 * 512)
    traced = psum_rotation.trace(a, b, chip="trn1")
    banks = sorted({(t.name, t.byte_offset // 2048) for t in traced.tracer.program.tensors if t.memory.value == "psum"})
    assert ("acc_0[1, 5]", 5) in banks and ("acc_0[1, 1]", 5) in banks and ("acc_0[0, 3]", 3) in banks
    result = simulate(traced.tracer.program, traced.inputs, fidelity="instruction")
    got = result.outputs[traced.output_tensors[0].tensor.name]
    np.testing.assert_allclose(got, 2 * a.T @ b, rtol=1e-4, atol=1e-3)


def test_psum_block_reusing_a_bank_waits_for_the_reader_of_the_block_before():
    traced = psum_rotation.trace(_rng(2, 128, 128), _rng(3, 128, 8 * 512), chip="trn1")
    program = traced.tracer.program
    writes = [i for i in program.instructions if type(i).__name__ == "MultiplyMoving"]
    first, second = writes[0], writes[1]   # acc[0, 0] then acc[0, 4], both in bank 0
    assert first.writes()[0].tensor.byte_offset == second.writes()[0].tensor.byte_offset == 0
    reader_of_first = [i.index for i in program.instructions if i.index > first.index
                       and any(v.tensor is first.writes()[0].tensor for v in i.reads())]
    assert reader_of_first == []   # acc[0, 0] is never read: its bank is rewritten after the matmul
    assert first.index in second.deps  # write after write in the shared bank
    assert simulate(program).total_ps == 23061181


@nki.jit
def psum_conflict(a, b):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    a_sb, b_sb = nl.load(a), nl.load(b)
    acc = nl.ndarray((2, nl.par_dim(128), 512), dtype=nl.float32, name="acc",
                     buffer=ncc.psum.mod_alloc(base_bank=0, num_bank_tiles=(1,)))
    acc[0] = nisa.nc_matmul(a_sb, b_sb)
    acc[1] = nisa.nc_matmul(a_sb, b_sb)
    nl.store(out, value=nl.add(acc[0], acc[1]))  # conflict
    return out


def test_two_live_blocks_in_one_bank_are_a_lifetime_conflict():
    with pytest.raises(KernelError, match=r"acc_0\[1\] shares its space \(PSUM bank 0\).*lifetime conflict") as info:
        psum_conflict.trace(_rng(4, 128, 128), _rng(5, 128, 512), chip="trn1")
    assert "test_nki_corpus_alloc.py:" in str(info.value)


# double buffering by hand: ncc.sbuf.mod_alloc with 2 physical tiles for 8 logical ones,
# and the address moved on inside the loop body (the compiler runs the body once)
@nki.jit
def sbuf_double_buffer(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((8, nl.par_dim(128), 512), dtype=nl.float32, name="buf",
                     buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)))
    addr = 4096
    for i in nl.affine_range(8):
        res = nl.ndarray((nl.par_dim(128), 512), dtype=nl.float32, name="res",
                         buffer=ncc.sbuf.mod_alloc(base_addr=addr))
        addr += 2048
        buf[i] = nl.load(x[i * 128:(i + 1) * 128, :])
        res[...] = nl.multiply(buf[i], 3.0)
        nl.store(out[i * 128:(i + 1) * 128, :], value=res)
    return out


def test_sbuf_modulo_allocation_double_buffers_and_loop_body_addresses_stay():
    x = _rng(6, 1024, 512)
    traced = sbuf_double_buffer.trace(x, chip="trn1")
    tensors = {t.name: t for t in traced.tracer.program.tensors}
    assert [tensors[f"buf_0[{i}]"].byte_offset for i in range(4)] == [0, 2048, 0, 2048]
    assert {t.byte_offset for name, t in tensors.items() if name.startswith("res")} == {4096}
    result = simulate(traced.tracer.program, traced.inputs, fidelity="instruction")
    np.testing.assert_allclose(result.outputs[traced.output_tensors[0].tensor.name], 3 * x, rtol=1e-6)
    assert simulate(traced.tracer.program).total_ps == 33753170   # each load writes its block itself


# nki-library's qkv_cte: one PSUM bank per loop iteration, each at address=(0, bank * 2048),
# all live at once (a loop Python runs iteration by iteration places each where it says)
@nki.jit
def psum_bank_per_iteration(a, b):
    out = nl.ndarray((4, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    a_sb, b_sb = nl.load(a), nl.load(b)
    banks = []
    for bank_id in nl.affine_range(4):
        banks.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum, address=(0, bank_id * 2048)))
    for i in range(4):
        nisa.nc_matmul(dst=banks[i], stationary=a_sb, moving=b_sb)
    for i in range(4):
        nl.store(out[i], nl.multiply(banks[i], float(i + 1)))
    return out


def test_an_address_in_a_loop_places_each_iteration_where_it_says():
    a, b = _rng(21, 128, 128), _rng(22, 128, 512)
    traced = psum_bank_per_iteration.trace(a, b, chip="trn2")
    assert sorted(t.byte_offset for t in traced.tracer.program.tensors if t.memory.value == "psum") == \
        [0, 2048, 4096, 6144]
    out = nki.simulate(psum_bank_per_iteration)(a, b)
    for i in range(4):
        np.testing.assert_allclose(out[i], (i + 1) * (a.T @ b), rtol=1e-4, atol=1e-4)
