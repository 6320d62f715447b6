"""How fast the simulator itself runs: instructions simulated per host second.

Builds a pipelined program of growing size (per block: two loads on rotating DMA
queues, a matmul, an activation out of PSUM, a vector op, a reduction, a store;
buffers rotate with the dependencies that make reuse safe), then times
``run_timing`` (timing only) and ``simulate(..., fidelity="instruction")`` (timing
and numerics). Prints instructions per second at each size, and the ratio of
host time per instruction at the largest size to the smallest, which is 1.0 when
cost grows linearly with program size.

    python benchmarks/sim_speed.py            # sizes up to 200,000 instructions
    python benchmarks/sim_speed.py --quick    # up to 20,000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from trnsim import Program, dtypes
from trnsim.simulator import run_timing, simulate
from trnsim.isa import Activation, ActivationFunc, AluOp, Engine, TensorReduce, TensorScalar

RING = 4
QUEUES = 8
PER_BLOCK = 8


def pipeline(blocks: int, chip: str = "trn1") -> Program:
    """A program of ``blocks`` pipelined blocks of ``PER_BLOCK`` instructions each."""
    p = Program(chip, name=f"pipeline_{blocks}")
    a_hbm = p.hbm([128, 512], dtypes.bfloat16, "a", kind="input")
    w_hbm = p.hbm([128, 128], dtypes.bfloat16, "w", kind="input")
    out = p.hbm([blocks, 128, 512], dtypes.bfloat16, "out", kind="output")
    a = [p.sbuf([128, 512], dtypes.bfloat16, f"a{i}") for i in range(RING)]
    w = [p.sbuf([128, 128], dtypes.bfloat16, f"w{i}") for i in range(RING)]
    acc = [p.psum([128, 512], dtypes.float32, f"acc{i}") for i in range(RING)]
    act = [p.sbuf([128, 512], dtypes.float32, f"act{i}") for i in range(RING)]
    res = [p.sbuf([128, 512], dtypes.bfloat16, f"res{i}") for i in range(RING)]
    red = [p.sbuf([128, 1], dtypes.float32, f"red{i}") for i in range(RING)]
    last_use: list[tuple[int, ...]] = [()] * RING
    for b in range(blocks):
        r = b % RING
        q = (2 * b) % QUEUES
        la = p.dma(a[r], a_hbm, queue=q, deps=last_use[r])
        lw = p.dma(w[r], w_hbm, queue=q + 1, deps=last_use[r])
        mm = p.matmul(acc[r], w[r], a[r], deps=[la, lw])
        ex = p.add(Activation(act[r].view(), acc[r].view(), ActivationFunc.EXP, scale=0.01, engine=Engine.SCALAR, deps=(mm,)))
        sc = p.add(TensorScalar(res[r].view(), act[r].view(), AluOp.MULTIPLY, 0.5, engine=Engine.VECTOR, deps=(ex,)))
        rd = p.add(TensorReduce(red[r].view(), act[r].view(), engine=Engine.VECTOR, deps=(ex,)))
        st = p.dma(out[b], res[r], queue=(q + 2) % QUEUES, deps=[sc])
        last_use[r] = (st, rd)
    return p


def _rate(fn, n: int, repeats: int = 3) -> float:
    """Instructions per host second, best of ``repeats`` runs (the machine is shared and noisy)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return n / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="stop at 20,000 instructions")
    args = parser.parse_args()
    sizes = [200, 2_000, 20_000] if args.quick else [200, 2_000, 20_000, 200_000]
    run_timing(pipeline(8))  # import simpy and warm up outside the timed runs
    print(f"{'instructions':>12}  {'timing only (inst/s)':>21}  {'simulated time':>15}")
    per_inst = {}
    for blocks in (s // PER_BLOCK for s in sizes):
        prog = pipeline(blocks)
        n = len(prog)
        rate = _rate(lambda prog=prog: run_timing(prog), n)
        per_inst[n] = 1 / rate
        print(f"{n:>12,}  {rate:>21,.0f}  {run_timing(prog).time_ns / 1e3:>12,.1f} us")
    small, large = min(per_inst), max(per_inst)
    print(f"host time per instruction, {large:,} vs {small:,} instructions: "
          f"ratio {per_inst[large] / per_inst[small]:.2f} (1.00 = linear)")

    prog = pipeline(2_000 // PER_BLOCK)
    rng = np.random.default_rng(0)
    inputs = {"a": rng.standard_normal((128, 512), dtype=np.float32),
              "w": rng.standard_normal((128, 128), dtype=np.float32)}
    simulate(pipeline(8), inputs, fidelity="instruction")  # compile (or load cached) numba kernels
    timing = _rate(lambda: run_timing(prog), len(prog))
    numerics = _rate(lambda: simulate(prog, inputs, fidelity="instruction"), len(prog), repeats=1)
    print(f"with numerics ({len(prog):,} instructions): {numerics:,.0f} inst/s; "
          f"timing only / with numerics: ratio {timing / numerics:.1f}")


if __name__ == "__main__":
    main()
