"""Calibration against published hardware: the NKI matmul tutorial on one NC-v2 (trn1).

[4096, 8192] @ [8192, 8192] in bf16 (lhsT [8192, 4096], rhs [8192, 8192]). AWS
publishes 51.80 ms for the basic tiled kernel (about 11% of peak) and 6.97 ms for
the fully optimised one (about 85% of peak) (docs/hardware.md, "Published
measurements trnsim is checked against"). This script traces both kernels of trnsim/kernels/matmul.py,
times them on trn1 and prints the simulated latency, its ratio to the published
figure and the fraction of the tensor engine's peak; also the host seconds each
step took.

    python benchmarks/nki_matmul.py
"""

from __future__ import annotations

import time

import numpy as np

from trnsim import dtypes
from trnsim.simulator import run_timing
from trnsim.kernels.matmul import matmul_basic, matmul_optimized
from trnsim.nki import trace_program, typed

PUBLISHED_MS = {"matmul_basic": 51.80, "matmul_optimized": 6.97}
M, K, N = 4096, 8192, 8192


def calibrate(kernel, chip: str = "trn1") -> dict:
    """Trace and time ``kernel`` at the tutorial's size; returns the figures."""
    lhs_t = typed(np.empty((K, M), np.float32), dtypes.bfloat16)
    rhs = typed(np.empty((K, N), np.float32), dtypes.bfloat16)
    start = time.perf_counter()
    prog = trace_program(kernel, lhs_t, rhs, chip=chip)
    traced = time.perf_counter()
    run = run_timing(prog)
    done = time.perf_counter()
    summary = run.summary()
    return {"kernel": kernel.__name__, "instructions": len(prog), "ms": run.time_ns / 1e6,
            "pct_of_peak": summary.pct_of_peak, "tensor_busy": summary.busy_pct.get("tensor", 0.0),
            "trace_s": traced - start, "simulate_s": done - traced}


def main() -> None:
    print(f"{'kernel':<18} {'instructions':>12} {'simulated':>11} {'published':>10} {'ratio':>6} {'% of peak':>9} "
          f"{'trace s':>8} {'simulate s':>10}")
    for kernel in (matmul_basic, matmul_optimized):
        r = calibrate(kernel)
        pub = PUBLISHED_MS[r["kernel"]]
        print(f"{r['kernel']:<18} {r['instructions']:>12,} {r['ms']:>8.2f} ms {pub:>7.2f} ms {r['ms'] / pub:>6.3f} "
              f"{r['pct_of_peak']:>8.1f}% {r['trace_s']:>8.1f} {r['simulate_s']:>10.1f}")


if __name__ == "__main__":
    main()
