"""Collectives on the simulated fabric, and what a many-rank job costs the host.

Part 1 (always): simulated all-reduce and all-gather time and bus bandwidth against
message size (1 KiB to 1 GiB) for 2, 8, 32 and 64 ranks on trn1.32xlarge and
trn2.48xlarge, from the fabric model (:mod:`trnsim.hw.fabric`), with the algorithm it
picks at each size. The ratio column is the bus bandwidth over the largest size's:
near 0 where a collective is latency-bound, 1.0 where it reaches the links' limit.
Simulated time is deterministic, so these figures are exact.

Part 2 (``--job N``): host wall time and peak host memory (summed proportional set
size of every process of the job, sampled twice a second) of an N-rank job in
``timing`` fidelity (tests/dist_jobs/timing_step.py under ``trnsim run --nproc N``),
beside a 2-rank job measured in the same run, and their ratio.

    python benchmarks/distributed.py
    python benchmarks/distributed.py --job 64 --instance trn2.48xlarge
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = [1 << k for k in range(10, 31, 4)]   # 1 KiB, 16 KiB, ... 1 GiB
RANKS = (2, 8, 32, 64)
INSTANCES = ("trn1.32xlarge", "trn2.48xlarge")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def sweep() -> None:
    from trnsim.hw.fabric import Fabric, instance

    for name in INSTANCES:
        per_server = instance(name).cores_per_server
        for kind in ("all_reduce", "all_gather"):
            print(f"\n{kind} on {name} ({per_server} logical cores per server; more ranks take more servers, "
                  "joined by EFA; simulated, bus bandwidth in GB/s)")
            print(f"{'ranks':>5} {'size':>8} {'time us':>12} {'algorithm':>10} {'bus GB/s':>9} {'of largest':>10}")
            for ranks in RANKS:
                fabric = Fabric(name, ranks, nodes=-(-ranks // per_server))
                rows = [(size, fabric.estimate(kind, size)) for size in SIZES]
                top = rows[-1][1].bus_bw_gbps or 1.0
                for size, t in rows:
                    print(f"{ranks:5d} {_size(size):>8} {t.duration_ns / 1e3:12.2f} {t.algorithm:>10} "
                          f"{t.bus_bw_gbps:9.1f} {t.bus_bw_gbps / top:10.3f}")


def _job_pids(root: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(root)], capture_output=True, text=True).stdout.split()
    pids = [int(p) for p in out]
    for p in list(pids):
        pids += _job_pids(p)
    return pids


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def job(nproc: int, instance: str) -> tuple[float, float]:
    """Host seconds and peak MiB of an ``nproc``-rank timing job."""
    cmd = [sys.executable, "-m", "trnsim.cli", "run", "--nproc", str(nproc), "--fidelity", "timing",
           "--instance", instance, "--no-trace", str(REPO / "tests" / "dist_jobs" / "timing_step.py")]
    env = dict(os.environ, TRNSIM_DIST_TIMEOUT="1800", PYTHONPATH=str(REPO))
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = [0]

    def watch() -> None:
        while proc.poll() is None:
            pids = [proc.pid, *_job_pids(proc.pid)]
            peak[0] = max(peak[0], sum(_pss_kib(p) for p in pids))
            time.sleep(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    rc = proc.wait()
    watcher.join()
    if rc:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {rc}")
    return time.monotonic() - start, peak[0] / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", type=int, default=0, help="also run a timing job of this many ranks")
    parser.add_argument("--instance", default="trn2.48xlarge")
    args = parser.parse_args()
    sweep()
    if args.job:
        small_s, small_mib = job(2, args.instance)
        big_s, big_mib = job(args.job, args.instance)
        print(f"\ntiming-fidelity job on {args.instance} (host figures, this machine)")
        print(f"{'ranks':>5} {'wall s':>8} {'peak MiB':>9} {'MiB/rank':>9}")
        print(f"{2:5d} {small_s:8.1f} {small_mib:9.0f} {small_mib / 2:9.0f}")
        print(f"{args.job:5d} {big_s:8.1f} {big_mib:9.0f} {big_mib / args.job:9.0f}")
        print(f"ratio {args.job} ranks / 2 ranks: wall {big_s / small_s:.1f}x, memory {big_mib / small_mib:.1f}x")


if __name__ == "__main__":
    main()
