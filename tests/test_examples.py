"""Every script under examples/ runs unchanged, as a user runs it: with ``trnsim run``
(which prints the profile summary) in the default suite, and with plain ``python``
under ``-m slow`` (.ci/run runs both). Distributed examples run under
``trnsim run --nproc N``. Each run has a bounded time and leaves no process behind."""

import os
import pathlib
import subprocess
import sys

import pytest

from trnsim.testing.procs import run_session

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p.stem for p in EXAMPLES.glob("*.py"))
# the libraries each example imports, and the ranks a distributed one needs
NEEDS = {"hf_": ("transformers", "datasets"), "trl_": ("trl", "peft", "datasets"), "diffusers_": ("diffusers",),
         "hub_": ("kernels", "transformers")}
NPROC = {"trl_sft_lora_tp_fsdp": 8}
TIMEOUT_S = 420


def _missing(name: str) -> str | None:
    import importlib.util

    for prefix, modules in NEEDS.items():
        if name.startswith(prefix):
            for m in modules:
                if importlib.util.find_spec(m) is None:
                    return f"{m} is not installed: install trnsim's test extra (pip install -e .[test])"
    return None


def _run(argv: list[str], tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    for flag in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU", "ACCELERATE_MIXED_PRECISION"):
        env.pop(flag, None)
    return run_session(argv, timeout=TIMEOUT_S, env=env, cwd=tmp_path)


def _trnsim() -> str:
    return str(pathlib.Path(sys.executable).with_name("trnsim"))


@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in NPROC])
def test_example_runs_under_trnsim_run(name, tmp_path):
    if reason := _missing(name):
        pytest.skip(reason)
    trace = tmp_path / "trace.json"
    r = _run([_trnsim(), "run", "--trace", str(trace), str(EXAMPLES / f"{name}.py")], tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    assert trace.is_file() and str(trace) in r.stdout, r.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", [s for s in SCRIPTS if s not in NPROC])
def test_example_runs_under_python(name, tmp_path):
    if reason := _missing(name):
        pytest.skip(reason)
    r = _run([sys.executable, str(EXAMPLES / f"{name}.py")], tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip(), "the example printed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NPROC))
def test_distributed_example_runs_under_trnsim_run(name, tmp_path):
    if not (EXAMPLES / f"{name}.py").is_file():
        pytest.skip(f"examples/{name}.py is not in this tree")
    if reason := _missing(name):
        pytest.skip(reason)
    r = _run([_trnsim(), "run", "--nproc", str(NPROC[name]), "--timeout", "400", str(EXAMPLES / f"{name}.py")],
             tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
