"""The parallelism APIs on ``neuron``, run as real torchrun jobs (tests/dist_jobs/).

Each job checks itself against one process and exits non-zero when a check fails;
here it runs under ``torchrun --standalone`` with a bounded time, in its own session,
killed whole (launcher and ranks) when it overruns, so no process outlives its test.
The 2-rank jobs and the 4-rank mesh job (the 2-D mesh needs 4 ranks) run by default;
the 4-rank training jobs (and FSDP2 with TP on a 2 x 2 mesh) are behind ``-m slow``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from trnsim.testing.procs import run_session, with_repo_on_path

JOBS = Path(__file__).parent / "dist_jobs"
REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 280   # under pytest's own 300 s per test


def torchrun(script: str, nproc: int) -> subprocess.CompletedProcess:
    """Run ``tests/dist_jobs/<script>`` on ``nproc`` ranks; fail the test if it overruns."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           str(JOBS / script)]
    return run_session(cmd, timeout=TIMEOUT_S, env=with_repo_on_path(REPO), cwd=REPO)


def check_job(script: str, nproc: int) -> str:
    """Run the job and check every rank finished its checks; returns its stdout."""
    r = torchrun(script, nproc)
    # ranks print concurrently: one rank's line may run into another's
    finished = sorted(int(x) for x in re.findall(rf"rank (\d+): {script.removesuffix('.py')} ok", r.stdout))
    assert r.returncode == 0 and finished == list(range(nproc)), (
        f"{script} on {nproc} ranks: exit {r.returncode}, ranks finished {finished}\n"
        f"{r.stdout[-4000:]}\n{r.stderr[-6000:]}")
    return r.stdout


@pytest.mark.parametrize("nproc", [2, 4])
def test_device_mesh_and_dtensor(nproc):
    check_job("mesh_dtensor.py", nproc)


def test_tensor_parallel_trains_as_one_process_and_compiles():
    check_job("tensor_parallel.py", 2)


def test_ddp_trains_as_one_process():
    check_job("ddp.py", 2)


def test_fsdp2_trains_as_one_process_with_sharded_memory():
    check_job("fsdp2.py", 2)


def test_compiled_blocks_in_fsdp2_and_compiled_ddp_train_as_one_process():
    check_job("compiled_parallel.py", 2)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["tensor_parallel.py", "ddp.py", "fsdp2.py", "fsdp_tp_2d.py"])
def test_training_on_4_ranks(script):
    check_job(script, 4)
