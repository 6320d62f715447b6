"""Tracing is exact: the Programs library kernels trace into (tensors, placements,
instructions, operands, dependencies, sources, static costs and DMA plans) match
fingerprints stored when the tracer was known to be right, so speeding up the tracer
cannot change what it makes.

Regenerate the stored fingerprints only for a deliberate change to what kernels trace
into: ``TRNSIM_REGENERATE=1 pytest tests/test_nki_trace_exact.py``.
"""

import dataclasses
import enum
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import trnsim.nki as nki
import trnsim.nki.isa as nisa
from trnsim.hw.static import static_timing
import trnsim.nki.language as nl
from trnsim import dtypes
from trnsim.isa import View
from trnsim.kernels.attention import flash_attention_bwd, flash_attention_fwd
from trnsim.kernels.backward import layernorm_backward_kernel, softmax_backward_kernel
from trnsim.kernels.conv import conv2d_kernel
from trnsim.kernels.elementwise import binary_kernel, unary_kernel
from trnsim.kernels.fused import Recipe, Ref, Step, fused_rows_kernel
from trnsim.kernels.fused_matmul import fused_matmul_kernel
from trnsim.kernels.gemm import matmul_general
from trnsim.kernels.matmul import matmul_basic, matmul_optimized
from trnsim.kernels.norms import groupnorm_kernel, layernorm_kernel, rmsnorm_kernel
from trnsim.kernels.reduce import log_softmax_kernel, reduce_kernel
from trnsim.kernels.softmax import softmax_kernel

STORED = Path(__file__).parent / "data" / "nki_trace_fingerprints.json"
X, Y = Ref("in", 0), Ref("in", 1)
SOFTMAX = Recipe(("full",), (Step("max", (X,)), Step("subtract", (X, Ref("step", 0))), Step("exp", (Ref("step", 1),)),
                             Step("sum", (Ref("step", 2),)), Step("divide", (Ref("step", 2), Ref("step", 3)))), (4,))
MM_SILU = Recipe(("row",), (Step("add", (Ref("mm"), X)), Step("silu", (Ref("step", 0),))), (1,))


def f32(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def bf16(seed, *shape):
    return nki.typed(f32(seed, *shape), dtypes.bfloat16)


@nki.jit
def masked_tail_grid(x, y):
    """A hand-written kernel with what the library kernels use little: launch grids,
    nl.arange masks past the end of HBM, sequential_range barriers, iota and
    affine_select, a partly written PSUM zero tile and in-place updates."""
    n, d = x.shape
    out = nl.ndarray((n, d), nl.float32, buffer=nl.shared_hbm)
    i_p = nl.arange(128)[:, None]
    i_f = nl.arange(d)[None, :]
    pid = nl.program_id(0)
    for t in nl.sequential_range((n + 127) // 128):
        rows = t * 128 + i_p
        a = nl.load(x[rows, i_f], mask=rows < n)
        b = nl.load(y[rows, i_f], mask=rows < n)
        c = nl.multiply(a, b)
        c += a
        idx = nisa.iota(i_p * 0 + i_f + pid, dtype=nl.float32)
        sel = nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=c, on_false_value=0.0)
        s = nl.add(sel, idx)
        acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        acc[:, 0:64] += nl.matmul(a, b[:, 0:64], transpose_x=True)
        s[:, 0:64] = nl.add(s[:, 0:64], acc[:, 0:64])
        nl.store(out[rows, i_f], value=s, mask=rows < n)
    return out


CASES = {
    "matmul_basic": lambda: (matmul_basic, (bf16(0, 256, 256), bf16(1, 256, 1024)), {}),
    "matmul_optimized": lambda: (matmul_optimized, (bf16(0, 512, 256), bf16(1, 512, 1024)), {}),
    "matmul_general": lambda: (matmul_general, (f32(2, 300, 200), f32(3, 300, 700)), {}),
    "softmax": lambda: (softmax_kernel, (f32(4, 300, 700),), {}),
    "rmsnorm": lambda: (rmsnorm_kernel, (f32(5, 200, 700), f32(6, 700), 1e-6), {}),
    "layernorm": lambda: (layernorm_kernel, (bf16(7, 256, 1100), bf16(8, 1100), bf16(9, 1100), 1e-5), {}),
    "groupnorm": lambda: (groupnorm_kernel, (f32(10, 2, 64, 8, 8), f32(11, 64), f32(12, 64), 8), {}),
    "flash_fwd_causal": lambda: (flash_attention_fwd, (f32(13, 256, 64), f32(14, 384, 64), f32(15, 384, 64)), {"causal": True}),
    "flash_bwd": lambda: (flash_attention_bwd, (f32(16, 256, 64), f32(17, 256, 64), f32(18, 256, 64), f32(19, 256, 64),
                                                f32(20, 256, 64), f32(21, 256)), {"causal": True}),
    "reduce_sum": lambda: (reduce_kernel, (f32(22, 300, 900),), {"op": "sum"}),
    "log_softmax": lambda: (log_softmax_kernel, (f32(23, 200, 600),), {}),
    "conv2d": lambda: (conv2d_kernel, (f32(24, 1, 16, 12, 12), f32(25, 32, 16, 3, 3)), {"stride": 1, "padding": 1}),
    "unary_gelu": lambda: (unary_kernel, (f32(26, 300, 2000),), {"op": "gelu"}),
    "binary_rows": lambda: (binary_kernel, (f32(27, 300, 500), f32(28, 1, 500)), {"op": "add"}),
    "softmax_backward": lambda: (softmax_backward_kernel, (f32(29, 200, 300), f32(30, 200, 300)), {}),
    "layernorm_backward": lambda: (layernorm_backward_kernel, (f32(31, 200, 300), f32(32, 200, 300), f32(33, 200, 1),
                                                               f32(34, 200, 1), f32(35, 300)), {}),
    "fused_softmax": lambda: (fused_rows_kernel, (f32(36, 200, 384),), {"recipe": SOFTMAX, "shape": (200, 384)}),
    "fused_matmul_silu": lambda: (fused_matmul_kernel, (f32(37, 256, 200), f32(38, 256, 600), f32(39, 600)),
                                  {"recipe": MM_SILU}),
    "matmul_basic_reuse": lambda: (matmul_basic, (bf16(42, 1024, 512), bf16(43, 1024, 1024)), {}),
    "matmul_optimized_blocks": lambda: (matmul_optimized, (bf16(44, 2048, 512), bf16(45, 2048, 2048)),
                                        {"tiles_in_block_m": 2, "tiles_in_block_n": 2, "tiles_in_block_k": 4}),
    "flash_fwd_long": lambda: (flash_attention_fwd, (f32(46, 512, 128), f32(47, 2048, 128), f32(48, 2048, 128)), {}),
    "masked_tail_grid": lambda: (masked_tail_grid[2], (f32(40, 300, 128), f32(41, 300, 128)), {}),
}


def _value(v):
    if isinstance(v, View):
        return ["view", v.tensor.name, v.offset, [list(d) for d in v.dims]]
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple):
        return [_value(x) for x in v]
    return v


def fingerprint(program) -> str:
    """A hash of everything a traced Program holds that the simulator reads."""
    h = hashlib.sha256()

    def put(item):
        h.update(json.dumps(item, sort_keys=True).encode())
        h.update(b"\n")

    for t in program.tensors:
        put([t.name, t.memory.value, list(t.shape), t.dtype.name, t.start_partition, t.byte_offset]
            + ([t.core] if t.core else []))
    put(["inputs"] + [t.name for t in program.inputs] + ["outputs"] + [t.name for t in program.outputs])
    timing = static_timing(program)
    for inst in program.instructions:
        fields = {f.name: _value(getattr(inst, f.name)) for f in dataclasses.fields(inst)
                  if f.name not in ("source", "deps", "index") and not (f.name == "core" and not inst.core)}
        file, _, line = inst.source.rpartition(":")
        plan = timing.plans.get(inst.index)
        put([type(inst).__name__, fields, list(inst.deps), os.path.basename(file), line, inst.track,
             timing.tracks[inst.index], timing.costs[inst.index], dataclasses.astuple(plan) if plan else None])
    return h.hexdigest()


def trace(name):
    kernel, args, kwargs = CASES[name]()
    return nki.trace_program(kernel, *args, chip="trn2", **kwargs)


def test_fingerprints_cover_every_case():
    if os.environ.get("TRNSIM_REGENERATE"):
        STORED.write_text(json.dumps({name: [len(p := trace(name)), fingerprint(p)] for name in CASES}, indent=1) + "\n")
    assert sorted(json.loads(STORED.read_text())) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_program_matches_stored_fingerprint(name):
    program = trace(name)
    count, digest = json.loads(STORED.read_text())[name]
    assert len(program) == count
    assert fingerprint(program) == digest


def _every_dependency(monkeypatch):
    """Trace without cutting dependency sets to the latest instruction of each track."""
    from trnsim.nki.hazards import Hazards

    monkeypatch.setattr(Hazards, "latest", lambda self, indices: tuple(sorted(indices)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_latest_of_each_track_keeps_every_time(name, monkeypatch):
    """Dependencies cut to the latest instruction of each track schedule exactly as the
    full sets do: every start, end and cause is the same."""
    from trnsim.hw.core import schedule

    cut = schedule(trace(name))
    _every_dependency(monkeypatch)
    full_program = trace(name)
    full = schedule(full_program)
    assert cut.starts == full.starts
    assert cut.ends == full.ends
    assert cut.causes == full.causes
    assert sum(map(len, (i.deps for i in cut.program.instructions))) <= sum(map(len, (i.deps for i in full_program.instructions)))


@nki.jit
def reused_tiles(x):
    """Every iteration places its tiles where the iteration before freed its own."""
    n = x.shape[0] // 128
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for i in nl.sequential_range(n):
        a = nl.load(x[i * 128:(i + 1) * 128, :])
        b = nl.exp(a)
        c = nl.add(b, a)
        nl.store(out[i * 128:(i + 1) * 128, :], c)
    return out


def test_dependency_lists_do_not_grow_with_the_loop():
    """A tile space reused over a loop passes its earlier tenants on to the next tenant
    only through the latest access of each track: the longest dependency list of a
    kernel does not grow with its trip count past one per track (DMA queues rotate).
    Both trip counts wrap around SBUF (the tiles of 64 iterations fill it), so both reuse
    space."""
    longest = []
    for n in (256, 1024):
        program = nki.trace_program(reused_tiles, f32(50, 128 * n, 256), chip="trn2")
        longest.append(max(len(i.deps) for i in program.instructions))
        assert longest[-1] <= len({i.track for i in program.instructions})
    assert longest[0] == longest[1]
