"""``trnsim run``, ``trnsim report`` and ``trnsim diff``: one report, from the trace; progress on a terminal only."""

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

import trnsim.trace as tt
from trnsim.cli import main
from trnsim.errors import TrnSimError

ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "examples" / "train_mlp.py"
JOBS = Path(__file__).parent / "dist_jobs"
SECTIONS = ("program        eager PyTorch", "simulated time ", "top ops and fused kernels", "engines        busy share",
            "TensorE (matmul)", "HBM traffic    ", "FLOPs          ", "MFU            ")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TRNSIM_CHIP": "trn2", "TRNSIM_FIDELITY": "op"}


def _trnsim(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trnsim.cli", *args], capture_output=True, text=True, env=_env(),
                          timeout=300, **kw)


def _figures(stdout: str) -> str:
    """The summary of a `trnsim run`'s output: from its first line to the trace's path."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("program "))
    return "\n".join(line for line in lines[start:] if not line.startswith(("trace ", "merged trace of")))


@pytest.fixture(scope="module")
def mlp_traces(tmp_path_factory):
    """An eager and a compiled run of examples/train_mlp.py: (eager trace, compiled trace, eager run's stdout)."""
    d = tmp_path_factory.mktemp("mlp")
    eager, compiled = d / "eager.json", d / "compiled.json"
    r = _trnsim("run", "--trace", str(eager), str(MLP), "--steps", "2", "--hidden", "256")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ops simulated" not in r.stderr and "\x1b[K" not in r.stderr   # piped: no progress
    c = _trnsim("run", "--trace", str(compiled), str(MLP), "--steps", "2", "--hidden", "256", "--compile")
    assert c.returncode == 0, c.stderr[-3000:]
    return eager, compiled, r.stdout, c.stdout


def test_run_prints_every_section_and_report_prints_the_same_figures(mlp_traces, capsys):
    eager, compiled, out, out_compiled = mlp_traces
    assert "step 1: loss" in out and f"trace          {eager}" in out
    for section in SECTIONS:
        assert section in out, section
    assert "mm " in out and "matmul_general" in out and "compilations" not in out
    assert main(["report", str(eager)]) == 0
    assert capsys.readouterr().out.rstrip("\n") == _figures(out)
    assert main(["report", str(compiled)]) == 0
    assert capsys.readouterr().out.rstrip("\n") == _figures(out_compiled)
    # the compiled run: its fused kernels and its compilations, with their causes
    assert "fused[addmm+gelu]" in out_compiled and "fused in graph0 forward" in out_compiled
    assert "compilations   2 graphs (0 from recompiles)" in out_compiled
    assert "(forward, backward): first compile" in out_compiled


def test_report_figures_follow_from_the_trace(mlp_traces):
    eager = tt.report(mlp_traces[0])
    trace = tt.load(mlp_traces[0])
    ops = [s for s in trace.slices if s.track == "ops"]
    assert eager.op_ns == pytest.approx(sum(s.dur_ns for s in ops))
    assert eager.total_ns == pytest.approx(max(s.end_ns for s in ops))
    assert eager.hbm_bytes == sum(s.args["hbm_bytes"] for s in ops) > 0
    # model FLOPs: the matmuls of forward (3 addmm) and backward (2 mm per layer, one for the first), as run
    batch, hidden, steps = 64, 256, 2
    layers = [(256, hidden), (hidden, hidden), (hidden, 10)]
    per_step = sum(2 * batch * k * n for k, n in layers) * 2 + sum(2 * batch * k * n for k, n in layers[1:])
    assert eager.flops == sum(s.args.get("flops", 0) for s in ops)
    # as run: a kernel's padding and its partition broadcasts (K=1 matmuls) add a few
    assert eager.flops == pytest.approx(steps * per_step, rel=1e-4)
    assert eager.peak_flops == trace.meta["device_peak_flops"] > 0
    assert eager.mfu == pytest.approx(eager.flops / (eager.total_ns * 1e-9) / eager.peak_flops)
    assert sum(o.pct for o in eager.ops) == pytest.approx(100)
    assert [o.total_ns for o in eager.ops] == sorted((o.total_ns for o in eager.ops), reverse=True)


def test_diff_of_eager_and_compiled_shows_the_time_saved(mlp_traces, capsys):
    eager, compiled, _, _ = mlp_traces
    cmp = tt.compare(eager, compiled)
    rows = {r.name: r for r in cmp.rows}
    # two addmm fuse with their gelu, the last layer's stays alone (fused[addmm]): one row of what they compute
    fwd = rows["addmm + gelu"]
    assert (fwd.calls_a, fwd.calls_b) == (6 + 4, 4 + 2) and 0 < fwd.b_ns < fwd.a_ns
    assert fwd.names_a == ("addmm", "gelu") and set(fwd.names_b) == {"fused[addmm+gelu]", "fused[addmm]"}
    assert rows["mm"].calls_a == rows["mm"].calls_b   # backward matmuls (fused[mm]): one op each either way
    assert not any(r.name.startswith("fused[") or r.calls_a * r.calls_b == 0 for r in cmp.rows)
    assert cmp.saved_ns == cmp.a.total_ns - cmp.b.total_ns > 0
    assert [abs(r.saved_ns) for r in cmp.rows] == sorted((abs(r.saved_ns) for r in cmp.rows), reverse=True)
    assert main(["diff", str(eager), str(compiled)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"a: {eager}" and out[1] == f"b: {compiled}"
    assert out[-1].startswith("simulated time") and out[-2].startswith("all ops")
    assert f"{cmp.saved_ns / 1e3:12.3f}" in out[-1]


def test_bad_traces_are_named(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text("{}")
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "trnsim: error:" in err
    assert main(["diff", str(tmp_path / "missing.json"), str(bad)]) == 2
    assert f"cannot read trace {tmp_path / 'missing.json'}" in capsys.readouterr().err
    with pytest.raises(TrnSimError, match="top=-1"):
        tt.report(tt.Trace(), top=-1)


def test_progress_shows_on_a_terminal_only(monkeypatch):
    from trnsim.backend.progress import Progress

    monkeypatch.delenv("TRNSIM_PROGRESS", raising=False)

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    piped = io.StringIO()
    with Progress(piped, interval_s=0.001) as p:
        assert not p.active
    assert piped.getvalue() == "" and p.shown == 0
    tty = Tty()
    p = Progress(tty)
    with p:
        p.update()
    assert p.active and p.shown >= 1
    text = tty.getvalue()
    assert text.startswith("\r\x1b[K") and "ops simulated" in text and text.endswith("\r\x1b[K")


def test_progress_can_be_turned_off_on_a_terminal(monkeypatch):
    from trnsim.backend.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TRNSIM_PROGRESS", "0")
    tty = Tty()
    with Progress(tty, interval_s=0.001) as p:
        assert not p.active
    assert tty.getvalue() == "" and p.shown == 0


def test_progress_on_a_pty_and_its_absence_in_a_pipe(tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import time, torch\n"
                      "x = torch.ones(1024, device='neuron') + 1\n"
                      "time.sleep(1.0)\n"   # host time only: the line is refreshed meanwhile
                      "print((x * 2).sum().item())\n")
    leader, follower = pty.openpty()
    env = {k: v for k, v in _env().items() if k != "TRNSIM_PROGRESS"}   # on, whatever this shell says
    proc = subprocess.Popen([sys.executable, "-m", "trnsim.cli", "run", "--no-trace", str(script)], env=env,
                            stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    out = proc.communicate(timeout=300)[0]
    err = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:   # the pty closes when the process ends
            break
        if not chunk:
            break
        err += chunk
    os.close(leader)
    assert proc.returncode == 0, err[-2000:]
    assert b"ops simulated" in err and b"us of simulated time" in err
    assert err.endswith(b"\r\x1b[K")   # the line is cleared at the end
    assert "4096.0" in out and "ops simulated" not in out


def test_nki_script_is_summarised(tmp_path):
    script = tmp_path / "nki_gelu.py"
    kernels = Path(__file__).resolve().parent / "nki_user"   # a TorchNeuron-style kernel file, reused
    script.write_text(f"import sys\nimport numpy as np\nsys.path.insert(0, {str(kernels)!r})\n"
                      "from test_torch_kernels import gelu_rows\n"
                      "print(gelu_rows(np.ones((256, 128), np.float32)).shape)\n")
    trace = tmp_path / "nki.json"
    r = _trnsim("run", "--trace", str(trace), str(script))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "(256, 128)" in r.stdout and "gelu_rows" in r.stdout and "ScalarE" in r.stdout
    rep = tt.report(trace)
    assert [(o.name, o.calls) for o in rep.ops] == [("gelu_rows", 1)]
    assert rep.hbm_bytes == 2 * 256 * 128 * 4   # read once, written once


def test_script_exit_code_is_kept_after_the_summary(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text("import sys, torch\ntorch.ones(8, device='neuron').sum().item()\nsys.exit(3)\n")
    r = _trnsim("run", "--no-trace", str(script))
    assert r.returncode == 3 and "simulated time" in r.stdout and "trace " not in r.stdout


def test_two_rank_job_reports_collectives_and_exposed_communication(tmp_path, capsys):
    trace = tmp_path / "job.json"
    r = _trnsim("run", "--nproc", "2", "--trace", str(trace), str(JOBS / "overlap.py"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "collective us" in r.stdout and "exposed us" in r.stdout and "2 ranks" in r.stdout
    job = tt.load(trace)
    rep = tt.report(job)
    assert rep.world_size == 2 and len(rep.ranks) == 2
    for rank, row in enumerate(rep.ranks):
        coll = tt.busy_ns(job.collectives(rank))
        assert row.collectives == 2 and row.collective_ns == pytest.approx(coll)
        # the async all-reduce runs under a matmul: part of the collective time is hidden
        assert 0 < row.exposed_ns < row.collective_ns
    assert main(["report", str(trace)]) == 0
    assert capsys.readouterr().out.rstrip("\n") == _figures(r.stdout)


def test_exposed_communication_is_collective_time_no_op_overlapped():
    from trnsim.trace.reporting import rank_time

    t = tt.Trace(process="rank 0", slices=[
        tt.Slice("ops", "mm", 0, 10), tt.Slice("ops", "mm", 20, 10), tt.Slice("ops", "add", 22, 2),
        tt.Slice("collectives", "all_reduce", 5, 20), tt.Slice("collectives", "all_reduce", 40, 5),
        tt.Slice("tensor", "matmul", 1, 4.5)])
    row = rank_time(t)
    # collectives cover 5..25 and 40..45 (25 ns); ops overlap 5..10 and 20..25
    assert (row.collective_ns, row.exposed_ns, row.busy_ns, row.collectives) == (25, 15, 35, 2)
    rep = tt.report(tt.JobTrace([t]))
    assert rep.total_ns == 45 and rep.ranks == (row,) and rep.op_ns == 22
    assert [(o.name, o.calls, o.total_ns) for o in rep.ops] == [("mm", 2, 20), ("add", 1, 2)]
    # the first mm has engine slices, the other ops none: their 12 ns are not in the busy shares
    assert rep.engine_busy_pct == {"tensor": 10.0} and rep.unseen_op_ns == 12
    assert "not counted: ops without engine slices, 54.5% of op time" in str(rep)


# -- what trnsim run runs: modules, and the processes a script starts --------------

def test_run_takes_a_module_as_python_m_does(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(
        "import sys, torch\nprint(__name__, sys.argv[1:], sys.argv[0].endswith('train.py'))\n"
        "print(torch.ones(4, device='neuron').sum().item())\n")
    r = _trnsim("run", "--no-trace", "-m", "pkg.train", "--job.config_file", "x.toml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "__main__ ['--job.config_file', 'x.toml'] True" in r.stdout and "4.0" in r.stdout
    assert "program        eager PyTorch (2 ops)" in r.stdout
    job = _trnsim("run", "--nproc", "2", "--trace", str(tmp_path / "job.json"), "-m", "pkg.train", cwd=tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    assert job.stdout.count("__main__ [] True") == 2 and "merged trace of 2 ranks" in job.stdout
    missing = _trnsim("run", "-m", "pkg.nothing", cwd=tmp_path)
    assert missing.returncode == 2 and "no module named 'pkg.nothing'" in missing.stderr


CHILD = ("import sys, torch\nx = torch.ones(256, 256, device='neuron')\nfor _ in range(3):\n    x = x @ x / 256\n"
         "print('child', x.sum().item(), sys.argv[1:])\n")


def test_run_reports_the_work_of_a_child_process(tmp_path):
    """`trnsim run $(which trl) sft ...` said "0 ops, 0.000 us": accelerate runs the
    training in a child process."""
    (tmp_path / "child.py").write_text(CHILD)
    script = tmp_path / "launcher.py"
    script.write_text("import subprocess, sys, os\n"
                      "subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), 'child.py'), '--lr', "
                      "'1'], check=True)\n")
    trace = tmp_path / "t.json"
    r = _trnsim("run", "--trace", str(trace), str(script))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "child 65536.0 ['--lr', '1']" in r.stdout
    assert "the device work ran in a process the script started, pid " in r.stdout
    assert "child.py --lr 1" in r.stdout
    rep = tt.report(trace)
    assert ("mm", 3) in [(o.name, o.calls) for o in rep.ops] and rep.total_ns > 0


def test_run_merges_the_ranks_a_script_starts_with_torchrun(tmp_path):
    (tmp_path / "rank.py").write_text(
        "import torch, torch.distributed as dist\ndist.init_process_group('neuron')\n"
        "x = torch.ones(1024, device='neuron')\ndist.all_reduce(x)\ndist.destroy_process_group()\n")
    script = tmp_path / "launcher.py"
    script.write_text("import subprocess, sys, os\n"
                      "subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', "
                      "'--nproc-per-node', '2', os.path.join(os.path.dirname(__file__), 'rank.py')], check=True)\n")
    trace = tmp_path / "t.json"
    r = _trnsim("run", "--trace", str(trace), str(script))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "processes      2 ran ops on the device" in r.stdout and "(rank 1): " in r.stdout
    job = tt.load(trace)
    assert len(job.ranks) == 2 and all(len(job.collectives(rank)) == 1 for rank in range(2))


def test_run_says_when_no_op_ran_on_the_device(tmp_path):
    script = tmp_path / "cpu.py"
    script.write_text("import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import torch; "
                      "print(torch.ones(2).sum().item())'], check=True)\n")
    r = _trnsim("run", "--no-trace", str(script))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no op ran on the neuron device, in this process or in a Python process it started" in r.stdout


def test_a_child_that_failed_leaves_a_partial_trace(tmp_path):
    (tmp_path / "child.py").write_text("import torch\ntorch.ones(8, device='neuron').sum()\nraise ValueError('bad batch')\n")
    script = tmp_path / "launcher.py"
    script.write_text("import subprocess, sys, os\n"
                      "subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), 'child.py')])\n")
    trace = tmp_path / "t.json"
    r = _trnsim("run", "--trace", str(trace), str(script))
    assert r.returncode == 0, r.stderr[-3000:]   # the script itself finished
    assert "a process the script started did not finish (ValueError: bad batch)" in r.stderr
    assert not trace.exists() and tt.load(tmp_path / "t.partial.json").partial == "ValueError: bad batch"
