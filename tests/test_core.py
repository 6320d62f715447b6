"""Timing: exact simulated times of small programs, worked out by hand from the cost
model (docs/hardware.md) with trn1's figures (trnsim/hw/chips/trn1.toml).

trn1: PE 2.8 GHz, vector 1.12 GHz, scalar 1.4 GHz, GpSimd 1.4 GHz; semaphore wait
190 ns, semaphore to DMA 1300 ns; DMA 16 engines x 17 B/ns, 600 ns per instruction,
50 ns per descriptor; HBM 820 GB/s / 2 cores = 410 B/ns. Times are integer picoseconds,
each instruction's duration rounded to the nearest picosecond.
"""

import json

import pytest

from trnsim import Program, SimulationError, dtypes, simulate
from trnsim.isa import (Activation, ActivationFunc, AffineSelect, BnAggr, BnStats, Engine, Iota, Memset, SemaphoreSignal,
                        SemaphoreWait, TensorCopy, TensorReduce, TensorScalar, TensorTensor, Transpose, AluOp)


def ps(cycles, ghz):
    return round(cycles * 1000 / ghz)


def prog():
    return Program("trn1", name="t")


def test_one_matmul_bf16():
    p = prog()
    s = p.sbuf([128, 128], dtypes.bfloat16, "s")
    m = p.sbuf([128, 512], dtypes.bfloat16, "m")
    acc = p.psum([128, 512], dtypes.float32, "acc")
    p.matmul(acc, s, m)
    r = simulate(p)
    load = ps(128 / 4, 2.8)                # stationary loads 4x faster than streaming 128 columns
    mult = ps(64 + max(min(64, 128), 512), 2.8)  # fixed start-up + max(min(64, M), N)
    assert (load, mult) == (11429, 205714)
    assert r.starts == [0, load] and r.ends == [load, load + mult]
    assert r.total_ps == 217143


def test_one_matmul_fp32_is_four_times_slower():
    p = prog()
    s = p.sbuf([128, 128], dtypes.float32, "s")
    m = p.sbuf([128, 512], dtypes.float32, "m")
    acc = p.psum([128, 512], dtypes.float32, "acc")
    p.matmul(acc, s, m)
    assert simulate(p).total_ps == ps(128 * 4 / 4, 2.8) + ps(64 + 512 * 4, 2.8) == 800000


def test_stationary_load_overlaps_previous_multiply():
    p = prog()
    s = p.sbuf([128, 128], dtypes.bfloat16, "s")
    m = p.sbuf([128, 512], dtypes.bfloat16, "m")
    acc = p.psum([128, 512], dtypes.float32, "acc")
    p.matmul(acc, s, m)
    p.matmul(acc, s, m, accumulate=True)
    r = simulate(p)
    load, mult = 11429, 205714
    # the second load starts with the first multiply; the second multiply follows the first
    assert r.starts == [0, load, load, load + mult] and r.ends[3] == load + 2 * mult
    # small moving tiles: max(min(64, M), N) = 64 when N = 32
    p2 = prog()
    p2.matmul(p2.psum([128, 32], dtypes.float32, "a"), p2.sbuf([128, 128], dtypes.bfloat16, "s"),
              p2.sbuf([128, 32], dtypes.bfloat16, "m"))
    assert simulate(p2).ends[1] == load + ps(64 + 64, 2.8)


def test_dependent_chain_across_two_engines():
    p = prog()
    a = p.sbuf([128, 512], dtypes.float32, "a")
    b = p.sbuf([128, 512], dtypes.float32, "b")
    c = p.sbuf([128, 512], dtypes.float32, "c")
    i = p.add(Activation(b, a, ActivationFunc.EXP, engine=Engine.SCALAR))
    p.add(TensorTensor(c, a, b, AluOp.ADD, engine=Engine.VECTOR, deps=(i,)))
    r = simulate(p)
    act = ps(60 + max(64, 512), 1.4)        # SBUF access + max(64, N)
    add = ps(60 + 2 * 512, 1.12)            # two fp32 inputs in SBUF: 2N
    assert (act, add) == (408571, 967857)
    assert r.starts[1] == act + 190_000     # semaphore wait between engines
    assert r.total_ps == act + 190_000 + add == 1566428


def test_back_to_back_dependency_on_one_engine_costs_extra():
    p = prog()
    a = p.sbuf([128, 512], dtypes.bfloat16, "a")
    b = p.sbuf([128, 512], dtypes.bfloat16, "b")
    i = p.add(TensorScalar(b, a, AluOp.MULTIPLY, 2.0, engine=Engine.VECTOR))
    p.add(TensorScalar(a, b, AluOp.ADD, 1.0, engine=Engine.VECTOR, deps=(i,)))
    p.add(TensorScalar(a, a, AluOp.ADD, 1.0, engine=Engine.VECTOR))
    r = simulate(p)
    one = ps(60 + 512, 1.12)
    assert [e - s for s, e in zip(r.starts, r.ends)] == [one, ps(60 + 512 + 100, 1.12), one]
    assert r.starts[1] == r.ends[0]         # same engine: no semaphore


def test_lane_engine_cost_rules():
    p = prog()
    f = p.sbuf([128, 2048], dtypes.float32, "f")
    h = p.sbuf([128, 2048], dtypes.bfloat16, "h")
    h2 = p.sbuf([128, 2048], dtypes.bfloat16, "h2")
    red = p.sbuf([128, 1], dtypes.float32, "red")
    acc = p.psum([128, 512], dtypes.float32, "acc")
    cases = [
        (TensorTensor(h2, h, h, engine=Engine.VECTOR), 60 + 2048, 1.12),                   # all bf16 in SBUF: N
        (TensorTensor(f[:, 0:512], acc, f[:, 0:512], engine=Engine.VECTOR), 60 + 512, 1.12),  # one input in PSUM: N
        (TensorReduce(red, h, engine=Engine.VECTOR), 60 + 1024, 1.12),                      # bf16 add: N/2
        (TensorReduce(red, f, engine=Engine.VECTOR), 60 + 2048, 1.12),
        (Activation(f, f, ActivationFunc.RECIPROCAL, engine=Engine.SCALAR), 60 + 8 * 2048, 1.4),
        (Activation(f[:, 0:16], f[:, 0:16], engine=Engine.SCALAR), 60 + 64, 1.4),           # minimum 64 cycles
        (TensorCopy(f[:, 0:1024], f[:, ::2], engine=Engine.VECTOR), 60 + 1024, 1.12),   # 8-byte stride is fine
        (TensorCopy(f[:, 0:512], f[:, ::4], engine=Engine.VECTOR), 60 + 512, 1.12),  # 16-byte stride is fine
        (TensorCopy(f[:, 0:256], f[:, ::8], engine=Engine.VECTOR), 60 + 2 * 256, 1.12),     # 32-byte stride halves bandwidth
        (Memset(f, 0.0, engine=Engine.GPSIMD), 150 + 2048, 1.4),
        (BnStats(f[:, 0:6], f[:, 0:512], engine=Engine.VECTOR), 60 + 512, 1.12),          # one pass over the input
        (BnAggr(f[:, 0:2], f[:, 0:18], engine=Engine.VECTOR), 60 + 64, 1.12),
        (Iota(f, (1,), engine=Engine.GPSIMD), 150 + 2048, 1.4),
        (AffineSelect(f, f, (1,), engine=Engine.GPSIMD), 150 + 2048, 1.4),
    ]
    for inst, cycles, ghz in cases:
        q = prog()
        q.tensors, q._tensor_ids = p.tensors, p._tensor_ids
        q.add(inst)
        assert simulate(q).total_ps == ps(cycles, ghz), inst.describe()


def test_trn2_fast_bf16_copies():
    """NC-v3's vector performance mode: 4x in SBUF with a contiguous innermost axis, 2x
    with a strided one or with one operand in PSUM, none with an fp32 operand."""
    def copy_ps(src_memory, dst_memory, dtype=dtypes.bfloat16, strided=False):
        p = Program("trn2")
        width = 4096 if strided else 2048
        a = (p.sbuf if src_memory == "sbuf" else p.psum)([128, width if src_memory == "sbuf" else 512], dtype, "a")
        b = (p.sbuf if dst_memory == "sbuf" else p.psum)([128, 2048 if dst_memory == "sbuf" else 512], dtypes.bfloat16, "b")
        src = a.view()[:, ::2] if strided else a.view()
        n = min(src.free_size, b.view().free_size)
        p.add(TensorCopy(b.view()[:, :n], src[:, :n], engine=Engine.VECTOR))
        return simulate(p).total_ps, n

    total, n = copy_ps("sbuf", "sbuf")
    assert total == ps(60 + n / 4, 0.96)
    total, n = copy_ps("sbuf", "sbuf", strided=True)   # a 4-byte stride: not contiguous, not large
    assert total == ps(60 + n / 2, 0.96)
    total, n = copy_ps("psum", "sbuf")
    assert total == ps(60 + max(64, n / 2), 0.96)
    total, n = copy_ps("psum", "sbuf", dtype=dtypes.float32)
    assert total == ps(60 + n, 0.96)


def test_transpose_cost():
    p = prog()
    s = p.sbuf([128, 128], dtypes.bfloat16, "s")
    t = p.psum([128, 128], dtypes.bfloat16, "t")
    p.add(Transpose(t, s, engine=Engine.TENSOR))
    assert simulate(p).total_ps == ps(64 + max(128, min(64, 128)), 2.8)


def dma_ps(descriptors, chunk_bytes):
    rounds = -(-descriptors // min(16, descriptors))
    return round(rounds * (chunk_bytes / 17 + 50) * 1000)


def test_dma_bound_copy():
    p = prog()
    h = p.hbm([128, 2048], dtypes.float32, "h", kind="input")
    s = p.sbuf([128, 2048], dtypes.float32, "s")
    p.dma(s, h)
    r = simulate(p)
    # 128 descriptors of 8 KiB (one per partition) over 16 engines: 8 rounds
    assert r.dma_plans[0].descriptors == 128 and r.dma_plans[0].chunk_bytes == 8192
    assert r.total_ps == 600_000 + dma_ps(128, 8192) == 4855059


def test_small_chunks_are_inefficient():
    p = prog()
    h = p.hbm([128, 64], dtypes.bfloat16, "h")
    s = p.sbuf([128, 64], dtypes.bfloat16, "s")
    p.dma(s, h)
    assert simulate(p).total_ps == 600_000 + dma_ps(128, 128)


def test_a_transposing_dma_is_the_engines_own_transpose_on_nc_v3():
    """HBM [F, P] read into SBUF [P, F] (the source's contiguous axis becomes the
    partitions): NC-v3 moves the destination's rows as a copy would, at 90% of the
    bandwidth; NC-v2 moves it element by element."""
    from trnsim.isa import View

    def plan(chip):
        p = Program(chip)
        src = p.hbm([128, 128], dtypes.bfloat16, "h")
        s = p.sbuf([128, 128], dtypes.bfloat16, "s")
        v = src.view()
        p.dma(s, View(src, v.offset, (v.dims[1], v.dims[0])))
        return simulate(p).dma_plans[0]

    trn2, trn1 = plan("trn2"), plan("trn1")
    assert (trn2.descriptors, trn2.chunk_bytes) == (128, 256)
    assert trn2.own_ps == round(8 * (256 / (23 * 0.9) + 24) * 1000)   # NC-v3: 24 ns a descriptor
    assert (trn1.descriptors, trn1.chunk_bytes) == (128 * 128, 2)
    assert trn1.own_ps == round(1024 * (2 / 17 + 50) * 1000)


def test_two_queues_share_the_dma_engines():
    p = prog()
    h = p.hbm([2, 128, 2048], dtypes.float32, "h")
    s = [p.sbuf([128, 2048], dtypes.float32, f"s{i}") for i in range(2)]
    p.dma(s[0], h[0], queue=0)
    p.dma(s[1], h[1], queue=1)
    r = simulate(p)
    one = dma_ps(128, 8192)
    assert r.ends == [600_000 + one, 600_000 + 2 * one]


def test_hbm_to_hbm_copy_is_hbm_bound():
    p = prog()
    a = p.hbm([128, 2048], dtypes.float32, "a")
    b = p.hbm([128, 2048], dtypes.float32, "b")
    p.dma(b, a)
    r = simulate(p)
    # one contiguous MiB is cut into 16 descriptors of 64 KiB, one per engine;
    # read and write: 2 MiB at 410 B/ns take longer than the engines' 3905 ns
    assert r.dma_plans[0].descriptors == 16 and r.dma_plans[0].own_ps == dma_ps(16, 65536) == 3905059
    assert r.total_ps == 600_000 + round(2 * 2**20 / 410 * 1000) == 5715005


def test_dma_overlaps_compute():
    p = prog()
    h = p.hbm([2, 128, 2048], dtypes.float32, "h")
    s = [p.sbuf([128, 2048], dtypes.float32, f"s{i}") for i in range(2)]
    d0 = p.dma(s[0], h[0], queue=0)
    p.dma(s[1], h[1], queue=1)
    p.add(TensorScalar(s[0], s[0], AluOp.MULTIPLY, 3.0, engine=Engine.VECTOR, deps=(d0,)))
    r = simulate(p)
    one = dma_ps(128, 8192)
    scale = ps(60 + 2048, 1.12)
    assert r.starts[2] == 600_000 + one + 190_000
    assert r.ends[2] == 600_000 + one + 190_000 + scale
    assert r.ends[2] < r.ends[1]            # the vector engine works while queue 1 still moves data
    assert r.total_ps == r.ends[1] == 600_000 + 2 * one


def test_dma_after_compute_waits_for_the_semaphore():
    p = prog()
    s = p.sbuf([128, 64], dtypes.bfloat16, "s")
    h = p.hbm([128, 64], dtypes.bfloat16, "h")
    i = p.add(Memset(s, 1.0, engine=Engine.VECTOR))
    p.dma(h, s, deps=[i])
    r = simulate(p)
    assert r.starts[1] == ps(60 + 64, 1.12) + 1_300_000
    assert r.total_ps == r.starts[1] + 600_000 + dma_ps(128, 128)


def test_semaphores_between_engines():
    p = prog()
    a = p.sbuf([128, 512], dtypes.float32, "a")
    p.add(Memset(a, 0.0, engine=Engine.VECTOR))
    p.add(SemaphoreSignal(sem="ready", engine=Engine.VECTOR))
    p.add(SemaphoreWait(sem="ready", count=1, engine=Engine.SCALAR))
    p.add(Activation(a, a, engine=Engine.SCALAR))
    r = simulate(p)
    memset = ps(60 + 512, 1.12)
    assert r.ends[1] == memset and r.starts[2] == memset + 190_000
    assert r.total_ps == memset + 190_000 + ps(60 + 512, 1.4)


def test_wait_that_is_never_signalled_is_reported():
    p = prog()
    p.add(SemaphoreWait(sem="never", count=2, engine=Engine.SCALAR))
    p.add(SemaphoreSignal(sem="never", engine=Engine.VECTOR))
    with pytest.raises(SimulationError, match="scalar: instruction 0 waits for semaphore 'never' to reach 2 \\(now 1\\)"):
        simulate(p)


def test_same_program_same_times_and_trace(tmp_path, small_matmul):

    runs = [simulate(small_matmul(), trace=tmp_path / f"{i}.json") for i in range(2)]
    assert runs[0].starts == runs[1].starts and runs[0].ends == runs[1].ends
    assert (tmp_path / "0.json").read_bytes() == (tmp_path / "1.json").read_bytes()
    json.loads((tmp_path / "0.json").read_text())


def test_fidelity_and_inputs_are_checked():
    p = prog()
    with pytest.raises(Exception, match="fidelity 'fast' is not one of: timing, instruction"):
        simulate(p, fidelity="fast")
    with pytest.raises(Exception, match="computes no data"):
        simulate(p, {"x": 1})


def test_semaphore_wait_takes_the_earliest_signal_even_if_booked_later():
    p = prog()
    a = p.sbuf([128, 8192], dtypes.float32, "a")
    b = p.sbuf([128, 8], dtypes.float32, "b")
    p.add(Memset(a, 0.0, engine=Engine.VECTOR))                      # 0: long
    p.add(SemaphoreSignal(sem="s", engine=Engine.VECTOR))            # 1: late signal
    p.add(SemaphoreWait(sem="s", count=1, engine=Engine.GPSIMD))     # 2
    p.add(Memset(b, 0.0, engine=Engine.SCALAR))                      # 3: short
    p.add(SemaphoreSignal(sem="s", engine=Engine.SCALAR))            # 4: early signal
    r = simulate(p)
    early = ps(60 + 64, 1.4)
    assert r.ends[4] == early < r.ends[1]
    assert r.ends[2] == early + 190_000


def test_stationary_load_waits_for_a_transpose_before_it():
    p = prog()
    s = p.sbuf([128, 128], dtypes.bfloat16, "s")
    m = p.sbuf([128, 512], dtypes.bfloat16, "m")
    t = p.psum([128, 128], dtypes.bfloat16, "t")
    acc = p.psum([128, 512], dtypes.float32, "acc")
    p.add(Transpose(t, s, engine=Engine.TENSOR))
    p.matmul(acc, s, m)
    r = simulate(p)
    assert r.starts[1] == r.ends[0]  # the PE array is busy with the transpose until then
