"""PyTorch's DDP and FSDP2 tutorials, written for CUDA with the device named ``neuron``,
run under torchrun on 2 ranks (tests/dist_jobs/tutorial_*.py) and again on the CPU with
gloo: the losses of every rank agree within 1e-5 (relative), every parameter moved as
far as on the CPU, and checkpoints restart training where it stopped, on ``neuron`` and
on the CPU."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from trnsim.testing.procs import run_session, with_repo_on_path

JOBS = Path(__file__).parent / "dist_jobs"
REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120
NPROC = 2
RTOL = 1e-5


def run_job(script: str, out: Path, *args: str) -> dict[int, dict]:
    """Run ``tests/dist_jobs/<script> <device> out args`` on 2 ranks; each rank's results
    (the ``rank<R>.json`` it writes into ``out``)."""
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}",
           str(JOBS / script), out.name, str(out), *args]
    r = run_session(cmd, timeout=TIMEOUT_S, env=with_repo_on_path(REPO), cwd=REPO)
    # ranks print concurrently: one rank's line may run into another's
    finished = sorted(int(x) for x in re.findall(rf"rank (\d+): {script.removesuffix('.py')} ok", r.stdout))
    assert r.returncode == 0 and finished == list(range(NPROC)), (
        f"{script} {out.name}: exit {r.returncode}, ranks finished {finished}\n"
        f"{r.stdout[-4000:]}\n{r.stderr[-6000:]}")
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in range(NPROC)}


def close(what: str, got: list[float], want: list[float]) -> None:
    assert len(got) == len(want) and all(abs(a - b) <= RTOL * abs(b) for a, b in zip(got, want)), (
        f"{what}: {got} != {want}")


def check_moved(what: str, got: dict[str, float], want: dict[str, float]) -> None:
    """Every parameter moved as far as on the CPU, and the CPU's run moved some."""
    assert sum(want.values()) > 0, f"{what}: no weight moved on the CPU"
    frozen = [n for n, m in want.items() if m > 0 and got[n] == 0]
    assert not frozen, f"{what}: parameters {frozen} did not move on neuron, as they did on the CPU"
    for n, m in want.items():
        assert abs(got[n] - m) <= RTOL * m, f"{what}: {n} moved {got[n]} on neuron, {m} on the CPU"


def test_ddp_tutorial_with_unused_parameters_pinned_batches_and_checkpoint(tmp_path):
    dev = run_job("tutorial_ddp.py", tmp_path / "neuron")
    cpu = run_job("tutorial_ddp.py", tmp_path / "cpu")
    for rank in range(NPROC):
        close(f"rank {rank} losses", dev[rank]["losses"], cpu[rank]["losses"])
        check_moved(f"rank {rank}", dev[rank]["moved"], cpu[rank]["moved"])
        assert dev[rank]["moved"]["unused.weight"] == 0.0   # the branch forward never uses


def test_fsdp2_tutorial_meta_init_dcp_restart_and_cpu_resume(tmp_path):
    dev = run_job("tutorial_fsdp2.py", tmp_path / "neuron")
    # the CPU run also restarts from the neuron run's checkpoint
    cpu = run_job("tutorial_fsdp2.py", tmp_path / "cpu", str(tmp_path / "neuron" / "checkpoint"))
    for rank in range(NPROC):
        want = cpu[rank]["losses"]
        close(f"rank {rank}: meta init on neuron vs CPU-made on the CPU", dev[rank]["losses"], want)
        check_moved(f"rank {rank}", dev[rank]["moved"], cpu[rank]["moved"])
        after_save = dev[rank]["losses"][-len(dev[rank]["restart"]):]
        close(f"rank {rank}: restart from the DCP checkpoint on neuron", dev[rank]["restart"], after_save)
        close(f"rank {rank}: restart on the CPU from the neuron checkpoint", cpu[rank]["resumed"], after_save)
        close(f"rank {rank}: CPU-made model sharded onto neuron", dev[rank]["cpu_made"], want)
