"""``trnsim run --nproc N``: a script on N ranks with torchrun, each rank traced, one merged trace.

:func:`run_job` starts ``torchrun --standalone --nproc-per-node N`` on this module,
which runs the unmodified script in each rank process under a :class:`trnsim.profile`
and writes the rank's trace into a job folder; when every rank has ended, the traces
are merged onto the shared clock (:func:`trnsim.trace.merge`) and summarised per rank.
The instance (``--instance``), chip and fidelity reach the ranks through
``TRNSIM_INSTANCE``, ``TRNSIM_CHIP`` and ``TRNSIM_FIDELITY``.
"""

from __future__ import annotations

import os
import runpy
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
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
    prof = trnsim.profile()
    prof.__enter__()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        prof.__exit__(None, None, None)
        if out:
            trace = prof.trace()
            trace.process = _rank_name(rank, world)
            trace.meta["rank_name"] = trace.process
            from trnsim.trace.export import save

            save(trace, Path(out) / f"rank{rank}.json")


@dataclass(frozen=True)
class RankSummary:
    """One rank's figures from the merged trace (nanoseconds)."""

    rank: int
    name: str
    busy_ns: float
    collective_ns: float
    exposed_ns: float
    collectives: int


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def summarize_job(job: object) -> list[RankSummary]:
    """Per rank: time with ops or collectives running, collective time, and the part of
    it no op overlapped (exposed communication)."""
    rows = []
    for rank, t in enumerate(job.ranks):
        ops = _union([(s.start_ns, s.end_ns) for s in t.slices if s.track == "ops"])
        coll = _union([(s.start_ns, s.end_ns) for s in t.slices if s.track == "collectives"])
        overlap = 0.0
        for a, b in coll:
            for c, d in ops:
                overlap += max(0.0, min(b, d) - max(a, c))
        rows.append(RankSummary(rank, t.process, _length(_union(ops + coll)), _length(coll), _length(coll) - overlap,
                                sum(1 for s in t.slices if s.track == "collectives")))
    return rows


def format_summary(rows: list[RankSummary], total_ns: float) -> str:
    width = max([10] + [len(r.name) for r in rows])
    lines = [f"{'rank':{width}} {'busy us':>12} {'collective us':>14} {'exposed us':>12} {'collectives':>12}"]
    for r in rows:
        lines.append(f"{r.name:{width}} {r.busy_ns / 1e3:12.3f} {r.collective_ns / 1e3:14.3f} {r.exposed_ns / 1e3:12.3f} "
                     f"{r.collectives:12d}")
    lines.append(f"job: {len(rows)} ranks, {total_ns / 1e3:.3f} us of simulated time")
    return "\n".join(lines)


def run_job(script: str, args: list[str], nproc: int, trace: str | None, *, instance: str | None = None,
            chip: str | None = None, fidelity: str | None = None, timeout_s: float | None = None,
            nnodes: int | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None) -> int:
    """Run ``script`` on ``nproc`` ranks (per node) with torchrun; returns its exit code.
    The merged trace goes to ``trace`` and the per-rank summary to standard output."""
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
        from trnsim.trace.job import merge, save_job

        job = merge(paths, {"world_size": len(paths), "instance": env.get("TRNSIM_INSTANCE", "")})
        print(format_summary(summarize_job(job), job.total_ns))
        if trace:
            written = save_job(job, trace)
            print(f"merged trace of {len(paths)} ranks: {written}")
    return rc


if __name__ == "__main__":
    rank_main(sys.argv[1:])
