"""The neuron process group run for real: torchrun jobs of 2 and 4 ranks, traces, faults.

Every job runs in its own session with a bounded time and is killed whole (launcher and
ranks) if it overruns, so no process outlives its test.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trnsim.testing.procs import descendants, kill_session, run_session, with_repo_on_path

JOBS = Path(__file__).parent / "dist_jobs"
REPO = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    return with_repo_on_path(REPO, **extra)


def _run(cmd: list[str], timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a new session; on timeout kill the session and fail."""
    return run_session(cmd, timeout=timeout, env=_env(**env), cwd=REPO)


def torchrun(script: str, nproc: int, *args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                 str(JOBS / script), *args], timeout=timeout, **env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(script: str, world: int, *args: str, timeout: float = 120) -> list[tuple[int, str, float]]:
    """Start ``world`` rank processes directly (no torchrun agent to kill the others), wait
    for all; returns each rank's exit code, stderr and seconds to exit."""
    port = _free_port()
    procs = []
    start = time.monotonic()
    for rank in range(world):
        env = _env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(JOBS / script), *args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env, start_new_session=True))
    results = []
    try:
        for p in procs:
            left = max(1.0, timeout - (time.monotonic() - start))
            _, err = p.communicate(timeout=left)
            results.append((p.returncode, err, time.monotonic() - start))
    finally:
        for p in procs:
            kill_session(p)
            p.wait()
    return results


@pytest.mark.parametrize("nproc", [2, 4])
def test_every_collective_matches_one_process(nproc):
    r = torchrun("collectives.py", nproc)
    assert r.returncode == 0, r.stderr[-4000:]
    # ranks print at once, so lines may interleave: count whole messages
    assert "FAIL" not in r.stdout, r.stdout
    # fp32, bf16 and int64 for every reduction, gather and scatter, on every rank
    for dtype in ("float32", "bfloat16", "int64"):
        for what in ("all_reduce sum", "all_reduce max", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"):
            assert r.stdout.count(f"{what} torch.{dtype}: ok") == nproc, (what, dtype, r.stdout)
    for what in ("all_to_all_single uneven", "scatter", "async", "premul", "functional", "all_to_all list",
                 "reduce_scatter list", "all_reduce_coalesced", "batch_isend_irecv", "all_gather_object"):
        assert r.stdout.count(f"{what}: ok") >= nproc, (what, r.stdout)


def test_trnsim_run_merges_rank_traces(tmp_path):
    trace = tmp_path / "job.json"
    r = _run([sys.executable, "-m", "trnsim.cli", "run", "--nproc", "2", "--trace", str(trace),
              str(JOBS / "allreduce_step.py")])
    assert r.returncode == 0, r.stderr[-4000:]
    assert "allreduce_step: 2 ranks agree" in r.stdout
    assert "rank 1 (server 0, chip 0, core 1)" in r.stdout
    import trnsim.trace as tt

    job = tt.load(trace)
    assert isinstance(job, tt.JobTrace) and job.world_size == 2
    for rank in range(2):
        coll = job.collectives(rank)
        assert [s.name for s in coll] == ["all_reduce", "all_reduce", "barrier"]
        for s in coll:
            assert {"algorithm", "bytes", "participants", "bus_bandwidth_GBps"} <= set(s.args)
        assert coll[0].args["bytes"] == 256 * 256 * 4 and coll[0].args["participants"] == [0, 1]
    # the ranks meet: each collective starts at the same time on both
    starts = [[s.start_ns for s in job.collectives(rank)] for rank in range(2)]
    assert starts[0] == starts[1]
    report = _run([sys.executable, "-m", "trnsim.cli", "report", str(trace)])
    assert report.returncode == 0 and "rank 0 (server 0, chip 0, core 0)" in report.stdout


def test_a_slow_rank_delays_the_collective_and_async_ones_overlap_compute(tmp_path):
    trace = tmp_path / "overlap.json"
    r = _run([sys.executable, "-m", "trnsim.cli", "run", "--nproc", "2", "--trace", str(trace),
              str(JOBS / "overlap.py")])
    assert r.returncode == 0, r.stderr[-4000:]
    import trnsim.trace as tt

    job = tt.load(trace)
    ops = [[s for s in t.slices if s.track == "ops"] for t in job.ranks]
    coll = [job.collectives(rank) for rank in range(2)]
    # the first all-reduce starts together, after the slow rank's last matmul
    assert coll[0][0].start_ns == coll[1][0].start_ns
    slow_matmuls = [s for s in ops[1] if s.name.startswith("mm") and s.end_ns <= coll[1][0].start_ns]
    assert len(slow_matmuls) == 5
    fast_matmuls = [s for s in ops[0] if s.name.startswith("mm") and s.end_ns <= coll[0][0].start_ns]
    assert len(fast_matmuls) == 1 and fast_matmuls[0].end_ns < coll[0][0].start_ns
    for rank in range(2):
        second = coll[rank][1]
        mm = [s for s in ops[rank] if s.name.startswith("mm") and s.start_ns >= coll[rank][0].end_ns]
        add = [s for s in ops[rank] if s.name.startswith("add") and s.start_ns >= coll[rank][0].end_ns]
        assert mm and mm[0].start_ns < second.end_ns           # the matmul ran during the all-reduce
        assert add and add[-1].start_ns >= second.end_ns - 1e-6   # the add waited for it (ns, float sums)
    # each collective names the last rank to arrive and how long it kept this one
    assert [coll[r][0].args["last_rank"] for r in range(2)] == [1, 1]
    fast_ready = max(s.end_ns for s in ops[0] if s.end_ns <= coll[0][0].start_ns)
    assert coll[1][0].args["waited_ns"] == 0.0 and coll[0][0].args["waited_ns"] >= coll[0][0].start_ns - fast_ready - 1e-3
    # and rank 0's critical path says it waited on rank 1 there
    path = tt.critical_path(job).where(rank=0, track="collectives")
    assert (path[0]["waited_on"], path[0]["on"]) == ("rank", "rank 1")
    assert path[0]["idle_ns"] == coll[0][0].args["waited_ns"]


def test_timing_fidelity_job_is_deterministic(tmp_path):
    times = []
    for n in range(2):
        trace = tmp_path / f"t{n}.json"
        r = _run([sys.executable, "-m", "trnsim.cli", "run", "--nproc", "2", "--fidelity", "timing",
                  "--instance", "trn1.32xlarge", "--trace", str(trace), str(JOBS / "timing_step.py")])
        assert r.returncode == 0, r.stderr[-4000:]
        import trnsim.trace as tt

        job = tt.load(trace)
        times.append([[(s.name, s.start_ns, s.dur_ns) for s in job.collectives(rank)] for rank in range(2)])
    assert times[0] == times[1]
    assert [name for name, _, _ in times[0][0]] == ["all_reduce", "reduce_scatter", "all_gather"] * 2 + ["barrier"]


def test_a_killed_rank_is_named_by_the_others():
    results = _ranks("faults.py", 4, "kill", timeout=90)
    for rank, (rc, err, seconds) in enumerate(results):
        if rank == 2:
            assert rc == -signal.SIGKILL
            continue
        assert rc != 0, f"rank {rank} did not fail"
        assert "rank 2 (pid" in err, f"rank {rank}: {err[-2000:]}"
        assert seconds < 60


def test_mismatched_collectives_are_reported_not_hung():
    results = _ranks("faults.py", 2, "mismatch", timeout=90)
    for rank, (rc, err, _) in enumerate(results):
        assert rc != 0, f"rank {rank} did not fail"
        assert "collective mismatch" in err and "all_reduce(float32, 32 bytes, sum)" in err \
            and "broadcast(float32, 32 bytes, root 0)" in err, f"rank {rank}: {err[-2000:]}"


def test_two_torchrun_launchers_make_one_job(tmp_path):
    """torchrun's multi-node launch, two launchers on this machine as two nodes."""
    port = _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=trnsim-test",
           str(JOBS / "allreduce_step.py")]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                              start_new_session=True, cwd=REPO) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            kill_session(p)
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert any("allreduce_step: 2 ranks agree" in o[0] for o in outs)


@pytest.mark.parametrize("stat, running", [
    (b"4242 (python x) S 1 4242 4242 0 -1 4194560 532 0 0 0", True),
    (b"4242 (python x) Z 1 4242 4242 0 -1 4194564 532 0 0 0", False),
    # killed: exiting (PF_EXITING), its sockets already closed, not yet a zombie
    (b"4242 (python x) R 1 4242 4242 0 -1 4194564 532 0 0 0", False),
    (b"4242 (a) b) D 1 4242 4242 0 -1 4194304 532 0 0 0", True),
    (b"garbled", True),
])
def test_a_process_that_has_begun_to_exit_counts_as_lost(stat, running):
    """A peer's dead socket can be seen before the killed process is a zombie: a rank
    counts as lost as soon as it has begun to exit, so the others name it."""
    from trnsim.backend.distributed.faults import _running

    assert _running(stat) is running


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] not in (b"Z", b"X")


def test_kill_session_kills_workers_in_sessions_of_their_own():
    """torchrun's agent starts its workers in new sessions (so do ``accelerate launch`` and
    ``trl``, which run it): killing the launcher's process group alone would leave them
    running. kill_session kills every descendant of the launcher too."""
    launcher = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import subprocess, sys, time; subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(120)\"],"
        " start_new_session=True); time.sleep(120)'], start_new_session=True)\n"
        "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = descendants(proc.pid)
        assert len(workers) == 2, workers
        kill_session(proc)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(_alive, workers)), [w for w in workers if _alive(w)]
    finally:
        kill_session(proc)
