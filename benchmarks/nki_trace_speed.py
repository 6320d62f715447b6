"""How fast kernels trace: instructions per host second from kernel code to a Program.

Traces the NKI matmul tutorial kernel (``matmul_basic`` of trnsim/kernels/matmul.py,
bf16 lhsT [K, M] and rhs [K, N]) at three sizes, the largest the tutorial's own
[4096, 8192] x [8192, 8192] (132,096 instructions), and prints instructions traced
per second at each (tracing includes the Program's checks and static costing of
every instruction). Then the whole pipeline for the tutorial size: trace, then
simulate at timing fidelity, in host seconds. The ratio of host time per
instruction at the largest size to the smallest is 1.0 when tracing is linear.

``--before <git-rev>`` also measures that revision of trnsim (extracted with ``git
archive`` into a temporary directory and run in a subprocess with PYTHONPATH set to
it), so one run prints before, after and their ratio: the machine is noisy, so
compare figures measured side by side. Times are the process's CPU seconds
(``time.process_time``), the same as wall seconds on an idle machine but far
less disturbed by other work sharing it.

    python benchmarks/nki_trace_speed.py
    python benchmarks/nki_trace_speed.py --before HEAD~3
    python benchmarks/nki_trace_speed.py --quick      # the two smaller sizes only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# (M, K, N) of matmul_basic: it traces (M/128)(N/512)(4K/128 + 2) instructions
SIZES = {"small": (1024, 2048, 2048), "medium": (2048, 4096, 4096), "tutorial": (4096, 8192, 8192)}


def _args(m: int, k: int, n: int) -> tuple:
    import numpy as np

    from trnsim import dtypes
    from trnsim.nki import typed

    return typed(np.empty((k, m), np.float32), dtypes.bfloat16), typed(np.empty((k, n), np.float32), dtypes.bfloat16)


def measure(names: list[str], repeats: int) -> dict:
    """Trace each size (best of ``repeats``; the tutorial size once) and time the pipeline
    of the largest size measured; returns the figures as a dict."""
    import trnsim
    from trnsim.simulator import simulate
    from trnsim.kernels.matmul import matmul_basic
    from trnsim.nki import trace_program

    trace_program(matmul_basic, *_args(128, 128, 512), chip="trn1")  # imports and chip files, outside the timings
    out: dict = {"trnsim": str(Path(trnsim.__file__).parent), "sizes": {}}
    for name in names:
        args = _args(*SIZES[name])
        best = float("inf")
        for _ in range(1 if name == "tutorial" else repeats):
            start = time.process_time()
            prog = trace_program(matmul_basic, *args, chip="trn1")
            best = min(best, time.process_time() - start)
        out["sizes"][name] = {"instructions": len(prog), "trace_s": best}
    start = time.process_time()
    run = simulate(prog, fidelity="timing")
    out["pipeline"] = {"size": names[-1], "trace_s": best, "simulate_s": time.process_time() - start,
                       "simulated_ms": run.time_ns / 1e6}
    return out


def measure_revision(rev: str, names: list[str], repeats: int) -> dict:
    """:func:`measure` on trnsim as it was at git revision ``rev``."""
    with tempfile.TemporaryDirectory(prefix="trnsim-before-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "trnsim"], capture_output=True, check=False)
        if archive.returncode:
            raise SystemExit(f"git archive {rev} failed: {archive.stderr.decode().strip()}")
        tar_path = Path(tmp) / "tree.tar"
        tar_path.write_bytes(archive.stdout)
        with tarfile.open(tar_path) as tar:
            tar.extractall(tmp, filter="data")
        env = {**os.environ, "PYTHONPATH": tmp}
        cmd = [sys.executable, __file__, "--json", "--repeats", str(repeats), "--sizes", ",".join(names)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"measuring {rev} failed:\n{done.stderr}")
        return json.loads(done.stdout)


def _rate(fig: dict) -> float:
    return fig["instructions"] / fig["trace_s"]


def report(after: dict, before: dict | None, rev: str | None) -> None:
    names = list(after["sizes"])
    head = f"{'size':<9} {'instructions':>12} {'trace s':>8} {'inst/s':>9}"
    if before:
        head += f"  {'before s':>8} {'before inst/s':>13} {'speedup':>7}"
    print(f"tracing matmul_basic (trn1, bf16); after = {after['trnsim']}" + (f", before = {rev}" if rev else ""))
    print(head)
    for name in names:
        a = after["sizes"][name]
        line = f"{name:<9} {a['instructions']:>12,} {a['trace_s']:>8.2f} {_rate(a):>9,.0f}"
        if before:
            b = before["sizes"][name]
            line += f"  {b['trace_s']:>8.2f} {_rate(b):>13,.0f} {b['trace_s'] / a['trace_s']:>6.1f}x"
        print(line)
    first, last = after["sizes"][names[0]], after["sizes"][names[-1]]
    print(f"host time per instruction, {names[-1]} / {names[0]}: {_rate(first) / _rate(last):.2f} (1.00 is linear)")
    p = after["pipeline"]
    total = p["trace_s"] + p["simulate_s"]
    print(f"pipeline at {p['size']} size: trace {p['trace_s']:.2f} s + simulate (timing) {p['simulate_s']:.2f} s "
          f"= {total:.2f} s (simulated {p['simulated_ms']:.2f} ms)")
    if before:
        q = before["pipeline"]
        was = q["trace_s"] + q["simulate_s"]
        print(f"  before: trace {q['trace_s']:.2f} s + simulate {q['simulate_s']:.2f} s = {was:.2f} s "
              f"(simulated {q['simulated_ms']:.2f} ms); {was / total:.1f}x faster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="GIT_REV", help="also measure this revision, for a before/after ratio")
    parser.add_argument("--quick", action="store_true", help="only the small and medium sizes")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many traces (the tutorial size: one)")
    parser.add_argument("--sizes", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = args.sizes.split(",") if args.sizes else (["small", "medium"] if args.quick else list(SIZES))
    if args.json:
        print(json.dumps(measure(names, args.repeats)))
        return
    before = measure_revision(args.before, names, args.repeats) if args.before else None
    after = measure(names, args.repeats)
    report(after, before, args.before)


if __name__ == "__main__":
    main()
