"""The ``trnsim`` command refuses every bad value on one line, with exit code 2, before it
starts work: demo sizes and steps, output paths, TRNSIM_FIDELITY, damaged traces."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from tests.reliability.conftest import assert_one_line_error, clean_error, cli
from trnsim.errors import ConfigError
from trnsim.trace import save
from trnsim.trace.events import Slice, Trace

SMALL = ("--size", "128", "128", "512")


def refused(args: tuple[str, ...], *fragments: str, env: dict[str, str] | None = None) -> None:
    rc, out, err = cli(*args, env=env)
    assert_one_line_error(rc, err, *fragments)
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("trnsim: error: "), err
    assert out == "", f"work started before the refusal: {out}"


@pytest.mark.parametrize("size, fragment", [
    (("100", "128", "512"), "M=100"),
    (("128", "0", "512"), "K=0"),
    (("128", "128", "-512"), "N=-512"),
    (("128", "128", "500"), "N=500"),
    (("131072", "131072", "131072"), "GiB of HBM"),
])
def test_demo_sizes_that_cannot_run_are_refused(tmp_path, size, fragment):
    refused(("demo", "--size", *size, "--trace", str(tmp_path / "t.json")), fragment, "demo size")
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("steps", ["0", "-3"])
def test_llama_demo_steps_below_one_are_refused(tmp_path, steps):
    refused(("demo", "llama", "--steps", steps, "--trace", str(tmp_path / "t.json")), f"steps={steps}", "--steps 1")


def test_argument_errors_are_one_line_too():
    refused(("demo", "llama", "--steps", "many"), "--steps", "'many'", "--help")


def test_bad_trace_paths_are_refused_before_the_run(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for path, fragment in [(a_file / "t.json", "is a file, not a folder"), ("/proc/t.json", "/proc/t.json"),
                           (tmp_path, "it is a folder")]:
        refused(("demo", *SMALL, "--trace", str(path)), str(path), fragment)
        refused(("demo", "llama", "--steps", "1", "--trace", str(path)), str(path), fragment)


def test_a_read_only_folder_is_refused_before_the_run(tmp_path, monkeypatch):
    real_open = os.open
    ro = tmp_path / "ro"
    ro.mkdir()

    def read_only(path, flags, *args):
        if flags & os.O_CREAT and Path(path).parent == ro:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    refused(("demo", *SMALL, "--trace", str(ro / "t.json")), str(ro / "t.json"), "Permission denied")
    refused(("demo", "llama", "--trace", str(ro / "t.json")), str(ro / "t.json"), "Permission denied")
    refused(("report", "missing.json", "--plot", str(ro / "t.png")), str(ro / "t.png"), "Permission denied")


# `report` and `diff` read saved traces and simulate nothing: the variables do not concern
# them (tests/test_settings.py)
@pytest.mark.parametrize("command", [("chips",), ("coverage",), ("demo", *SMALL), ("demo", "llama", "--steps", "1")])
def test_an_unknown_fidelity_in_the_environment_is_refused(command):
    refused(command, "TRNSIM_FIDELITY='fast'", "op, instruction, timing", env={"TRNSIM_FIDELITY": "fast"})


def test_an_unknown_fidelity_is_a_clear_error_on_the_device(monkeypatch):
    import torch

    from trnsim.backend import state, timeline

    monkeypatch.setenv("TRNSIM_FIDELITY", "fast")
    monkeypatch.setattr(state, "_fidelity", None)
    monkeypatch.setattr(timeline, "_memo", {})
    clean_error(lambda: torch.ones(2, device="neuron") + 1, "TRNSIM_FIDELITY='fast'", "unset it", types=ConfigError)


def _trace_file(tmp_path) -> str:
    tr = Trace(process="NeuronCore 0", meta={"program": "p", "chip": "trn2"})
    tr.slices = [Slice("vector", "op", 0.0, 10.0, {})]
    return str(save(tr, tmp_path / "t.json"))


def test_report_plots_into_a_new_folder_and_refuses_an_unwritable_one(tmp_path):
    trace = _trace_file(tmp_path)
    rc, out, err = cli("report", trace, "--plot", str(tmp_path / "new" / "deeper" / "t.png"))
    assert rc == 0 and err == "" and (tmp_path / "new" / "deeper" / "t.png").stat().st_size > 0
    refused(("report", trace, "--plot", str(tmp_path / "t.json" / "t.png")), "is a file, not a folder")
    refused(("report", trace, "--plot", "/proc/t.png"), "/proc/t.png")
    refused(("report", trace, "--plot", str(tmp_path / "t.bmpx")), "'bmpx'", ".png")


@pytest.mark.parametrize("content, fragment", [
    (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8"),
    (b"{", "not valid JSON"),
    (b'"a string"', "a str, not an object"),
    (b"[" * 50000, "nested too deeply"),
])
def test_report_refuses_files_that_are_not_traces(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    refused(("report", str(path)), str(path), fragment)


@pytest.mark.parametrize("key, value, fragment", [
    ("ts", float("nan"), "ts=nan"), ("dur", -1.0, "dur=-1.0"), ("tid", 7, "tid=7"), ("ts", "0", "ts='0'"),
])
def test_report_refuses_a_damaged_event(tmp_path, key, value, fragment):
    path = tmp_path / "t.json"
    data = json.loads(open(_trace_file(tmp_path)).read())
    next(e for e in data["traceEvents"] if e["ph"] == "X")[key] = value
    path.write_text(json.dumps(data))
    refused(("report", str(path)), str(path), "event 3", fragment)
