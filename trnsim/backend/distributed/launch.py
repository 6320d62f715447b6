"""``trnsim run --nproc N``: a script on N ranks with torchrun, each rank traced, one merged trace.

:func:`run_job` starts ``torchrun --standalone --nproc-per-node N`` on this module,
which runs the unmodified script in each rank process under a :class:`trnsim.profile`
and writes the rank's trace into a job folder; when every rank has ended, the traces
are merged onto the shared clock (:func:`trnsim.trace.merge`) and reported
(:func:`trnsim.trace.report`: the job's figures, then collective time and exposed
communication per rank). Rank 0 shows progress on a terminal.
The instance (``--instance``), chip and fidelity reach the ranks through
``TRNSIM_INSTANCE``, ``TRNSIM_CHIP`` and ``TRNSIM_FIDELITY``.

A rank writes its trace however its script ends, marked partial when it did not
finish (an exception, shown from the script's first frame; Ctrl-C; SIGTERM, which
torchrun sends the others when one fails). A job that did not finish (a rank failed,
Ctrl-C, ``--timeout``) leaves the finished trace at its path as it was: the merged
partial trace goes beside it (:mod:`trnsim.trace.partial`), and one line says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from trnsim.backend.distributed.faults import RankLostError
from trnsim.backend.runscript import INTERRUPTED, Program, stopped_line
from trnsim.trace.job import JobTrace

JOB_DIR = "TRNSIM_JOB_TRACE_DIR"


def _rank_name(rank: int, world: int) -> str:
    try:
        from trnsim.backend.distributed.timing import instance_name
        from trnsim.hw.fabric import Fabric

        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world) or world)
        fabric = Fabric(instance_name(), world, nodes=max(1, -(-world // per_node)), nproc_per_node=per_node)
        p = fabric.place(rank)
        return f"rank {rank} (server {p.server}, chip {p.chip}, core {p.core})"
    except Exception:   # noqa: BLE001 - the name is a label: an unknown instance must not lose the trace
        return f"rank {rank}"


#: Why a rank that torchrun stopped did not finish.
STOPPED = "stopped by torchrun (SIGTERM)"
#: Why a rank did not finish when a collective found another rank gone.
PEER_LOST = "a collective lost another rank (RankLostError)"


class RankStopped(BaseException):
    """SIGTERM reached a rank: torchrun stops the other ranks so when one fails (or the
    job is stopped). A BaseException, so the script's ``except Exception`` lets it pass."""


class _Signals:
    """SIGTERM and SIGINT stop the script while it runs (as :class:`RankStopped` and
    KeyboardInterrupt); from the moment it ends they are ignored, so one that arrives
    while the rank shows the script's exception or writes its trace loses neither."""

    def __init__(self) -> None:
        self.running = True
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.running:
            return
        self.running = False
        if signum == signal.SIGTERM:
            raise RankStopped(STOPPED)
        raise KeyboardInterrupt

    def ended(self) -> None:
        self.running = False


def rank_main(argv: list[str]) -> None:
    """Run ``argv[0]`` (or the module after ``-m``) with the rest of ``argv`` as
    ``__main__`` in this rank, traced; the
    rank's trace, marked partial if the script did not finish, goes to the job folder
    however the script ends. Exits with the script's status (1 after an exception,
    shown from the script's first frame; 130 after Ctrl-C; 143 when stopped)."""
    import trnsim

    if not argv or argv == ["-m"]:
        raise SystemExit("usage: python -m trnsim.backend.distributed.launch (script.py | -m module) [args...]")
    program, args = Program.from_argv(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    out = os.environ.get(JOB_DIR)
    from trnsim.backend.progress import Progress

    signals = _Signals()
    prof = trnsim.profile()
    status: int | str | None = 0
    try:
        with prof, Progress() if rank == 0 else contextlib.nullcontext():   # one line for the job, on a terminal only
            try:
                program.run(args)
            finally:
                signals.ended()
    except SystemExit as e:
        status = e.code
    except KeyboardInterrupt:
        status = INTERRUPTED
    except RankStopped:
        status = 128 + signal.SIGTERM
        prof.partial = STOPPED
    except BaseException as e:   # noqa: BLE001 - the script's own exception: shown, and the trace still written
        print(program.traceback(e), end="", file=sys.stderr)
        status = 1
        if isinstance(e, RankLostError):   # the consequence; the failed rank says the cause
            prof.partial = PEER_LOST
    if out:
        trace = prof.trace()
        trace.process = _rank_name(rank, world)
        trace.meta["rank_name"] = trace.process
        from trnsim.trace.export import save

        save(trace, Path(out) / f"rank{rank}.json")
    raise SystemExit(status)


def _stop_job(proc: subprocess.Popen, sig: int) -> int:
    """Pass ``sig`` to torchrun, which passes it to the ranks (each in a session of its
    own), and wait while they write their traces; kill what is left after a minute."""
    try:
        os.killpg(proc.pid, sig)
        return proc.wait(timeout=60)
    except ProcessLookupError:   # it had ended already
        return proc.wait()
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _job_unfinished(job: JobTrace, ids: list[int], rc: int, stop: str | None, missing: list[int]) -> str | None:
    """Why the job did not finish, or None: the launcher stopped it, ranks did not
    finish (those that failed, else those torchrun stopped), a rank wrote no trace, or
    torchrun failed. ``ids`` are the ranks of ``job.ranks``."""
    if stop is not None:
        return stop
    partial = [(rank, t.partial) for rank, t in zip(ids, job.ranks) if t.partial]
    failed = [f"rank {rank}: {why}" for rank, why in partial if why not in (STOPPED, PEER_LOST)]
    ranks = (failed or [f"rank {rank}: {why}" for rank, why in partial]) + [f"rank {r} wrote no trace" for r in missing]
    if ranks:
        return "; ".join(ranks)
    return f"torchrun exited with status {rc}" if rc else None


def run_job(program: Program, args: list[str], nproc: int, trace: str | None, *, instance: str | None = None,
            chip: str | None = None, fidelity: str | None = None, timeout_s: float | None = None,
            nnodes: int | None = None, node_rank: int | None = None, rdzv_endpoint: str | None = None,
            top: int = 10) -> int:
    """Run ``program`` on ``nproc`` ranks (per node) with torchrun; returns its exit code.
    The merged trace goes to ``trace`` and its report (:func:`trnsim.trace.report`, with
    ``top`` ops) to standard output. A job that did not finish (a rank failed, Ctrl-C,
    ``timeout_s``) leaves ``trace`` as it was: its merged trace, marked partial, goes
    beside it (:mod:`trnsim.trace.partial`) and one line on standard error says so."""
    env = dict(os.environ)
    for key, value in (("TRNSIM_INSTANCE", instance), ("TRNSIM_CHIP", chip), ("TRNSIM_FIDELITY", fidelity)):
        if value:
            env[key] = value
    with tempfile.TemporaryDirectory(prefix="trnsim-job-") as tmp:
        env[JOB_DIR] = tmp
        cmd = [sys.executable, "-m", "trnsim.backend.distributed.torchrun", f"--nproc-per-node={nproc}"]
        if nnodes and nnodes > 1:
            cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank or 0}", f"--rdzv-endpoint={rdzv_endpoint}",
                    "--rdzv-backend=c10d"]
        else:
            cmd += ["--standalone"]
        cmd += ["-m", "trnsim.backend.distributed.launch", *program.argv(), *args]
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        stop = None   # why this launcher stopped the job
        interrupted = False
        try:
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop, rc = f"stopped at the --timeout of {timeout_s:g} s", _stop_job(proc, signal.SIGTERM)
            except KeyboardInterrupt:   # Ctrl-C reaches this process only: torchrun has a session of its own
                interrupted = True
                stop, rc = "interrupted by Ctrl-C", _stop_job(proc, signal.SIGINT)
        finally:   # a second Ctrl-C while the ranks stop: leave no launcher behind
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        failed = INTERRUPTED if interrupted else rc or 1
        paths = sorted(Path(tmp).glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        ids = [int(p.stem[4:]) for p in paths]
        if not paths:
            if stop or rc:
                print(f"trnsim: the job did not finish ({stop or f'torchrun exited with status {rc}'}); no rank "
                      "wrote a trace", file=sys.stderr)
            return failed if stop or rc else 0
        from trnsim.trace import load, report
        from trnsim.trace.export import merge
        from trnsim.trace.partial import save_run

        job = merge(paths, {"world_size": len(paths), "instance": env.get("TRNSIM_INSTANCE", "")})
        missing = [] if nnodes and nnodes > 1 else sorted(set(range(nproc)) - set(ids))
        unfinished = _job_unfinished(job, ids, rc, stop, missing)
        written = save_run(job, trace, unfinished) if trace else None   # never over a finished job's trace
        if unfinished is not None:
            event = "interrupted" if interrupted else f"the job did not finish ({unfinished})"
            print(stopped_line(event, job, written, trace), file=sys.stderr)
            return failed
        if written:
            print(report(load(written), top=top))   # as `trnsim report` will print it
            print(f"merged trace of {len(paths)} ranks: {written}")
        else:
            print(report(job, top=top))
    return rc


if __name__ == "__main__":
    rank_main(sys.argv[1:])
