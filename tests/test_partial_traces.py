"""A run that did not finish (an exception, Ctrl-C, a failure exit) never replaces the
finished trace of an earlier run: its trace goes beside it, marked partial in the file,
in ``trnsim.trace.load``, in the summaries and in Perfetto; the command says so in one line."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import trnsim
import trnsim.trace as tt
from trnsim.testing.procs import run_session, with_repo_on_path
from trnsim.trace.partial import partial_path, why_unfinished

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300

SCRIPT = """\
import sys, time, torch
x = torch.ones(64, 64, device="neuron")
for _ in range(3):
    x = x @ x / 64
mode = sys.argv[1]
def step():
    raise ValueError("boom")
if mode == "fail":
    step()
if mode == "exit":
    sys.exit(3)
if mode == "loop":
    open(sys.argv[2], "w").close()   # started: Ctrl-C may come now
    while True:
        time.sleep(0.05)
x = x + 1   # the finished run ran one op more than the others: its trace differs from theirs
print("done")
"""

JOB = """\
import os, sys, time, torch
import torch.distributed as dist
dist.init_process_group("neuron")
rank = dist.get_rank()
x = torch.ones(1024, device="neuron")
dist.all_reduce(x)
mode = sys.argv[1]
if mode == "fail" and rank == 1:
    raise ValueError("rank 1 fails")
if mode == "loop":
    if rank == 0:
        open(sys.argv[2], "w").close()
    while True:
        time.sleep(0.05)
dist.all_reduce(x)
dist.destroy_process_group()
"""


def _trnsim(tmp_path: Path, *args: str, interrupt_when: Path | None = None):
    env = with_repo_on_path(ROOT, TRNSIM_CHIP="trn2", TRNSIM_FIDELITY="op", TRNSIM_PROGRESS="0")
    return run_session([sys.executable, "-m", "trnsim.cli", *map(str, args)], timeout=TIMEOUT_S, env=env,
                       cwd=tmp_path, interrupt_when=interrupt_when)


def _assert_partial(path: Path, reason: str) -> None:
    """``path`` is a partial trace for ``reason`` everywhere it is read."""
    data = json.loads(path.read_text())
    other = data["otherData"]
    assert other["partial"] == reason
    names = [e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "process_name"]
    assert names and all(name.endswith(f" [PARTIAL: {reason}]") for name in names)   # Perfetto's track names
    loaded = tt.load(path)
    assert loaded.partial == reason
    first = f"PARTIAL TRACE  the run did not finish: {reason}; the figures cover only what ran until then"
    assert str(tt.report(loaded)).splitlines()[0] == first
    if isinstance(loaded, tt.Trace):
        assert str(tt.summarize(loaded)).splitlines()[0] == first


@pytest.fixture
def finished(tmp_path):
    """A finished run's trace at t.json, and its bytes."""
    script = tmp_path / "work.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "t.json"
    r = _trnsim(tmp_path, "run", "--trace", trace, script, "ok")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "done" in r.stdout and f"trace          {trace}" in r.stdout
    assert tt.load(trace).partial is None
    assert not str(tt.report(trace)).startswith("PARTIAL")
    return script, trace, trace.read_bytes()


def test_a_failing_run_leaves_the_finished_trace_and_shows_the_scripts_traceback(tmp_path, finished):
    script, trace, good = finished
    r = _trnsim(tmp_path, "run", "--trace", trace, script, "fail")
    assert r.returncode == 1
    assert trace.read_bytes() == good
    partial = tmp_path / "t.partial.json"
    _assert_partial(partial, "ValueError: boom")
    err = r.stderr.splitlines()
    # the script's traceback, from its first frame: no runner frames (trnsim.cli, runpy)
    assert err[:5] == ["Traceback (most recent call last):", f'  File "{script}", line 9, in <module>',
                       "    step()", f'  File "{script}", line 7, in step', '    raise ValueError("boom")']
    assert err[5:] == ["ValueError: boom",
                       f"trnsim: the script raised ValueError after 7 ops, 63.248 us simulated; partial trace at "
                       f"{partial} ({trace} is left as it was)"]
    assert "program" not in r.stdout   # no summary of a run that failed
    rep = _trnsim(tmp_path, "report", partial)
    assert rep.returncode == 0 and rep.stdout.startswith("PARTIAL TRACE  the run did not finish: ValueError: boom;")


def test_ctrl_c_leaves_the_finished_trace_and_says_one_line(tmp_path, finished):
    script, trace, good = finished
    started = tmp_path / "started"
    r = _trnsim(tmp_path, "run", "--trace", trace, script, "loop", started, interrupt_when=started)
    partial = tmp_path / "t.partial.json"
    assert r.returncode == 130, r.stderr[-3000:]
    assert r.stderr.splitlines() == [f"trnsim: interrupted after 7 ops, 63.248 us simulated; partial trace at "
                                     f"{partial} ({trace} is left as it was)"]
    assert trace.read_bytes() == good
    _assert_partial(partial, "interrupted by Ctrl-C")
    assert len([s for s in tt.load(partial).slices if s.track == "ops"]) == 7


def test_a_failure_exit_keeps_its_status_and_summary_and_the_finished_trace(tmp_path, finished):
    script, trace, good = finished
    r = _trnsim(tmp_path, "run", "--trace", trace, script, "exit")
    partial = tmp_path / "t.partial.json"
    assert r.returncode == 3 and trace.read_bytes() == good
    assert r.stdout.startswith("PARTIAL TRACE  the run did not finish: exited with status 3;")
    assert r.stderr.splitlines()[-1].startswith("trnsim: the script exited with status 3 after 7 ops")
    _assert_partial(partial, "exited with status 3")


def test_a_job_that_fails_or_is_interrupted_leaves_the_finished_merged_trace(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    trace = tmp_path / "j.json"
    r = _trnsim(tmp_path, "run", "--nproc", "2", "--trace", trace, script, "ok")
    assert r.returncode == 0, r.stderr[-3000:]
    good = trace.read_bytes()
    partial = tmp_path / "j.partial.json"

    r = _trnsim(tmp_path, "run", "--nproc", "2", "--trace", trace, script, "fail")
    assert r.returncode == 1 and trace.read_bytes() == good
    reason = "rank 1: ValueError: rank 1 fails"   # the cause; not rank 0's lost collective
    _assert_partial(partial, reason)
    assert r.stderr.splitlines()[-1].startswith(f"trnsim: the job did not finish ({reason}) after ")
    assert r.stderr.splitlines()[-1].endswith(f"; partial trace at {partial} ({trace} is left as it was)")
    assert 'File "<frozen runpy>"' not in r.stderr and "launch.py" not in r.stderr
    assert "ChildFailedError" not in r.stderr   # torchrun's failure table: the line above says it
    assert f'  File "{script}", line 9, in <module>' in r.stderr
    assert "program" not in r.stdout

    partial.unlink()
    started = tmp_path / "started"
    r = _trnsim(tmp_path, "run", "--nproc", "2", "--trace", trace, script, "loop", started, interrupt_when=started)
    assert r.returncode == 130, r.stderr[-3000:]
    assert trace.read_bytes() == good
    _assert_partial(partial, "interrupted by Ctrl-C")
    assert re.fullmatch(rf"trnsim: interrupted after [\d,]+ ops, [\d,.]+ us simulated; partial trace at "
                        rf"{re.escape(str(partial))} \({re.escape(str(trace))} is left as it was\)",
                        r.stderr.splitlines()[-1])
    assert [t.partial for t in tt.load(partial).ranks] == ["interrupted by Ctrl-C"] * 2


def test_a_profile_left_by_an_exception_writes_beside_its_path(tmp_path):
    path = tmp_path / "p.json"
    with trnsim.profile(path):
        (torch.ones(8, device="neuron") + 1).sum().item()
    good = path.read_bytes()
    with pytest.raises(KeyboardInterrupt) as info:
        with trnsim.profile(path) as prof:
            (torch.ones(8, device="neuron") * 2).sum().item()
            raise KeyboardInterrupt
    assert path.read_bytes() == good and prof.partial == "interrupted by Ctrl-C"
    _assert_partial(tmp_path / "p.partial.json", "interrupted by Ctrl-C")
    assert info.value.__notes__ == [f"trnsim.profile: the run did not finish; its partial trace is at "
                                    f"{tmp_path / 'p.partial.json'} ({path} is left as it was)"]
    with pytest.raises(SystemExit):   # sys.exit(0) is a finished run
        with trnsim.profile(path):
            raise SystemExit(0)
    assert tt.load(path).partial is None


def test_partial_names_and_reasons():
    assert partial_path("traces/t.json") == Path("traces/t.partial.json")
    assert partial_path("traces/t.job.json") == Path("traces/t.job.partial.json")
    assert partial_path("trace") == Path("trace.partial")
    assert why_unfinished(None) is None and why_unfinished(SystemExit(0)) is None
    assert why_unfinished(SystemExit(None)) is None
    assert why_unfinished(SystemExit(2)) == "exited with status 2"
    assert why_unfinished(SystemExit("usage: ...")) == "exited with status 1"
    assert why_unfinished(KeyboardInterrupt()) == "interrupted by Ctrl-C"
    assert why_unfinished(RuntimeError("a\n  b")) == "RuntimeError: a b"
    assert why_unfinished(RuntimeError("x" * 500)).endswith("x...") and len(why_unfinished(RuntimeError("x" * 500))) < 200


STOPPED_WHILE_FAILING = """\
import os, signal, torch
x = torch.ones(8, device="neuron") + 1
class Late(ValueError):
    def __str__(self):   # torchrun's SIGTERM lands while the rank shows the exception
        os.kill(os.getpid(), signal.{sig})
        return "late"
raise Late()
"""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_while_a_rank_shows_its_exception_loses_neither_it_nor_the_trace(tmp_path, sig):
    script = tmp_path / "late.py"
    script.write_text(STOPPED_WHILE_FAILING.format(sig=sig))
    env = with_repo_on_path(ROOT, TRNSIM_CHIP="trn2", TRNSIM_FIDELITY="op", TRNSIM_PROGRESS="0",
                            TRNSIM_JOB_TRACE_DIR=str(tmp_path), RANK="0", WORLD_SIZE="1")
    r = run_session([sys.executable, "-m", "trnsim.backend.distributed.launch", str(script)], timeout=TIMEOUT_S,
                    env=env, cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr.splitlines()[-1] == "Late: late"
    assert tt.load(tmp_path / "rank0.json").partial == "Late: late"
