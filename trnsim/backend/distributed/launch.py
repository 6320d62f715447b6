"""``trnsim run --nproc N``: a script on N ranks with torchrun, each rank traced, one merged trace.

:func:`run_job` starts ``torchrun --standalone --nproc-per-node N`` on this module,
which runs the unmodified script in each rank process under a :class:`trnsim.profile`
and writes the rank's trace into a job folder; when every rank has ended, the traces
are merged onto the shared clock (:func:`trnsim.trace.merge`) and reported
(:func:`trnsim.trace.report`: the job's figures, then collective time and exposed
communication per rank). Rank 0 shows progress on a terminal.
The instance (``--instance``), chip and fidelity reach the ranks through
``TRNSIM_INSTANCE``, ``TRNSIM_CHIP`` and ``TRNSIM_FIDELITY``.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

JOB_DIR = "TRNSIM_JOB_TRACE_DIR"


def _rank_name(rank: int, world: int) -> str:
    try:
        from trnsim.backend.distributed.timing import instance_name
        from trnsim.hw.fabric import Fabric

        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
        fabric = Fabric(instance_name(), world, nodes=max(1, -(-world // per_node)), nproc_per_node=per_node)
        p = fabric.place(rank)
        return f"rank {rank} (server {p.server}, chip {p.chip}, core {p.core})"
    except Exception:   # the name is a label: an unknown instance must not lose the trace
        return f"rank {rank}"


def rank_main(argv: list[str]) -> None:
    """Run ``argv[0]`` (with ``argv[1:]``) as ``__main__`` in this rank, traced."""
    import trnsim

    if not argv:
        raise SystemExit("usage: python -m trnsim.backend.distributed.launch script.py [args...]")
    script = argv[0]
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    out = os.environ.get(JOB_DIR)
    sys.argv = list(argv)
    sys.path.insert(0, str(Path(script).resolve().parent))
    from trnsim.backend.progress import Progress

    prof = trnsim.profile()
    prof.__enter__()
    try:
        with Progress() if rank == 0 else contextlib.nullcontext():   # one line for the job, on a terminal only
            runpy.run_path(script, run_name="__main__")
    finally:
        prof.__exit__(None, None, None)
        if out:
            trace = prof.trace()
            trace.process = _rank_name(rank, world)
            trace.meta["rank_name"] = trace.process
            from trnsim.trace.export import save

            save(trace, Path(out) / f"rank{rank}.json")


def run_job(script: str, args: list[str], nproc: int, trace: str | None, *, instance: str | None = None,
            chip: str | None = None, fidelity: str | None = None, timeout_s: float | None = None,
            nnodes: int | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None,
            top: int = 10) -> int:
    """Run ``script`` on ``nproc`` ranks (per node) with torchrun; returns its exit code.
    The merged trace goes to ``trace`` and its report (:func:`trnsim.trace.report`, with
    ``top`` ops) to standard output."""
    env = dict(os.environ)
    for key, value in (("TRNSIM_INSTANCE", instance), ("TRNSIM_CHIP", chip), ("TRNSIM_FIDELITY", fidelity)):
        if value:
            env[key] = value
    with tempfile.TemporaryDirectory(prefix="trnsim-job-") as tmp:
        env[JOB_DIR] = tmp
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
        if nnodes and nnodes > 1:
            cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank or 0}", f"--rdzv-endpoint={rdzv_endpoint}",
                    "--rdzv-backend=c10d"]
        else:
            cmd += ["--standalone"]
        cmd += ["-m", "trnsim.backend.distributed.launch", script, *args]
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
        paths = sorted(Path(tmp).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        if not paths:
            return rc
        from trnsim.trace import load, report
        from trnsim.trace.job import merge, save_job

        job = merge(paths, {"world_size": len(paths), "instance": env.get("TRNSIM_INSTANCE", "")})
        if trace:
            written = save_job(job, trace)
            print(report(load(written), top=top))   # as `trnsim report` will print it
            print(f"merged trace of {len(paths)} ranks: {written}")
        else:
            print(report(job, top=top))
    return rc


if __name__ == "__main__":
    rank_main(sys.argv[1:])
