"""The reliability suite's probes, counted by group: right answers against wrong ones.

Every test in ``tests/reliability`` is one probe: a hostile or bad input against a
public entry point, which passes only when trnsim gives the CPU's (or numpy's) answer
or one clear error naming the bad value. This script runs the suite and counts the
probes that pass (right) and those that fail, error or hang (wrong), by file.

With ``--before REV`` it also runs today's suite against the source tree of an earlier
commit (a temporary git worktree with today's ``tests/reliability`` copied in), so the
same probes are counted before and after in one run. A name of trnsim that a probe
imports and the earlier tree lacks (an error class, a module added since) is given to
it as a placeholder that fails wherever it is used (it is never raised, and calling it
raises), so each probe is judged on its own rather than its whole file failing to load.

Run: ``python benchmarks/reliability.py --before e9c5f5b``
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "tests/reliability"


def probe_ids(tree: Path) -> list[str]:
    """The node ids of every probe in ``tree``'s suite."""
    out = subprocess.run([sys.executable, "-m", "pytest", SUITE, "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=600)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    if not ids:
        raise SystemExit(f"no probes collected in {tree}:\n{out.stdout}\n{out.stderr}")
    return ids


def run_suite(tree: Path, ids: list[str], timeout_s: int, placeholders: bool = False) -> dict[str, str]:
    """Outcome ('passed', 'failed', 'error', 'skipped' or 'crashed') of each probe run in
    ``tree``. A probe that kills the interpreter (a segmentation fault) is marked crashed
    and the run goes on from the probe after it."""
    with tempfile.TemporaryDirectory() as tmp:
        shim = None
        if placeholders:
            shim = Path(tmp) / "shim"
            shim.mkdir()
            (shim / "sitecustomize.py").write_text(_PLACEHOLDERS)
        outcomes: dict[str, str] = {}
        while len(outcomes) < len(ids):
            done = [f"--deselect={node}" for node in outcomes]
            run = subprocess.run([sys.executable, "-m", "pytest", SUITE, "-v", "-p", "no:cacheprovider",
                                  f"--timeout={timeout_s}", *done],
                                 cwd=tree, env=_env(tree, shim), capture_output=True, text=True, timeout=3600)
            before = len(outcomes)
            for line in run.stdout.splitlines():
                match = _RESULT.match(line)
                if match and match["node"] in ids:
                    outcomes.setdefault(match["node"], match["outcome"].lower())
            if run.returncode in (0, 1) and len(outcomes) == before:
                break   # nothing more to learn: the rest were not collected
            if run.returncode not in (0, 1):   # it died: the first probe not reported is the one
                rest = [node for node in ids if node not in outcomes]
                if rest:
                    outcomes[rest[0]] = "crashed"
        return outcomes


_RESULT = re.compile(r"^(?P<node>\S+::\S+(?:\[.*\])?) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)")


def _env(tree: Path, shim: Path | None = None) -> dict[str, str]:
    path = os.pathsep.join(str(p) for p in (shim, tree) if p is not None)
    return {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}


# Loaded as sitecustomize in the earlier tree's runs only: names of trnsim the earlier
# tree lacks become placeholders (see the module docstring).
_PLACEHOLDERS = '''
import builtins, importlib.machinery, sys, types

class _MissingMeta(type):
    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"{cls.__name__} does not exist in this tree")

class _Missing(Exception, metaclass=_MissingMeta):
    pass

def _placeholder(name):
    return _MissingMeta(name, (_Missing,), {})

class _Finder:
    def find_spec(self, name, path=None, target=None):
        if not name.startswith("trnsim.") or name in sys.modules:
            return None
        sys.meta_path.remove(self)
        try:
            found = importlib.machinery.PathFinder.find_spec(name, path)
        finally:
            sys.meta_path.append(self)
        return None if found is not None else importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__getattr__ = _placeholder
        return module

    def exec_module(self, module):
        pass

sys.meta_path.append(_Finder())
_import = builtins.__import__

def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    module = _import(name, globals, locals, fromlist, level)
    if fromlist and getattr(module, "__name__", "").startswith("trnsim"):
        for attr in fromlist:
            if attr != "*" and not hasattr(module, attr):
                try:
                    _import(f"{module.__name__}.{attr}")
                except ImportError:
                    pass
                if not hasattr(module, attr):
                    setattr(module, attr, _placeholder(attr))
    return module

builtins.__import__ = _guarded_import
'''


def tally(ids: list[str], outcomes: dict[str, str]) -> dict[str, Counter]:
    groups: dict[str, Counter] = {}
    for node in ids:
        group = Path(node.split("::")[0]).stem.removeprefix("test_")
        outcome = outcomes.get(node, "error")
        groups.setdefault(group, Counter())[outcome] += 1
    return groups


def before_tree(rev: str, dest: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(dest), rev], cwd=ROOT, check=True)
    shutil.rmtree(dest / SUITE, ignore_errors=True)
    shutil.copytree(ROOT / SUITE, dest / SUITE, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "tests" / "__init__.py", dest / "tests" / "__init__.py")
    return dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REV", help="also count the probes against this earlier commit")
    parser.add_argument("--timeout", type=int, default=120, help="seconds a probe may take before it counts as a hang")
    args = parser.parse_args()

    ids = probe_ids(ROOT)
    after = tally(ids, run_suite(ROOT, ids, args.timeout))
    before = None
    if args.before:
        with tempfile.TemporaryDirectory() as tmp:
            tree = before_tree(args.before, Path(tmp) / "before")
            try:
                before = tally(ids, run_suite(tree, ids, args.timeout, placeholders=True))
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)

    def right(c: Counter) -> int:
        return c["passed"]

    def wrong(c: Counter) -> int:
        return c["failed"] + c["error"] + c["crashed"]

    header = f"{'group':<22}{'probes':>7}"
    header += f"{'right before':>14}{'wrong before':>14}" if before else ""
    header += f"{'right now':>11}{'wrong now':>11}{'skipped':>9}"
    print(header)
    totals = [Counter(), Counter()]
    for group in sorted(after):
        n = sum(after[group].values())
        row = f"{group:<22}{n:>7}"
        if before:
            b = before.get(group, Counter())
            row += f"{right(b):>14}{wrong(b):>14}"
            totals[0] += b
        a = after[group]
        row += f"{right(a):>11}{wrong(a):>11}{a['skipped']:>9}"
        totals[1] += a
        print(row)
    n = sum(totals[1].values())
    row = f"{'all':<22}{n:>7}"
    if before:
        row += f"{right(totals[0]):>14}{wrong(totals[0]):>14}"
    row += f"{right(totals[1]):>11}{wrong(totals[1]):>11}{totals[1]['skipped']:>9}"
    print(row)
    print(f"right answers: {right(totals[1]) / n:.1%} of {n} probes now"
          + (f", {right(totals[0]) / n:.1%} before ({args.before})" if before else ""))
    return 0 if wrong(totals[1]) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
