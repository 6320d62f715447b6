"""TRL SFT on a Hugging Face TP x FSDP grid: simulated step time and collective share per rank.

Runs ``tests/dist_jobs/hf_tp_fsdp.py`` (a tiny Llama loaded with
``DistributedConfig(tp_size, fsdp_size)``, 3 fp32 ``SFTTrainer`` steps) under
``trnsim run --nproc tp*fsdp --instance ... --trace``, then reads each step's simulated
time (from ``torch.neuron.Event``) and, from the merged trace, each rank's time in ops
and in collectives during the 3 steps, and the collectives' share of the steps' span. Simulated times are exact; the host
wall time (printed too) depends on the machine's load.

    python benchmarks/hf_tp_fsdp.py                               # 2 x 16: 32 ranks, 8 trn2 chips
    python benchmarks/hf_tp_fsdp.py --tp 2 --fsdp 4 --instance trn2.48xlarge
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "dist_jobs" / "hf_tp_fsdp.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--fsdp", type=int, default=16)
    parser.add_argument("--instance", default="trn2.48xlarge")
    args = parser.parse_args()
    ranks = args.tp * args.fsdp
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRNSIM_DIST_TIMEOUT="1800")
    root = Path(tempfile.mkdtemp(prefix="hf_tp_fsdp_"))
    subprocess.run([sys.executable, str(JOB), "prepare", str(root)], env=env, check=True, capture_output=True)
    trace = root / "job.json"
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "trnsim.cli", "run", "--nproc", str(ranks), "--instance",
                          args.instance, "--trace", str(trace), str(JOB), "sft", str(root), "--tp", str(args.tp),
                          "--fsdp", str(args.fsdp)], env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if run.returncode:
        raise SystemExit(f"the {ranks}-rank job failed (exit {run.returncode}):\n{run.stderr[-4000:]}")

    print(f"SFTTrainer, tp {args.tp} x fsdp {args.fsdp} = {ranks} ranks on {args.instance}; "
          f"host wall {wall:.0f} s (this machine)")
    report(root, args.tp, args.fsdp)


def report(root: Path, tp: int, fsdp: int) -> None:
    """Print the losses, step times and each rank's compute and collective time in the steps."""
    import trnsim.trace as tt

    result = json.loads((root / f"sft-tp{tp}-fsdp{fsdp}-b2" / "result.json").read_text())
    job = tt.load(root / "job.json")
    first, last = result["step_spans_ns"][0][0], result["step_spans_ns"][-1][1]
    print(f"losses {[round(x, 4) for x in result['losses']]}")
    print("simulated step times: " + ", ".join(f"{ms * 1e3:.1f} us" for ms in result["step_ms"]))
    print(f"{'rank':>4} {'ops us':>9} {'collectives':>11} {'coll. us':>9} {'share':>6}   (of the 3 steps' "
          f"{(last - first) / 1e3:.1f} us)")
    for rank in range(job.world_size):
        inside = [s for s in job.ranks[rank].slices if s.start_ns >= first and s.end_ns <= last]
        ops = sum(s.dur_ns for s in inside if s.track == "ops")
        coll = [s for s in job.collectives(rank) if s.start_ns >= first and s.end_ns <= last]
        busy = sum(s.dur_ns for s in coll)
        print(f"{rank:4d} {ops / 1e3:9.1f} {len(coll):11d} {busy / 1e3:9.1f} {busy / (last - first):6.1%}")

if __name__ == "__main__":
    main()
