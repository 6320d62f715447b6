"""The public-NKI corpus harness (benchmarks/nki_corpus.py) judges each test on its own."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _harness():
    spec = importlib.util.spec_from_file_location("nki_corpus", ROOT / "benchmarks" / "nki_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["nki_corpus"] = module
    spec.loader.exec_module(module)
    return module


def test_a_test_that_kills_its_process_fails_alone_and_the_rest_still_run(tmp_path, capsys):
    c = _harness()
    tree = tmp_path / "tree"
    (tree / "t").mkdir(parents=True)
    (tree / "t" / "test_some.py").write_text(
        "import os, signal\n"
        "def test_a():\n    pass\n"
        "def test_dies():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        "def test_c():\n    pass\n"
        "def test_d():\n    assert False, 'its own failure'\n")
    runner = c.Runner(tmp_path / "scratch", timeout=60, budget=None, plain=False)
    part = c.Part("unit", "HEAD", ("t",), "pytest")
    runner.run_pytest(c.Source("demo", "none", (part,)), part, tree)
    got = {i.item.rsplit("::", 1)[1]: (i.outcome, i.reason) for i in runner.items}
    assert {k: v[0] for k, v in got.items()} == {"test_a": "passed", "test_dies": "failed", "test_c": "passed",
                                                 "test_d": "failed"}
    assert "ended (exit status -9)" in got["test_dies"][1] and "its own failure" in got["test_d"][1]
