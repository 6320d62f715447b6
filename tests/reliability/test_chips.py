"""Chip files: every bad file is one ChipSpecError naming the file, key and value;
every accepted file gives a spec whose figures are finite and physically sensible;
edits to any file of an ``extends`` chain are seen by the next load."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trnsim import ChipSpecError, load_chip
from trnsim.hw.spec import CHIPS_DIR, MAX_EXTENDS_DEPTH, ChipSpec, tomllib

from tests.reliability.conftest import assert_one_line_error, clean_error, cli

ROOT = Path(__file__).resolve().parents[2]
BAD = 'extends = "trn2"\n[hbm]\nbw_gbps = nan\n'


# -- a small TOML writer for mutated chip files ------------------------------------


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {_value(x)}" for k, x in v.items()) + "}"


def _toml(data: dict) -> str:
    lines = [f"{json.dumps(k)} = {_value(v)}" for k, v in data.items()
             if not isinstance(v, dict) and not (isinstance(v, list) and v and all(isinstance(t, dict) for t in v))]
    for key, table in data.items():
        if isinstance(table, dict):
            lines += [f"[{json.dumps(key)}]"] + [f"{json.dumps(k)} = {_value(v)}" for k, v in table.items()]
        elif isinstance(table, list) and table and all(isinstance(t, dict) for t in table):
            for t in table:
                lines += [f"[[{json.dumps(key)}]]"] + [f"{json.dumps(k)} = {_value(v)}" for k, v in t.items()]
    return "\n".join(lines) + "\n"


def test_the_writer_round_trips_a_shipped_chip():
    data = tomllib.loads((CHIPS_DIR / "trn1.toml").read_text())
    assert tomllib.loads(_toml(data)) == data


# -- the property: load, then sane; or one clean error --------------------------------

BASE = tomllib.loads((CHIPS_DIR / "trn1.toml").read_text())
SLOTS = [(t, k) for t, table in BASE.items() if isinstance(table, dict) for k in table] + \
    [("instance", k) for k in BASE["instance"][0]]
HOSTILE = [math.inf, -math.inf, math.nan, -1, 0, -0.0, 1e300, 10**20, 2**63, 1.5, 128.0, "x", "", True, [1], {"a": 1}]


def _assert_sane(chip: ChipSpec) -> None:
    """Independent bounds: every figure finite, non-negative and below absurd; sizes positive."""
    def walk(obj: object, where: str) -> None:
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                walk(getattr(obj, f.name), f"{where}.{f.name}")
        elif isinstance(obj, tuple):
            for i, x in enumerate(obj):
                walk(x, f"{where}[{i}]")
        elif isinstance(obj, (int, float)):
            assert not isinstance(obj, bool) and math.isfinite(obj) and 0 <= obj <= 1e9, (where, obj)
        else:
            assert isinstance(obj, str) and "\n" not in obj, (where, obj)
    walk(chip, "chip")
    assert 0 < chip.device_hbm_bytes <= chip.hbm.capacity_bytes <= 2**47
    for clock in (chip.tensor_engine.clock_ghz, chip.vector_engine.clock_ghz, chip.gpsimd.clock_ghz):
        assert 0.001 <= clock <= 1000
    assert chip.hbm.bw_gbps > 0 and chip.dma_bw_gbps > 0 and chip.psum.bank_bytes > 0
    assert 1 <= chip.sbuf.partitions <= 4096 and 1 <= chip.sbuf.partition_bytes <= 2**30
    assert all(math.prod(i.shape) == i.chips for i in chip.instances)
    assert math.isfinite(chip.tensor_engine.peak_flops(fp32=True))


@st.composite
def mutated_files(draw: st.DrawFn) -> dict:
    data = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(0, 3))):
        table, key = draw(st.sampled_from(SLOTS))
        if table == "instance":  # the array of tables: mutate its first entry
            data["instance"][0][key] = draw(st.sampled_from(HOSTILE))
            continue
        action = draw(st.sampled_from(["replace", "delete", "add", "scale"]))
        if action == "replace":
            data[table][key] = draw(st.sampled_from(HOSTILE))
        elif action == "delete":
            data[table].pop(key, None)
        elif action == "add":
            data[draw(st.sampled_from([table, "chip", "hmb"]))] = {draw(st.sampled_from(["x", key + "s", "extends"])): 1}
        elif isinstance(data[table].get(key), (int, float)) and not isinstance(data[table].get(key), bool):
            data[table][key] = data[table][key] * draw(st.sampled_from([2, 10, 1000, 0.5, 1e-3]))
    return data


@st.composite
def overlays(draw: st.DrawFn) -> dict:
    """What a file extending the base writes: a few figures, or a whole table replaced."""
    overlay: dict = {}
    for _ in range(draw(st.integers(0, 3))):
        table, key = draw(st.sampled_from(SLOTS))
        if draw(st.booleans()):  # a table or the [[instance]] array replaced by a value of another shape
            overlay[draw(st.sampled_from(["instance", "hbm", "chip"]))] = draw(st.sampled_from([3, [1], {"a": 1}, [{"a": 1}]]))
        elif table != "instance" and isinstance(overlay.setdefault(table, {}), dict):
            overlay[table][key] = draw(st.sampled_from(HOSTILE))
    return overlay


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated_files(), overlay=overlays(), depth=st.integers(0, 18))   # past the bound of 16 files
def test_mutated_chip_files_load_sane_or_fail_cleanly(tmp_path_factory, data, overlay, depth):
    assert MAX_EXTENDS_DEPTH == 16
    folder = tmp_path_factory.mktemp("chips")
    (folder / "base.toml").write_text(_toml(data))
    for i in range(depth):  # a chain: top0 -> top1 -> ... -> base; top0 writes the overlay
        parent = f"top{i + 1}.toml" if i + 1 < depth else "base.toml"
        (folder / f"top{i}.toml").write_text(f'extends = "{parent}"\n' + (_toml(overlay) if i == 0 else ""))
    path = folder / ("top0.toml" if depth else "base.toml")
    try:
        chip = load_chip(path)
    except ChipSpecError as e:
        msg = str(e)
        assert "\n" not in msg and str(folder) in msg, msg
        if depth + 1 > MAX_EXTENDS_DEPTH:
            assert "deeper than 16 files" in msg
        return
    assert depth + 1 <= MAX_EXTENDS_DEPTH
    _assert_sane(chip)


# -- named bad files ---------------------------------------------------------------


@pytest.mark.parametrize("body, fragments", [
    (b'extends = "trn2"\n# \xff\xfe\n', ["not valid UTF-8", "offset 19"]),
    (b'extends = "trn2"\n[hbm\n', ["not valid TOML"]),
    (b'extends = "trn2"\n[hbm]\nbw_gpbs = 3\n', ["unknown key 'hbm.bw_gpbs'", "did you mean 'bw_gbps'"]),
    (b'extends = "trn2"\n[tensor_engine]\nclock_ghz = 1e9\n', ["'tensor_engine.clock_ghz'", "1000000000.0", "to 100 (GHz)"]),
    (b'extends = "trn2"\n[chip]\nlogical_core_size = 16\n', ["'chip.logical_core_size' is 16", "1, 2, 4, 8"]),
    (b'extends = "trn2"\n[hbm]\ncapacity_gib = 1e30\n', ["'hbm.capacity_gib' is 1e+30", "65,536 (GiB)"]),
    (b'extends = "trn2"\n[sbuf]\npartition_kib = "224"\n', ["'sbuf.partition_kib' is '224' (a string)"]),
    (b'extends = "trn2"\n' + b'#' * (2 << 20), ["larger than 1024 KiB"]),
    (b'extends = "trn2"\n[sbuf]\npartitions = ' + b'9' * 5000 + b'\n', ["not valid TOML"]),
])
def test_bad_file_is_one_clean_error(tmp_path, body, fragments):
    path = tmp_path / "bad.toml"
    path.write_bytes(body)
    err = clean_error(lambda: load_chip(path), str(path), *fragments, types=ChipSpecError)
    assert "\n" not in str(err)


def test_bad_figure_in_a_parent_names_the_parent(tmp_path):
    (tmp_path / "parent.toml").write_text('extends = "trn2"\n[hbm]\ncapacity_gib = -96\n')
    (tmp_path / "child.toml").write_text('extends = "parent.toml"\n[chip]\nname = "child"\n')
    clean_error(lambda: load_chip(tmp_path / "child.toml"), f"{tmp_path / 'parent.toml'}: key 'hbm.capacity_gib' is -96",
                types=ChipSpecError)


def test_extends_chain_is_bounded_and_cycles_are_named(tmp_path):
    for i in range(1500):  # deeper than Python's recursion limit
        (tmp_path / f"c{i}.toml").write_text(f'extends = "c{i + 1}.toml"\n' if i < 1499 else 'extends = "trn2"\n')
    clean_error(lambda: load_chip(tmp_path / "c0.toml"), "chain is deeper than 16 files", types=ChipSpecError)
    # every file counts, the shipped trn2 and trn1 too: c1486 ... c1499, trn2, trn1 is 16 files
    assert load_chip(tmp_path / "c1486.toml").name == "trn2"
    clean_error(lambda: load_chip(tmp_path / "c1485.toml"), "c1485.toml: 'extends' chain is deeper", types=ChipSpecError)
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    clean_error(lambda: load_chip(tmp_path / "a.toml"), "forms a cycle", "a.toml -> ", types=ChipSpecError)


def test_extends_is_relative_to_the_extending_file(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "base.toml").write_text('extends = "trn1"\n[chip]\nname = "base"\n')
    (tmp_path / "sub" / "top.toml").write_text('extends = "base.toml"\n[chip]\nname = "top"\n')
    monkeypatch.chdir(tmp_path)
    assert load_chip("sub/top.toml").name == "top"
    clean_error(lambda: load_chip("sub/nope.toml"), "chip file sub/nope.toml does not exist", types=ChipSpecError)


def test_spec_built_in_code_is_checked_too():
    trn2 = load_chip("trn2")
    clean_error(lambda: dataclasses.replace(trn2.hbm, capacity_gib=math.inf), "HbmSpec: key 'capacity_gib' is inf",
                types=ChipSpecError)
    clean_error(lambda: dataclasses.replace(trn2, logical_core_size=16), "key 'logical_core_size' is 16",
                types=ChipSpecError)


# -- the cache: an edit anywhere in the chain is seen ------------------------------


def test_editing_a_parent_reloads_the_child(tmp_path):
    parent, child = tmp_path / "parent.toml", tmp_path / "child.toml"
    parent.write_text('extends = "trn2"\n[hbm]\nbw_gbps = 1000\n')
    child.write_text('extends = "parent.toml"\n[chip]\nname = "child"\n')
    first = load_chip(child)
    assert first.hbm.bw_gbps == 1000 and load_chip(child) is first  # unchanged: the same spec
    parent.write_text('extends = "trn2"\n[hbm]\nbw_gbps = 2000\n')
    os.utime(child, ns=(0, 0))  # the child's own stamp says nothing about its parent
    assert load_chip(child).hbm.bw_gbps == 2000
    parent.write_text('extends = "trn2"\n[hbm]\nbw_gbps = inf\n')
    clean_error(lambda: load_chip(child), str(parent), "'hbm.bw_gbps' is inf", types=ChipSpecError)
    parent.unlink()
    clean_error(lambda: load_chip(child), "parent.toml does not exist", types=ChipSpecError)


# -- the entry points: CLI and the device ---------------------------------------------


@pytest.mark.parametrize("command", [["chips"], ["demo", "--size", "128", "128", "512", "--trace", "{tmp}/t.json"]])
def test_cli_refuses_a_bad_chip_in_one_line(tmp_path, command):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    rc, _, err = cli(*(arg.format(tmp=tmp_path) for arg in command), "--chip", str(bad))
    assert_one_line_error(rc, err, str(bad), "'hbm.bw_gbps' is nan")
    assert len(err.strip().splitlines()) == 1


def test_device_with_a_bad_chip_raises_one_clear_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    env = {**os.environ, "TRNSIM_CHIP": str(bad), "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", "import torch; torch.ones(2, device='neuron')"], env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("Traceback") == 1 and "During handling" not in proc.stderr, proc.stderr
    assert "direct cause" not in proc.stderr, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"trnsim.errors.ChipSpecError: {bad}: key 'hbm.bw_gbps' is nan (a float); " \
                   "allowed: a finite number from 0.1 to 1,000,000 (GB/s)", proc.stderr
