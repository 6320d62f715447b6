"""Write the outputs shown in README.md and docs/*.md from real runs.

    python docs/build.py                  # every marked block of every document
    python docs/build.py docs/profiling.md
    python docs/build.py --check          # print the blocks that drifted, change nothing

A fenced block whose output a command prints is marked, on the line before it, with the
command that prints it:

    <!-- output: trnsim run examples/train_mlp.py -->
    <!-- output[1-4,7-9]: trnsim demo -->          only those lines, "..." where cut
    <!-- output: python (the block above) -->      the python block just above
    <!-- output: $ python a.py ;; $ trnsim run b.py -->  a session: each command, then its output

The commands of one document run in order, through bash, in one temporary folder that
holds links to the repository's ``examples``, ``trnsim`` and ``tests`` and an empty
``traces``; its python blocks run in one interpreter, as a notebook's cells, so a block
uses what the blocks before it defined. The traces the commands write (and the paths
they print) are those a user would see, and the repository stays clean. tests/test_docs.py runs them too and fails when a block no
longer shows what its command prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.printed import differences  # noqa: E402 - the repository's own comparison
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- output(?:\[(?P<lines>[\d,\- ]+)\])?: (?P<command>.+?) -->$")
ABOVE = "python (the block above)"
TIMEOUT_S = 900


@dataclass
class Block:
    """One marked block: the command, the lines of its output shown, and where the
    block's text sits in the document (``start``/``end``: the line indices of its
    fences)."""

    command: str
    lines: str | None
    script: str | None   # the python block above, for ABOVE
    start: int
    end: int
    shown: str
    output: str = ""


def blocks(text: str, path: Path) -> list[Block]:
    """The marked blocks of a document, in order."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        if not (m := MARKER.match(line)):
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            raise SystemExit(f"{path}:{i + 1}: an output marker must stand just before a fenced block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise SystemExit(f"{path}:{i + 2}: the fenced block after the marker is not closed")
        script = _block_above(lines, i, path) if m["command"] == ABOVE else None
        found.append(Block(m["command"], m["lines"], script, i + 1, end, "\n".join(lines[i + 2:end])))
    return found


def _block_above(lines: list[str], marker: int, path: Path) -> str:
    end = marker - 1
    while end >= 0 and not lines[end].strip():
        end -= 1
    if end < 0 or lines[end] != "```":
        raise SystemExit(f"{path}:{marker + 1}: {ABOVE!r} needs a python block just above it")
    start = max(j for j in range(end) if lines[j].startswith("```"))
    if lines[start] != "```python":
        raise SystemExit(f"{path}:{start + 1}: {ABOVE!r} runs a ```python block, not {lines[start]!r}")
    return "\n".join(lines[start + 1:end]) + "\n"


def select(output: str, spec: str | None) -> str:
    """The lines of ``output`` that ``spec`` names (``1-4,7,9-``, counted from 1), each
    run of left-out lines shown as ``...`` indented as its first line."""
    lines = output.rstrip("\n").split("\n")
    if spec is None:
        return "\n".join(lines)
    keep = set()
    for part in spec.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        first = int(lo)
        last = len(lines) if part.endswith("-") else int(hi or lo)
        keep.update(range(first, last + 1))
    shown, cut = [], False
    for n, line in enumerate(lines, 1):
        if n in keep:
            shown.append(line)
            cut = False
        elif not cut:
            shown.append(line[:len(line) - len(line.lstrip())] + "...")
            cut = True
    return "\n".join(shown)


# Runs the python blocks of one document in one interpreter, one after another, as the
# cells of a notebook (a later block uses what an earlier one defined): each block comes
# as one JSON line on stdin; SENTINEL and "ok" or "error" follow its output.
SENTINEL = "\x00trnsim-docs-block-end "
_SESSION = f"""
import json, sys, traceback
scope = {{"__name__": "__main__"}}
for line in sys.stdin:
    try:
        exec(compile(json.loads(line), "<doc block>", "exec"), scope)
        status = "ok"
    except BaseException:
        traceback.print_exc()
        status = "error"
    sys.stdout.flush(); sys.stderr.flush()
    print("\\n" + {SENTINEL!r} + status, flush=True)
"""


class Workspace:
    """The temporary folder a document's commands run in (see the module docstring)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="trnsim-docs-")
        self.path = Path(self._dir.name)
        for name in ("examples", "trnsim", "tests"):
            (self.path / name).symlink_to(REPO / name)
        (self.path / "traces").mkdir()
        self.env = dict(os.environ, TRNSIM_PROGRESS="0", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        for name in [n for n in self.env if n.startswith("TRNSIM_") and n != "TRNSIM_PROGRESS"]:
            self.env.pop(name)   # the outputs are those of the defaults, whatever the caller's shell sets
        self._python: subprocess.Popen | None = None

    def run(self, block: Block) -> str:
        """What the block's command prints on standard output (a python block: both
        streams)."""
        if block.script is not None:
            return select(self._run_python(block.script), block.lines)
        if not block.command.startswith("$ "):
            return select(self._run_shell(block.command), block.lines)
        # a session: each "$ command" shown, then what it printed
        session = [f"{command}\n{self._run_shell(command.removeprefix('$ ').strip()).rstrip()}"
                   for command in block.command.split(" ;; ")]
        return select("\n\n".join(session), block.lines)

    def _run_shell(self, command: str) -> str:
        # standard output only: warnings and libraries' progress bars go to standard error
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=self.path, env=self.env,
                              text=True, capture_output=True, timeout=TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{command!r} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def _run_python(self, script: str) -> str:
        if self._python is None:
            self._python = subprocess.Popen([sys.executable, "-c", _SESSION], cwd=self.path, env=self.env, text=True,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert self._python.stdin is not None and self._python.stdout is not None
        self._python.stdin.write(json.dumps(script) + "\n")
        self._python.stdin.flush()
        lines = []
        timer = threading.Timer(TIMEOUT_S, self._python.kill)   # a block that hangs ends the session
        timer.start()
        try:
            for line in self._python.stdout:
                if line.startswith(SENTINEL):
                    if line[len(SENTINEL):].strip() != "ok":
                        raise RuntimeError(f"a python block failed:\n{script}\n{''.join(lines)}")
                    # the newline printed before the sentinel, so that it starts a line
                    return "".join(lines)[:-1]
                lines.append(line)
        finally:
            timer.cancel()
        raise RuntimeError(f"the python session ended while running:\n{script}\n{''.join(lines)}")

    def close(self) -> None:
        if self._python is not None:
            self._python.stdin.close()
            try:
                self._python.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._python.kill()
                self._python.wait()
        self._dir.cleanup()


def build(path: Path, check: bool = False) -> list[str]:
    """Run the marked blocks of ``path`` and write their outputs into it (or, with
    ``check``, only say which differ). A block that differs only by the host's rounding
    noise or host times (tests/printed.py) is left as it is, so a rebuild changes
    nothing but real drift. Returns the commands whose blocks changed."""
    text = path.read_text()
    lines = text.split("\n")
    changed = []
    workspace = Workspace()
    try:
        for block in reversed_after_running(blocks(text, path), workspace):
            if differences(block.shown, block.output):
                changed.append(block.command)
                lines[block.start + 1:block.end] = block.output.split("\n")
    finally:
        workspace.close()
    if changed and not check:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("\n".join(lines))
        tmp.replace(path)
    return changed


def reversed_after_running(found: list[Block], workspace: Workspace) -> list[Block]:
    """Run every block in document order (later commands read what earlier ones wrote),
    then hand them back last first, so replacing one block's lines leaves the line
    numbers of the blocks still to replace as they were."""
    for block in found:
        block.output = workspace.run(block)
    return list(reversed(found))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("documents", nargs="*", type=Path, help="documents to build (default: README.md, docs/*.md)")
    parser.add_argument("--check", action="store_true", help="only list the blocks that drifted")
    args = parser.parse_args(argv)
    drifted = 0
    for path in args.documents or DOCUMENTS:
        for command in build(path.resolve(), check=args.check):
            drifted += 1
            print(f"{path}: {'differs' if args.check else 'rewrote'}: {command}")
    return 1 if args.check and drifted else 0


if __name__ == "__main__":
    sys.exit(main())
