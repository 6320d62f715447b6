"""The main job: a tiled bf16 matmul Program, simulated at instruction fidelity.

``C[M, N] = lhsT.T @ rhs`` with ``lhsT`` [K, M] and ``rhs`` [K, N] in HBM (the
layout of the NKI matmul tutorial: the contraction dimension on partitions).
Both operands are brought into SBUF once, spread over several DMA queues; each
[128, 512] output tile accumulates K/128 matmuls in one PSUM bank, the vector
engine copies it out to SBUF and a DMA writes it to HBM. PSUM banks rotate so
the tensor engine streams the next tile while the vector engine drains the last,
and output tiles rotate through a few SBUF buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trnsim import dtypes
from trnsim.errors import ProgramError
from trnsim.isa import Engine, Program, TensorCopy

TILE_K = 128
TILE_M = 128
TILE_N = 512
DMA_QUEUES = 8
PSUM_TILES = 4
OUT_TILES = 4


def tiled_matmul(m: int, k: int, n: int, chip: object = None, dtype: object = dtypes.bfloat16) -> Program:
    """A Program computing ``out[m, n] = lhsT[k, m].T @ rhs[k, n]`` in fp32.

    ``lhsT``, ``rhs`` (HBM, ``dtype``) and ``out`` (HBM, fp32) are the program's
    input and output tensors; the whole of both inputs must fit in SBUF.
    """
    for name, size, tile in (("m", m, TILE_M), ("k", k, TILE_K), ("n", n, TILE_N)):
        if size <= 0 or size % tile:
            raise ProgramError(f"tiled_matmul: {name}={size} must be a positive multiple of {tile}")
    prog = Program(chip, name=f"matmul_{m}x{k}x{n}_{dtypes.as_dtype(dtype).name}")
    lhs_t = prog.hbm([k, m], dtype, "lhsT", kind="input")
    rhs = prog.hbm([k, n], dtype, "rhs", kind="input")
    out = prog.hbm([m, n], dtypes.float32, "out", kind="output")
    kt, mt, nt = k // TILE_K, m // TILE_M, n // TILE_N

    queue = 0

    def next_queue() -> int:
        nonlocal queue
        queue = (queue + 1) % DMA_QUEUES
        return queue

    lhs_tiles, rhs_tiles = [], []
    for ki in range(kt):
        rows = slice(ki * TILE_K, (ki + 1) * TILE_K)
        a = prog.sbuf([TILE_K, m], dtype, f"lhsT_{ki}")
        b = prog.sbuf([TILE_K, n], dtype, f"rhs_{ki}")
        lhs_tiles.append((a, prog.dma(a, lhs_t[rows, :], queue=next_queue())))
        rhs_tiles.append((b, prog.dma(b, rhs[rows, :], queue=next_queue())))

    banks = [prog.psum([TILE_M, TILE_N], dtypes.float32, f"acc_{i}") for i in range(PSUM_TILES)]
    bank_drained: list[int | None] = [None] * PSUM_TILES
    outs = [prog.sbuf([TILE_M, TILE_N], dtypes.float32, f"out_{i}") for i in range(OUT_TILES)]
    out_stored: list[int | None] = [None] * OUT_TILES
    tile = 0
    for mi in range(mt):
        cols = slice(mi * TILE_M, (mi + 1) * TILE_M)
        for ni in range(nt):
            span = slice(ni * TILE_N, (ni + 1) * TILE_N)
            acc = banks[tile % PSUM_TILES]
            last = None
            for ki in range(kt):
                a, load_a = lhs_tiles[ki]
                b, load_b = rhs_tiles[ki]
                deps = [load_a, load_b]
                if ki == 0 and bank_drained[tile % PSUM_TILES] is not None:
                    deps.append(bank_drained[tile % PSUM_TILES])
                last = prog.matmul(acc, a[:, cols], b[:, span], accumulate=ki > 0, deps=deps)
            res = outs[tile % OUT_TILES]
            before = out_stored[tile % OUT_TILES]
            copy = prog.add(TensorCopy(res.view(), acc.view(), engine=Engine.VECTOR,
                                       deps=(last,) if before is None else (last, before)))
            bank_drained[tile % PSUM_TILES] = copy
            out_stored[tile % OUT_TILES] = prog.dma(out[cols, span], res, queue=next_queue(), deps=[copy])
            tile += 1
    return prog


@dataclass
class DemoResult:
    """The run, its check against numpy, and where its trace went."""

    run: Any
    max_abs_error: float
    reference_scale: float
    trace_path: str


def run_demo(m: int = 1024, k: int = 1024, n: int = 1024, chip: object = None, trace: str = "traces/demo.json",
             seed: int = 0) -> DemoResult:
    """Build, simulate (instruction fidelity) and check the tiled matmul; write its trace."""
    from trnsim.compute import decode, encode
    from trnsim.hw.core import simulate

    prog = tiled_matmul(m, k, n, chip)
    rng = np.random.default_rng(seed)
    lhs_t = rng.standard_normal((k, m), dtype=np.float32)
    rhs = rng.standard_normal((k, n), dtype=np.float32)
    run = simulate(prog, {"lhsT": lhs_t, "rhs": rhs}, fidelity="instruction", trace=trace)
    # The reference multiplies the same bf16-rounded inputs in float64.
    a = decode(encode(lhs_t.astype(np.float64), dtypes.bfloat16), dtypes.bfloat16)
    b = decode(encode(rhs.astype(np.float64), dtypes.bfloat16), dtypes.bfloat16)
    expected = a.T @ b
    err = float(np.max(np.abs(run.outputs["out"] - expected)))
    return DemoResult(run, err, float(np.max(np.abs(expected))), trace)
