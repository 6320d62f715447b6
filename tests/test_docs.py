"""The outputs README.md and docs/*.md show are what their commands print today.

Every block marked ``<!-- output: COMMAND -->`` (docs/build.py) is run as a user would
run it, in a temporary folder, and compared with the committed text up to the host's
rounding noise and host times (tests/printed.py). A block that drifted names the
document and the command to rebuild it with.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.printed import differences

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_build", REPO / "docs" / "build.py")
build = sys.modules["docs_build"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

# documents whose commands take minutes (Hugging Face training on 8 ranks): -m slow,
# which .ci/run runs
SLOW = {"docs/huggingface.md"}
MARKED = [p for p in build.DOCUMENTS if build.blocks(p.read_text(), p)]


def test_the_outputs_users_read_first_are_generated():
    """The README's demos and the profiling guide's summary come from their commands."""
    names = {p.relative_to(REPO).as_posix() for p in MARKED}
    assert {"README.md", "docs/profiling.md", "docs/compile.md"} <= names
    readme = " | ".join(b.command for b in build.blocks((REPO / "README.md").read_text(), REPO / "README.md"))
    for command in ("trnsim demo", "trnsim demo llama", "trnsim run examples/train_mlp.py"):
        assert command in readme


def test_select_keeps_the_named_lines_and_marks_each_cut():
    out = "a\n  b\n  c\n  d\ne\nf\n"
    assert build.select(out, None) == "a\n  b\n  c\n  d\ne\nf"
    assert build.select(out, "1,4-") == "a\n  ...\n  d\ne\nf"
    assert build.select(out, "1-2,6") == "a\n  b\n  ...\nf"


def test_a_marker_without_its_block_is_refused(tmp_path):
    doc = tmp_path / "x.md"
    with pytest.raises(SystemExit, match=r"x\.md:1: an output marker must stand just before a fenced block"):
        build.blocks("<!-- output: trnsim demo -->\ntext\n", doc)
    with pytest.raises(SystemExit, match="needs a python block just above it"):
        build.blocks("text\n<!-- output: python (the block above) -->\n```\n```\n", doc)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.slow) if p.relative_to(REPO).as_posix() in SLOW else p for p in MARKED
], ids=lambda p: p.relative_to(REPO).as_posix())
def test_document_shows_what_its_commands_print(path):
    found = build.blocks(path.read_text(), path)
    workspace = build.Workspace()
    try:
        drifted = []
        for block in found:
            printed = workspace.run(block)
            if diffs := differences(block.shown, printed):
                drifted.append(f"{block.command}:\n  " + "\n  ".join(diffs))
    finally:
        workspace.close()
    assert not drifted, (f"{path.relative_to(REPO)} shows outputs its commands no longer print; run "
                         f"`python docs/build.py {path.relative_to(REPO)}`, check the text around them, and "
                         "commit it:\n" + "\n".join(drifted))
