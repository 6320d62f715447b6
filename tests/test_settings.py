"""The TRNSIM_* variables and the --chip/--instance flags: one clear error that names where
a bad value came from and the values it takes; names trnsim defines in any case."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import trnsim
from tests.reliability.conftest import assert_one_line_error, clean_error, cli, cli_process
from trnsim import settings
from trnsim.errors import ChipSpecError, ConfigError

ROOT = Path(__file__).resolve().parents[1]

# a plain script: no trnsim import, the device autoloaded by `import torch`
SCRIPT = textwrap.dedent("""
    import torch
    x = torch.ones(4, device="neuron")
    print((x + 1).sum().item())
""")


def _plain_script(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(SCRIPT)
    full = {k: v for k, v in os.environ.items() if not k.startswith("TRNSIM_")}
    full.update(env, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=full, timeout=300)


@pytest.mark.parametrize("name, value, fragments", [
    ("TRNSIM_CHIP", "trn-2", ("did you mean 'trn2'?", "trn1, trn2, trn3")),
    ("TRNSIM_FIDELITY", "instrution", ("did you mean 'instruction'?", "op, instruction, timing")),
    ("TRNSIM_INSTANCE", "trn2.48xlarg", ("did you mean 'trn2.48xlarge'?",)),
    ("TRNSIM_DIST_TIMEOUT", "soon", ("not a number of seconds",)),
    ("TRNSIM_PROGRESS", "maybe", ("one of: 0, 1",)),
])
def test_a_plain_script_stops_at_its_first_device_op_with_one_line(tmp_path, name, value, fragments):
    """A bad variable gave a 17-23 line traceback from inside dispatch."""
    r = _plain_script(tmp_path, {name: value})
    assert r.returncode == 1, r.stdout
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(("trnsim.errors.ConfigError: ", "trnsim.errors.ChipSpecError: ")), r.stderr
    for fragment in (f"{name}={value!r}", *fragments):
        assert fragment in lines[-1], r.stderr
    # the script's own line and the one frame that raises, nothing from deeper inside
    assert len(lines) <= 8, r.stderr
    assert 'File "' + str(tmp_path / "script.py") + '", line 3' in r.stderr


def test_names_trnsim_defines_are_taken_in_any_case(tmp_path):
    r = _plain_script(tmp_path, {"TRNSIM_CHIP": "Trn2", "TRNSIM_FIDELITY": "Instruction"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "8.0"
    assert trnsim.load_chip("TRN1").name == "trn1"
    assert settings.fidelity("Timing", "x") == "timing"
    assert settings.instance("TRN2.48xlarge", "x") == "trn2.48xlarge"


def test_a_misspelt_variable_name_is_warned_of(monkeypatch):
    monkeypatch.setenv("TRNSIM_FIDELTY", "timing")
    with pytest.warns(settings.SettingWarning, match="TRNSIM_FIDELTY .*did you mean 'TRNSIM_FIDELITY'"):
        settings.check()


def test_every_variable_the_code_reads_is_known_to_the_check():
    """A variable read somewhere but missing from settings.VARIABLES would be warned of as a typo."""
    import re

    read = set()
    for path in (ROOT / "trnsim").rglob("*.py"):
        read.update(re.findall(r"\"(TRNSIM_[A-Z_]+)\"", path.read_text()))
    read.update(re.findall(r"\"(TRNSIM_[A-Z_]+)\"", (ROOT / "tests" / "test_nki_trace_exact.py").read_text()))
    assert read <= set(settings.VARIABLES), read - set(settings.VARIABLES)


@pytest.mark.parametrize("flag, value, fragment", [
    ("--chip", "trn-2", "--chip 'trn-2': unknown chip 'trn-2'; did you mean 'trn2'?"),
    ("--instance", "trn2.48xl", "--instance 'trn2.48xl' is not an instance of a shipped chip; did you mean"),
])
def test_run_names_the_flag_not_the_variable(tmp_path, flag, value, fragment):
    """`trnsim run --chip Trn2` blamed TRNSIM_CHIP, which the user never set."""
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    rc, out, err = cli("run", "--no-trace", flag, value, str(script))
    assert_one_line_error(rc, err, fragment)
    assert "TRNSIM_" not in err and out == ""


@pytest.mark.parametrize("env", [{}, {"TRNSIM_CHIP": "trn9"}])
def test_run_takes_a_chip_name_in_any_case_and_over_the_variable(tmp_path, env):
    script = tmp_path / "s.py"
    script.write_text("import torch\nprint('chip', torch.neuron.chip().name, torch.neuron.fidelity())\n")
    r = cli_process("run", "--no-trace", "--chip", "Trn1", "--fidelity", "Timing", str(script), env=env)
    assert r.returncode == 0, r.stderr
    assert "chip trn1 timing" in r.stdout


def test_set_chip_names_its_argument():
    import torch

    clean_error(lambda: torch.neuron.set_chip("trn-2"), "set_chip('trn-2')", "did you mean 'trn2'?",
                types=ChipSpecError)


def test_a_bad_timeout_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("TRNSIM_DIST_TIMEOUT", "-5")
    clean_error(settings.check, "TRNSIM_DIST_TIMEOUT='-5'", "positive number of seconds", types=ConfigError)


def test_report_and_diff_read_saved_traces_whatever_the_chip_variable_says(tmp_path):
    """A stale TRNSIM_CHIP stops what simulates, not the commands that only read traces."""
    import torch

    path = tmp_path / "t.json"
    with trnsim.profile(str(path)):
        (torch.ones(4, device="neuron") + 1).cpu()
    rc, out, err = cli("report", str(path), env={"TRNSIM_CHIP": "trn-2"})
    assert (rc, err) == (0, "") and out.startswith("program")
    rc, out, err = cli("diff", str(path), str(path), env={"TRNSIM_CHIP": "trn-2"})
    assert (rc, err) == (0, "")
    rc, _, err = cli("demo", env={"TRNSIM_CHIP": "trn-2"})
    assert rc == 2 and "TRNSIM_CHIP='trn-2'" in err
