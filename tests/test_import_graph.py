"""The package's import graph (tools/check_imports.py): no import cycle between modules
and no import up the layers that docs/architecture.md documents; and the check itself
finds what it must (a cycle made by an import inside a function, an upward import), and
ignores what never runs (imports under ``if TYPE_CHECKING:``)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _checker():
    spec = importlib.util.spec_from_file_location("check_imports", REPO / "tools" / "check_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_package_has_no_import_cycle_and_no_upward_import():
    found, up = _checker().check(REPO / "trnsim")
    assert found == [], f"import cycles: {found}"
    assert up == [], "imports up the layers:\n" + "\n".join(up)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "trnsim"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


LAYERS = [("low", ("trnsim.low",)), ("high", ("trnsim.high",)), ("top", ("trnsim",))]


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "from trnsim.low import b\n",
        "low/b.py": "def f():\n    from trnsim.low.a import x\n",
    })
    found, up = _checker().check(root, LAYERS)
    assert found == [["trnsim.low.a", "trnsim.low.b"]] and up == []


def test_an_import_up_the_layers_is_found_and_type_checking_imports_are_not(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from trnsim import high\n",
        "low/__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trnsim.high import h\n",
        "low/l.py": "import trnsim.high.h\n",
        "high/__init__.py": "",
        "high/h.py": "from ..low import l\n",
    })
    found, up = _checker().check(root, LAYERS)
    assert found == [["trnsim.high.h", "trnsim.low.l"]]
    assert len(up) == 1 and up[0].startswith("trnsim.low.l (layer 'low') imports trnsim.high.h (layer 'high')")


def test_a_module_in_no_layer_is_refused(tmp_path):
    root = _package(tmp_path, {"__init__.py": "", "stray.py": ""})
    with pytest.raises(ValueError, match="is in no layer"):
        _checker().check(root, [("low", ("trnsim.low",))])


def test_the_architecture_document_lists_the_layers_in_order():
    """docs/architecture.md's layer table names the checker's layers, lowest first, with
    the same module prefixes."""
    text = (REPO / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| ([^|]+?) \| ([^|]+?) \|", text, re.M)
    documented = [(name.strip(), tuple(re.findall(r"`([\w.]+)`", prefixes))) for _, name, prefixes in rows]
    assert documented == _checker().LAYERS
