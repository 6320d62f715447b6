"""Files trnsim writes and reads back: whole or not at all, refused by name when they cannot be.

Covers the one writer (trnsim.atomic) behind trace saves, profiles and plots, a save
killed part-way (SIGKILL and SIGINT in a child process), nested profiles, and the one
validator of trace files read back (trnsim.trace.validate).
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.conftest import assert_one_line_error, clean_error, cli
from trnsim.atomic import TEMP_SUFFIX, check_writable, write_atomic
from trnsim.errors import FileWriteError, TraceFileError, TrnSimError
from trnsim.trace import load, save, summarize
from trnsim.trace.events import Counter, Slice, Trace

ROOT = Path(__file__).resolve().parents[2]


def small_trace(tag: str = "a", n: int = 4) -> Trace:
    """A deterministic trace with slices on two tracks and a counter."""
    tr = Trace(process=f"NeuronCore 0 ({tag})", meta={"program": tag, "chip": "trn2", "flops": 0})
    tr.slices = [Slice("vector" if i % 2 else "dma.q0", f"op{i}", 10.0 * i, 5.0, {"index": i, "hbm_bytes": 64})
                 for i in range(n)]
    tr.counters = [Counter("HBM traffic", "bytes/s", [(0.0, 1.0), (10.0, 2.0)])]
    return tr


def temp_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX))


# ----------------------------------------------------------------------------- the writer


def test_bad_output_paths_are_refused_by_name(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for path, fragment in [
        (a_file / "t.json", "is a file, not a folder"),
        (a_file / "deeper" / "t.json", "is a file, not a folder"),
        (tmp_path, "it is a folder"),
        (Path("/proc/t.json"), "choose a folder you can write to"),
        (Path("/proc/trnsim-no-such-folder/t.json"), "cannot create the folder"),
    ]:
        clean_error(lambda path=path: save(small_trace(), path), str(path), fragment, types=FileWriteError)
        clean_error(lambda path=path: check_writable(path), str(path), fragment, types=FileWriteError)
    assert a_file.read_text() == "x"


def test_a_folder_that_refuses_new_files_is_a_clear_error(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args):
        if flags & os.O_CREAT and Path(path).parent == tmp_path / "ro":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "open", read_only)
    clean_error(lambda: save(small_trace(), tmp_path / "ro" / "t.json"), "ro/t.json", "Permission denied",
                "choose a folder you can write to", types=FileWriteError)
    assert list((tmp_path / "ro").iterdir()) == []


_SAVE_INTO = """
import sys
from trnsim.errors import FileWriteError
from trnsim.trace import save
from trnsim.trace.events import Trace
try:
    save(Trace(process="p"), sys.argv[1])
except FileWriteError as e:
    print("refused:", e)
    sys.exit(3)
"""


def test_a_read_only_folder_is_a_clear_error(tmp_path):
    """A folder its user cannot write: read-only bits for a user, a read-only mount in a
    mount namespace for root (root writes through permissions)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    prefix: list[str] = []
    if os.geteuid() == 0:
        unshare = shutil.which("unshare")
        if unshare is None:
            pytest.skip("root writes through read-only bits and unshare is missing for a read-only mount")
        prefix = [unshare, "--mount", "sh", "-c", f'mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} {ro} '
                  '&& exec "$@"', "sh"]
    else:
        ro.chmod(0o555)
    try:
        proc = subprocess.run([*prefix, sys.executable, "-c", _SAVE_INTO, str(ro / "t.json")], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        ro.chmod(0o755)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert f"refused: cannot write {ro / 't.json'}" in proc.stdout and "choose a folder you can write to" in proc.stdout
    assert list(ro.iterdir()) == []


def test_missing_folders_are_made(tmp_path):
    path = save(small_trace(), tmp_path / "a" / "b" / "t.json")
    assert load(path).process == "NeuronCore 0 (a)"
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


@pytest.mark.parametrize("exc", [KeyboardInterrupt, ValueError])
def test_an_interrupted_write_keeps_the_old_file_and_no_temp_file(tmp_path, exc):
    path = tmp_path / "t.json"
    path.write_text("old")

    def half(f):
        f.write("new, but only half")
        raise exc("stop")

    with pytest.raises(exc):
        write_atomic(path, half)
    assert path.read_text() == "old"
    assert temp_files(tmp_path) == []


def test_a_full_disk_is_a_clear_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("old")

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    clean_error(lambda: write_atomic(path, full), str(path), "free some space", types=FileWriteError)
    assert path.read_text() == "old" and temp_files(tmp_path) == []


def test_a_link_stays_a_link(tmp_path):
    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    save(small_trace("a"), target)
    link.symlink_to(target)
    save(small_trace("b"), link)
    assert link.is_symlink() and load(target).process == "NeuronCore 0 (b)"


def test_a_device_is_written_into_not_replaced():
    import stat

    save(small_trace(), "/dev/null")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_plots_write_the_format_their_suffix_names(tmp_path):
    from trnsim.trace import plot_busy, plot_timeline

    tr = small_trace()
    plot_timeline(tr, tmp_path / "t.svg")
    plot_busy(tr, tmp_path / "plots" / "busy")
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<?xml")
    assert (tmp_path / "plots" / "busy").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    clean_error(lambda: plot_timeline(tr, tmp_path / "t.xyz"), "t.xyz", ".png", types=TrnSimError)
    clean_error(lambda: plot_timeline(tr, tmp_path / "t.svg" / "x.png"), "t.svg", "not a folder",
                types=FileWriteError)
    assert not (tmp_path / "t.xyz").exists() and temp_files(tmp_path) == []


# ----------------------------------------------------------------------------- killed mid-save

# The trace writer needs no torch: the child loads trnsim's folder as a bare package,
# skipping trnsim/__init__ (which registers the neuron device), so it starts in a blink.
_CHILD = """
import sys, types
sys.path.insert(0, {root!r})
pkg = types.ModuleType("trnsim")
pkg.__path__ = [{root!r} + "/trnsim"]
sys.modules["trnsim"] = pkg
from tests.reliability.test_files import small_trace
from trnsim.trace.export import save
a, b = small_trace("a", {n}), small_trace("b", {n})
print("ready", flush=True)
while True:
    save(b, {path!r})
    save(a, {path!r})
"""


def _wait_for_line(proc: subprocess.Popen, timeout: float) -> str:
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"child gave no sign of life in {timeout} s")
        return proc.stdout.readline()


def test_a_save_killed_at_any_point_leaves_the_old_or_the_new_trace(tmp_path):
    n = 10000
    expected = {}
    for tag in ("a", "b"):
        expected[tag] = save(small_trace(tag, n), tmp_path / f"ref-{tag}.json").read_bytes()
    rng = random.Random(0)
    plan = [signal.SIGKILL, signal.SIGINT] * 3
    children = []
    try:
        for i, sig in enumerate(plan):
            folder = tmp_path / f"run{i}"
            folder.mkdir()
            path = folder / "t.json"
            path.write_bytes(expected["a"])
            proc = subprocess.Popen([sys.executable, "-c", _CHILD.format(root=str(ROOT), n=n, path=str(path))],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
            children.append((proc, sig, path))
        for proc, _, _ in children:
            assert _wait_for_line(proc, 120).strip() == "ready"
        for proc, sig, _ in children:
            time.sleep(rng.uniform(0.0, 0.4))
            proc.send_signal(sig)
        for proc, sig, path in children:
            proc.wait(timeout=60)
            assert path.read_bytes() in (expected["a"], expected["b"]), f"{sig!r} left a partial {path}"
            assert load(path).slices
            strays = temp_files(path.parent)
            if sig == signal.SIGINT:
                assert strays == [], f"SIGINT left {strays}"
            else:
                # a kill may strand one temp file; it must not disturb the next save or load
                assert all(p.name.startswith(".t.json.") for p in strays)
                save(small_trace("c"), path)
                assert load(path).process == "NeuronCore 0 (c)"
    finally:
        for proc, _, _ in children:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            proc.stdout.close()


# ----------------------------------------------------------------------------- nested profiles


def test_nested_profiles_each_record_their_ops_and_write_their_trace(tmp_path):
    import torch

    import trnsim

    x = torch.ones(4, 4, device="neuron")
    with trnsim.profile(tmp_path / "outer.json") as outer:
        with trnsim.profile(tmp_path / "inner.json") as inner:
            y = x * 2
        with pytest.raises(RuntimeError, match="boom"):
            with trnsim.profile(tmp_path / "failed.json") as failed:
                y = y + 1
                raise RuntimeError("boom")
        y = y - 1
    assert [r.name for r in inner.records] == ["aten::mul.Tensor"]
    assert [r.name for r in failed.records] == ["aten::add.Tensor"]
    assert [r.name for r in outer.records] == ["aten::mul.Tensor", "aten::add.Tensor", "aten::sub.Tensor"]
    for name, ops in (("outer", 3), ("inner", 1), ("failed.partial", 1)):   # the failed run's trace: beside
        assert len([s for s in load(tmp_path / f"{name}.json").slices if s.track == "ops"]) == ops
    assert load(tmp_path / "failed.partial.json").partial == "RuntimeError: boom"
    assert not (tmp_path / "failed.json").exists()
    from trnsim.backend import profiler, timeline

    assert profiler.current() is None and timeline._recorders() == []


def test_a_profile_cannot_be_entered_inside_itself_and_reuse_starts_afresh(tmp_path):
    import torch

    import trnsim

    x = torch.ones(4, device="neuron")
    prof = trnsim.profile()
    with prof:
        clean_error(lambda: prof.__enter__(), "already recording", types=TrnSimError)
        x = x + 1
    with prof:
        x = x * 3
    assert [r.name for r in prof.records] == ["aten::mul.Tensor"]


def test_a_profile_with_a_bad_path_refuses_before_recording(tmp_path):
    import trnsim

    (tmp_path / "f").write_text("")
    clean_error(lambda: trnsim.profile(tmp_path / "f" / "t.json").__enter__(), "not a folder", types=FileWriteError)
    from trnsim.backend import profiler

    assert profiler.current() is None


# ----------------------------------------------------------------------------- reading back


def _saved(tmp_path: Path) -> dict:
    return json.loads(save(small_trace(), tmp_path / "good.json").read_text())


def _event(data: dict, ph: str) -> dict:
    return next(e for e in data["traceEvents"] if e["ph"] == ph)


def _damage(data: dict, how: str) -> None:
    x, c = _event(data, "X"), _event(data, "C")
    if how == "no tid":
        del x["tid"]
    elif how == "no ph":
        del x["ph"]
    elif how == "no args":
        del c["args"]
    elif how == "no name":
        del x["name"]
    elif how == "no ts":
        del x["ts"]
    elif how == "ts string":
        x["ts"] = "12"
    elif how == "dur string":
        x["dur"] = "5"
    elif how == "dur nan":
        x["dur"] = math.nan
    elif how == "ts inf":
        x["ts"] = math.inf
    elif how == "ts negative":
        x["ts"] = -1.0
    elif how == "dur huge":
        x["dur"] = 1e300
    elif how == "unknown tid":
        x["tid"] = 99
    elif how == "unknown ph":
        x["ph"] = "B"
    elif how == "event not an object":
        data["traceEvents"][3] = [1, 2]
    elif how == "counter nan":
        c["args"]["value"] = math.nan


@pytest.mark.parametrize("how, key", [
    ("no tid", "'tid'"), ("no ph", "'ph'"), ("no args", "'args'"), ("no name", "'name'"), ("no ts", "'ts'"),
    ("ts string", "ts='12'"), ("dur string", "dur='5'"), ("dur nan", "dur=nan"), ("ts inf", "ts=inf"),
    ("ts negative", "ts=-1.0"), ("dur huge", "dur=1e+300"), ("unknown tid", "tid=99"), ("unknown ph", "ph='B'"),
    ("event not an object", "event 3"), ("counter nan", "args.value=nan"),
])
def test_a_damaged_event_is_refused_by_index_and_key(tmp_path, how, key):
    data = _saved(tmp_path)
    _damage(data, how)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    err = clean_error(lambda: load(path), str(path), key, types=TraceFileError)
    assert "event " in str(err)


@pytest.mark.parametrize("content, fragment", [
    (b"\x00\x01\x02\xff\xfe binary", "not UTF-8"),
    (b'{"traceEvents": "\xc3\x28"}', "not UTF-8"),
    (b"[1, 2, 3]", "a list, not an object"),
    (b"", "is empty"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    (b'{"traceEvents": [], "otherData": {"format": "trnsim-trace/1", "process": "p", "tracks": []}', "not valid JSON"),
    (b'{"traceEvents": {}, "otherData": {"format": "trnsim-trace/1", "process": "p", "tracks": []}}', "traceEvents"),
    (b'{"traceEvents": [], "otherData": {"format": "trnsim-trace/1", "process": "p", "tracks": [1]}}', "tracks"),
    (b'{"traceEvents": [], "otherData": {"format": "trnsim-trace/1", "process": "p", "tracks": [], '
     b'"flops": NaN}}', "flops=nan"),
])
def test_a_file_that_is_not_a_trace_is_refused_by_name(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    clean_error(lambda: load(path), str(path), fragment, types=TraceFileError)


def _mutate(data: dict, rng: random.Random, kind: str):
    """One damage to a random spot of the trace's JSON."""
    events = data["traceEvents"]
    e = events[rng.randrange(len(events))]
    key = rng.choice(sorted(e))
    if kind == "drop":
        del e[key]
    elif kind == "type":
        e[key] = rng.choice(["1", None, [], {}, True, 1.5, -3])
    elif kind == "nan":
        e[key] = rng.choice([math.nan, math.inf, -math.inf, 1e300, -1e-300])
    elif kind == "meta":
        other = data["otherData"]
        other[rng.choice(sorted(other))] = rng.choice(["x", None, math.nan, [], -1])
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["drop", "type", "nan", "meta", "truncate"]))
def test_any_damage_to_a_saved_trace_loads_and_reports_correctly_or_is_refused(tmp_path, seed, kind):
    rng = random.Random(seed)
    good = save(small_trace("a", 6), tmp_path / "good.json").read_bytes()
    if kind == "truncate":
        raw = good[:rng.randrange(len(good))]
    else:
        raw = json.dumps(_mutate(json.loads(good), rng, kind)).encode()
    path = tmp_path / "mutant.json"
    path.write_bytes(raw)
    rc, out, err = cli("report", str(path))
    try:
        trace = load(path)
    except TraceFileError as e:
        assert str(path) in str(e)
        assert_one_line_error(rc, err, str(path))
        assert len(err.splitlines()) == 1
        return
    assert rc == 0 and err == "", err
    s = summarize(trace)
    assert math.isfinite(s.total_ns) and s.total_ns >= 0
    assert all(math.isfinite(p) for p in s.busy_pct.values())
    str(s)
