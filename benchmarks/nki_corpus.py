"""AWS's public NKI code, run unedited on trnsim: how many items pass (issue 23).

The corpus is three public repositories, already fetched as bare git directories
(``fetch`` puts them under ``/work/.mirror/<owner>+<name>/repo``; ``--mirror`` moves
the root). Each part of a source is extracted at the commit a user would have taken
(``git archive <commit> <paths> | tar -x``) into a scratch folder, run there, and the
folder is deleted at the end (``--keep`` keeps it). No public code is copied into the
repository and nothing is installed by the harness: what the public code imports
besides NKI (scipy, ml_dtypes, pytest-html and nki-library's test framework's
packages) is the ``corpus`` extra, ``pip install -e ".[corpus]"``, as a user of that
code installs it; an item that imports a package that is not installed fails, with
that as its reason.

An item is one of:

- a pytest test id (``test_*.py`` files): ids come from ``pytest --collect-only``,
  then each file runs in one pytest process with ``--timeout`` (pytest-timeout) per
  test; a file that fails to collect is one failed item;
- a script, run as ``__main__``: passes when it exits 0 within the timeout (a
  ``test_*.py`` that calls its own test at module level is a script);
- a library module: passes when it imports.

nki-library's own test suite (its ``test/integration`` in its documented simulation mode,
``--test-mode simulation``) collects 21,232 tests: ``--sample N`` (8 by default) runs N
of each file, evenly spaced over those its own rules do not skip, and the table counts
those. Its framework imports one module its public repository lacks
(``test.utils.perf_analysis_private``, used only to analyse hardware profiles): a
plugin the harness writes into its scratch folder stands in for it; no file of the
library is changed.

Every item runs in a subprocess with a timeout (``--timeout``, 120 s by default), with
trnsim's import aliases (``nki``, ``neuronxcc``, ``torch_neuronx``) active: pytest
installs them through trnsim's plugin, and scripts and imports start with
``import trnsim`` (``--plain`` runs scripts as ``python file.py`` instead, where a
script that imports ``nki`` before ``torch`` finds no ``nki``). Items that need JAX,
and documentation fragments that are not programs, are out of scope and listed with
their reason.

Output: one line per item (source, item, outcome, seconds, first line of the reason),
then a table per source. ``--json PATH`` writes every item; ``--source NAME`` runs one
source (repeatable); ``--budget S`` stops a source after S seconds, leaving the rest
"not run".

Run: ``python benchmarks/nki_corpus.py --json /tmp/corpus.json`` (about 20 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MIRROR = Path("/work/.mirror")
Seconds = float

# outcomes of one item
PASSED, FAILED, TIMEOUT, SKIPPED, OUT_OF_SCOPE, NOT_RUN = "passed", "failed", "timeout", "skipped", "out of scope", "not run"

JAX_IMPORT = re.compile(r"^\s*(import jax|from jax)\b", re.M)
# a test file that calls its own test at module level is a script, run as its authors
# run it (AWS's attention tutorial's test_attention.py ends in
# ``test_attn_tutorial("accuracy", attn_fwd_v1)``: its test takes ``mode`` and
# ``version``, which no fixture provides, so pytest cannot run it anywhere)
CALLS_OWN_TEST = re.compile(r"^test_\w+\(", re.M)

# pytest plugin loaded into every pytest run (written into the scratch folder): one
# JSON line per collected id, collection error and test outcome
REPORT_PLUGIN = '''
import json, os

import pytest

_OUT = os.environ["NKI_CORPUS_REPORT"]


def _write(record):
    with open(_OUT, "a") as f:
        f.write(json.dumps(record) + "\\n")


def _reason(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    if isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    text = str(report.longrepr or "")
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    return errors[-1] if errors else text.strip().splitlines()[-1] if text.strip() else ""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    # NKI_CORPUS_SAMPLE=N keeps N tests of each file, evenly spaced over those the
    # suite's own rules (its conftest's skip markers, applied before this) do not skip;
    # chosen in each run, since a suite may draw its parameters anew in every process
    n = int(os.environ.get("NKI_CORPUS_SAMPLE", "0"))
    if not n:
        return
    by_file = {}
    for item in items:
        by_file.setdefault(str(item.path), []).append(item)
    keep = []
    for path, group in by_file.items():
        run = [i for i in group if i.get_closest_marker("skip") is None]
        k = min(n, len(run))
        chosen = [run[round(j * (len(run) - 1) / (k - 1))] for j in range(k)] if k > 1 else run[:k]
        _write({"sampled": path, "tests": len(group), "skipped": len(group) - len(run), "chosen": len(chosen)})
        keep += chosen
    kept = set(map(id, keep))
    dropped = [i for i in items if id(i) not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def pytest_collection_finish(session):
    for item in session.items:
        _write({"collected": item.nodeid, "file": str(item.path), "skip": item.get_closest_marker("skip") is not None})


def pytest_collectreport(report):
    if report.failed:
        _write({"collect_error": report.nodeid, "reason": _reason(report)})


def _record_latency():
    # a perf test asserts nki.benchmark's latency against a threshold it takes as a
    # parameter: record both, with the chip the latency was simulated on
    try:
        from trnsim.nki.jit import NcLatency
    except ImportError:
        return
    plain = NcLatency.get_latency_percentile

    def recorded(self, percentile):
        value = plain(self, percentile)
        _LATENCIES.append(value)
        return value

    NcLatency.get_latency_percentile = recorded


_LATENCIES = []
_THRESHOLDS = ("latency", "max_p99_latency", "max_latency")


def pytest_configure(config):
    _record_latency()


def pytest_runtest_setup(item):
    _LATENCIES.clear()


def pytest_runtest_teardown(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    threshold = next((params[k] for k in _THRESHOLDS if k in params), None)
    if _LATENCIES and threshold is not None:
        from trnsim.hw.spec import DEFAULT_CHIP
        _write({"latency": item.nodeid, "simulated_us": _LATENCIES[-1], "threshold_us": float(threshold),
                "chip": os.environ.get("TRNSIM_CHIP") or DEFAULT_CHIP})
    _LATENCIES.clear()


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed" or (report.when == "setup" and report.skipped):
        _write({"id": report.nodeid, "when": report.when, "outcome": report.outcome,
                "seconds": report.duration, "reason": "" if report.passed else _reason(report)})
'''


# nki-library's test framework imports one module that its public repository does not
# contain (test/utils/test_orchestrator.py: ``from .perf_analysis_private import
# analyze_trace``, an AWS-internal analysis of hardware profiles, never called in
# simulation mode): this plugin, loaded for those tests only, stands in for it
PRIVATE_PLUGIN = '''
import sys, types

_missing = types.ModuleType("test.utils.perf_analysis_private")


def analyze_trace(*args, **kwargs):
    raise RuntimeError("test.utils.perf_analysis_private is not in nki-library's public repository")


_missing.analyze_trace = analyze_trace
sys.modules["test.utils.perf_analysis_private"] = _missing
'''


@dataclass(frozen=True)
class Part:
    """Paths of one repository at one commit, and how their items run.

    ``kind`` is ``pytest`` (test files under ``paths[0]``), ``scripts`` (every ``.py``
    under ``paths``: ``test_*.py`` through pytest, the rest as ``__main__``) or
    ``imports`` (every module under ``paths[0]``, which is on ``sys.path``).
    """

    label: str
    commit: str
    paths: tuple[str, ...]
    kind: str
    extract: tuple[str, ...] = ()      # more paths to extract, that hold no items
    pythonpath: tuple[str, ...] = ()   # relative to the extracted tree
    pytest_args: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()      # more pytest plugins (modules of the scratch plugin folder)
    sample: bool = False               # run --sample test ids of each file (nki-library's 21,232)
    out_of_scope: dict[str, str] = field(default_factory=dict)  # path -> reason


@dataclass(frozen=True)
class Source:
    name: str
    repo: str          # owner+name under the mirror root
    parts: tuple[Part, ...]


DOC_FRAGMENT = "documentation fragment: {why}, shown in the NKI guide, not a program"
SOURCES = (
    Source("nki-samples", "aws-neuron+nki-samples", (
        Part("unit@c4b806e~1", "c4b806e~1", ("test/unit",), "pytest", extract=("src",), pythonpath=("src",)),
        Part("unit@fc5c69f~1", "fc5c69f~1", ("test/unit",), "pytest", extract=("src",), pythonpath=("src",)),
        Part("tutorials@HEAD", "HEAD", ("src/nki_samples/tutorials", "contributed"), "scripts"),
        Part("removed@8370e11~1", "8370e11~1", tuple(f"src/nki_samples/tutorials/{t}" for t in
                                                     ("layernorm", "rmsnorm", "sd_attention")), "scripts"),
        Part("removed@c4b806e~1", "c4b806e~1", tuple(f"src/nki_samples/tutorials/{t}" for t in
                                                     ("rotary", "softmax")), "scripts"),
    )),
    Source("aws-neuron-sdk", "aws-neuron+aws-neuron-sdk", (
        Part("test@HEAD", "HEAD", ("nki/test",), "pytest"),
        Part("examples@HEAD", "HEAD", ("nki/examples",), "scripts", out_of_scope={
            "nki/examples/layout-dynamic-loop.py": DOC_FRAGMENT.format(why="deliberately incomplete (unbalanced parenthesis)"),
            "nki/examples/layout-loop.py": DOC_FRAGMENT.format(why="uses names it never defines (i_f)"),
            "nki/examples/layout-violation.py": DOC_FRAGMENT.format(why="a kernel written to break a layout rule"),
        }),
    )),
    Source("nki-library", "aws-neuron+nki-library", (
        # a module that imports the library's tests finds them as in a checkout of the repository
        Part("modules@d2ad3a5", "d2ad3a5", ("src/nkilib_src",), "imports", extract=("test",), pythonpath=("src",)),
        # at d2ad3a5 (HEAD when fetched on 2026-12-06) the public test framework imports
        # ``test.utils.scripts`` (test/utils/core_lock_client.py, through host_management),
        # which the repository does not contain: no one can run those tests, so they run
        # at the last commit whose framework is complete
        Part("tests@0759719", "0759719", ("test/integration",), "pytest", extract=("src", "test"),
             pythonpath=("src", "."), pytest_args=("--test-mode", "simulation"), plugins=("nki_corpus_private",),
             sample=True),
    )),
)


@dataclass
class Item:
    source: str
    part: str
    item: str
    outcome: str
    seconds: Seconds
    reason: str
    # a perf test's threshold and trnsim's simulated latency, in microseconds
    threshold_us: float | None = None
    simulated_us: float | None = None
    chip: str | None = None


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def error_line(output: str) -> str:
    """The line of a Python run's output that says why it failed: its last exception line."""
    # pytest marks the exception's lines with "E   "
    lines = [re.sub(r"^E\s+", "", line.strip()) for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b", line):
            return line
    return lines[-1] if lines else ""


def extract(git_dir: Path, commit: str, paths: tuple[str, ...], dest: Path) -> None:
    """Writes ``paths`` of ``git_dir`` at ``commit`` under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", commit, *paths],
                             check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


class Runner:
    """Runs the items of each part and prints them as they finish."""

    def __init__(self, scratch: Path, timeout: Seconds, budget: Seconds | None, plain: bool, sample: int = 0) -> None:
        self.scratch = scratch
        self.sample = sample
        self.match: list[str] = []
        self.sample_counts: list[tuple[str, int, int, int]] = []   # file, tests, skipped by the suite, sampled
        self.timeout = timeout
        self.budget = budget
        self.plain = plain
        self.items: list[Item] = []
        self.deadline = float("inf")
        (scratch / "plugin").mkdir(parents=True, exist_ok=True)
        (scratch / "plugin" / "nki_corpus_report.py").write_text(REPORT_PLUGIN)
        (scratch / "plugin" / "nki_corpus_private.py").write_text(PRIVATE_PLUGIN)

    def add(self, item: Item) -> None:
        # paths inside the scratch folder read as paths inside the source's tree
        item.reason = re.sub(re.escape(str(self.scratch)) + r"/[^/]+/[^/]+/", "", item.reason)
        self.items.append(item)
        print(f"{item.source:15} {item.item[:120]:120} {item.outcome:12} {item.seconds:7.1f}  {first_line(item.reason)[:160]}",
              flush=True)

    def env(self, tree: Path, part: Part) -> dict[str, str]:
        env = dict(os.environ, TRNSIM_PROGRESS="0", MPLBACKEND="Agg")
        paths = [str(tree / p) for p in part.pythonpath] + [str(REPO_ROOT), str(self.scratch / "plugin")]
        if os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def left(self) -> Seconds:
        return self.deadline - time.monotonic()

    def run_source(self, source: Source, mirror: Path) -> None:
        self.deadline = time.monotonic() + self.budget if self.budget else float("inf")
        git_dir = mirror / source.repo / "repo"
        for part in source.parts:
            tree = self.scratch / source.name / re.sub(r"[^\w.@-]", "_", part.label)
            extract(git_dir, part.commit, part.paths + part.extract, tree)
            getattr(self, f"run_{part.kind}")(source, part, tree)

    def skip_if_over(self, source: Source, part: Part, names: list[str]) -> bool:
        if self.left() > 0:
            return False
        for name in names:
            self.add(Item(source.name, part.label, name, NOT_RUN, 0.0, f"the source's budget of {self.budget:.0f} s ran out"))
        return True

    def subprocess(self, cmd: list[str], cwd: Path, env: dict[str, str], timeout: Seconds) -> tuple[int | None, str, Seconds]:
        start = time.monotonic()
        try:
            done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
            return done.returncode, done.stdout + done.stderr, time.monotonic() - start
        except subprocess.TimeoutExpired as err:
            out = (err.stdout or b"") + (err.stderr or b"")
            return None, out.decode(errors="replace") if isinstance(out, bytes) else out, time.monotonic() - start

    # -- scripts ---------------------------------------------------------------

    def run_scripts(self, source: Source, part: Part, tree: Path) -> None:
        files = sorted(f for p in part.paths for f in (tree / p).rglob("*.py") if self.wanted(f))
        env = self.env(tree, part)
        for path in files:
            rel = path.relative_to(tree).as_posix()
            name = f"{part.label}:{rel}"
            text = path.read_text(errors="replace")
            if path.name.startswith("test_") and not CALLS_OWN_TEST.search(text):
                self.run_pytest_files(source, part, tree, [path])
                continue
            if rel in part.out_of_scope:
                self.add(Item(source.name, part.label, name, OUT_OF_SCOPE, 0.0, part.out_of_scope[rel]))
                continue
            if JAX_IMPORT.search(text):
                self.add(Item(source.name, part.label, name, OUT_OF_SCOPE, 0.0, "needs JAX (out of scope by the issue)"))
                continue
            if self.skip_if_over(source, part, [name]):
                continue
            if self.plain:
                cmd = [sys.executable, path.name]
            else:
                launcher = ("import sys, runpy, trnsim; sys.argv = [sys.argv[1]]; sys.path.insert(0, '.'); "
                            "runpy.run_path(sys.argv[0], run_name='__main__')")
                cmd = [sys.executable, "-c", launcher, path.name]
            rc, out, secs = self.subprocess(cmd, path.parent, env, min(self.timeout, max(self.left(), 1)))
            if rc is None:
                self.add(Item(source.name, part.label, name, TIMEOUT, secs, f"ran past {self.timeout:.0f} s"))
            else:
                self.add(Item(source.name, part.label, name, PASSED if rc == 0 else FAILED, secs,
                              "" if rc == 0 else error_line(out) or f"exit status {rc}"))

    # -- library imports -------------------------------------------------------

    def run_imports(self, source: Source, part: Part, tree: Path) -> None:
        root = tree / part.pythonpath[0]
        env = self.env(tree, part)
        modules = []
        for path in sorted(f for f in (tree / part.paths[0]).rglob("*.py") if self.wanted(f)):
            dotted = path.relative_to(root).with_suffix("").parts
            modules.append(".".join(dotted[:-1] if dotted[-1] == "__init__" else dotted))
        for module in modules:
            if self.skip_if_over(source, part, [module]):
                continue
            code = f"import trnsim, importlib; importlib.import_module({module!r})"
            rc, out, secs = self.subprocess([sys.executable, "-c", code], tree, env, min(self.timeout, max(self.left(), 1)))
            if rc is None:
                self.add(Item(source.name, part.label, module, TIMEOUT, secs, f"ran past {self.timeout:.0f} s"))
            else:
                self.add(Item(source.name, part.label, module, PASSED if rc == 0 else FAILED, secs,
                              "" if rc == 0 else error_line(out)))

    # -- pytest ----------------------------------------------------------------

    def pytest_cmd(self, part: Part, *args: str) -> list[str]:
        plugins = [arg for name in part.plugins for arg in ("-p", name)]
        return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "nki_corpus_report", *plugins, "-q",
                "-o", "addopts=", *part.pytest_args, *args]

    def run_pytest(self, source: Source, part: Part, tree: Path) -> None:
        self.run_pytest_files(source, part, tree, sorted(f for f in (tree / part.paths[0]).rglob("test_*.py")
                                                         if self.wanted(f)))

    def wanted(self, path: Path) -> bool:
        """Whether ``--match`` lets this file run (every file without it)."""
        return not self.match or any(m in path.as_posix() for m in self.match)

    def run_pytest_files(self, source: Source, part: Part, tree: Path, files: list[Path]) -> None:
        env = self.env(tree, part)
        report = self.scratch / "report.jsonl"
        env["NKI_CORPUS_REPORT"] = str(report)
        if part.sample and self.sample:
            env["NKI_CORPUS_SAMPLE"] = str(self.sample)
        report.unlink(missing_ok=True)
        rels = [f.relative_to(tree).as_posix() for f in files]
        # nki-library's suite takes minutes to collect
        rc, out, _ = self.subprocess(self.pytest_cmd(part, "--collect-only", *rels), tree, env,
                                     max(self.timeout, 900))
        records = read_records(report)
        for r in records:
            if "sampled" in r:
                rel = Path(r["sampled"]).resolve().relative_to(tree.resolve()).as_posix()
                self.sample_counts.append((rel, r["tests"], r["skipped"], r["chosen"]))
                print(f"{'':15} {rel}: {r['chosen']} of {r['tests']} tests sampled ({r['skipped']} skipped by the "
                      "suite's own rules)", flush=True)
        collected = [r["collected"] for r in records if "collected" in r]
        # node ids are relative to pytest's rootdir (nki-library's is test/, where its
        # pytest.ini is): each id's file, relative to the tree, is what names it here
        file_of = {r["collected"]: Path(r["file"]).resolve().relative_to(tree.resolve()).as_posix()
                   for r in records if "collected" in r and "file" in r}
        errors = {r["collect_error"]: r["reason"] for r in records if "collect_error" in r}
        if not collected and not errors:
            # pytest stopped before collecting (a conftest that fails to import): every file fails with it
            why = error_line(out) or f"pytest exit status {rc}"
            for rel in rels:
                self.add(Item(source.name, part.label, f"{part.label}:{rel}", FAILED, 0.0, why))
            return
        for rel in rels:
            ids = [c for c in collected if file_of.get(c, c.split("::")[0]) == rel]
            bad = {k: v for k, v in errors.items() if _names_file(k.split("::")[0], rel)}
            for nodeid, why in bad.items():
                self.add(Item(source.name, part.label, f"{part.label}:{nodeid}", FAILED, 0.0, f"collection: {why}"))
            if ids and not self.skip_if_over(source, part, [f"{part.label}:{i}" for i in ids]):
                self.run_pytest_file(source, part, tree, env, rel, ids)

    def run_pytest_file(self, source: Source, part: Part, tree: Path, env: dict[str, str], rel: str,
                        ids: list[str]) -> None:
        """Run the tests ``ids`` of file ``rel`` in one pytest process. A process that dies
        before its last test (killed for memory, a crash in native code) fails the test
        it was running, and the tests after it run again in a fresh process, so that no
        test fails for another's sake."""
        report = Path(env["NKI_CORPUS_REPORT"])
        limit = min(self.timeout * len(ids) + 60 + (600 if "NKI_CORPUS_SAMPLE" in env else 0), max(self.left(), 1))
        outcomes: dict[str, dict] = {}
        latencies: dict[str, dict] = {}
        args = [rel]
        died: dict[str, str] = {}
        while True:
            report.unlink(missing_ok=True)
            cmd = self.pytest_cmd(part, f"--timeout={self.timeout:.0f}", *args)
            rc, out, secs = self.subprocess(cmd, tree, env, limit)
            records = read_records(report)
            if "NKI_CORPUS_SAMPLE" in env and args == [rel]:
                # this run's own sample: its parameters (so its ids) may differ from the collection's
                ids = [r["collected"] for r in records if "collected" in r] or ids
            latencies.update({r["latency"]: r for r in records if "latency" in r})
            for record in records:
                if "id" not in record:
                    continue
                known = outcomes.get(record["id"])
                # the worst phase decides: a teardown error fails a passed test
                if known is None or record["outcome"] != "passed":
                    if known is not None:
                        record["seconds"] += known["seconds"]
                    outcomes[record["id"]] = record
            missing = [i for i in ids if i not in outcomes and i not in died]
            # a process that ended with tests left and no summary line died on the first of them
            if rc is None or not missing or re.search(r"\b(passed|failed|error|no tests ran)\b.* in [\d.]+s", out):
                break
            why = f"the pytest process ended (exit status {rc}) while this test ran, without a summary: killed " \
                  f"(for memory?) or crashed; last output: {error_line(out)[:200]}"
            died[missing[0]] = why
            rest = missing[1:]
            if not rest or self.left() <= 0:
                break
            args = [rel + "::" + i.split("::", 1)[1] for i in rest]
        ran_to_end = rc is not None
        for nodeid in ids:
            name = f"{part.label}:{nodeid}"
            rec = outcomes.get(nodeid)
            if rec is None:
                if nodeid in died:
                    self.add(Item(source.name, part.label, name, FAILED, 0.0, died[nodeid]))
                elif ran_to_end:
                    why = error_line(out) or f"no outcome (pytest exit status {rc})"
                    self.add(Item(source.name, part.label, name, FAILED, 0.0, why))
                else:
                    self.add(Item(source.name, part.label, name, TIMEOUT if limit >= self.timeout else NOT_RUN, 0.0,
                                  f"the file's pytest run stopped after {secs:.0f} s before this test finished"))
                continue
            reason = rec["reason"] or ""
            if rec["outcome"] == "passed":
                outcome = PASSED
            elif rec["outcome"] == "skipped":
                outcome = SKIPPED
            elif reason.startswith("Failed: Timeout"):
                outcome = TIMEOUT
            else:
                outcome = FAILED
            timed = latencies.get(nodeid, {})
            self.add(Item(source.name, part.label, name, outcome, rec["seconds"], reason,
                          timed.get("threshold_us"), timed.get("simulated_us"), timed.get("chip")))


def _names_file(path: str, rel: str) -> bool:
    """Whether a node id's file part (relative to pytest's rootdir) is the file ``rel``
    (relative to the extracted tree)."""
    return path == rel or rel.endswith("/" + path)


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(items: list[Item]) -> str:
    """Per source: items, passed, failed, timed out, skipped by the test, not run, out of scope, pass rate.

    The pass rate is passed over the items that ran to an outcome: passed, failed or
    timed out. A test that skips itself (its authors' ``skip``/``xfail``, or nki-library's
    simulation mode skipping its large shapes by its own rule) is counted apart.
    """
    head = "| source | items | passed | failed | timed out | skipped by the test | not run | out of scope | pass rate |"
    rows = [head, "|---|" + "---:|" * 8]
    groups = {s: [i for i in items if i.source == s] for s in dict.fromkeys(i.source for i in items)}
    groups["all"] = items
    for name, group in groups.items():
        count = {o: sum(i.outcome == o for i in group) for o in (PASSED, FAILED, TIMEOUT, SKIPPED, NOT_RUN, OUT_OF_SCOPE)}
        ran = count[PASSED] + count[FAILED] + count[TIMEOUT]
        rate = f"{100 * count[PASSED] / ran:.0f}%" if ran else "-"
        rows.append(f"| {name} | {len(group)} | {count[PASSED]} | {count[FAILED]} | {count[TIMEOUT]} | {count[SKIPPED]} "
                    f"| {count[NOT_RUN]} | {count[OUT_OF_SCOPE]} | {rate} |")
    return "\n".join(rows)


def perf_table(items: list[Item]) -> str:
    """The perf tests that assert a hardware latency threshold: trnsim's simulated latency
    against it (the threshold is what the kernel ran under on the real chip)."""
    rows = ["| test | chip | threshold (us) | simulated (us) | simulated / threshold |", "|---|---|---:|---:|---:|"]
    for i in items:
        if i.threshold_us is None or i.simulated_us is None:
            continue
        rows.append(f"| {i.item} | {i.chip} | {i.threshold_us:,.0f} | {i.simulated_us:,.1f} "
                    f"| {i.simulated_us / i.threshold_us:.3g} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="root of the fetched git directories")
    parser.add_argument("--source", action="append", choices=[s.name for s in SOURCES], help="run only this source")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per item (default 120)")
    parser.add_argument("--budget", type=float, default=None, help="seconds per source, after which its items are not run")
    parser.add_argument("--plain", action="store_true", help="run scripts as `python file.py`, without importing trnsim first")
    parser.add_argument("--json", type=Path, help="write every item here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--match", action="append", help="run only files whose path contains this (repeatable)")
    parser.add_argument("--sample", type=int, default=8,
                        help="test ids run per file of nki-library's suite (21,232 in all), evenly spaced over those "
                             "its own rules do not skip; 0 runs them all (default 8)")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="nki_corpus_"))
    runner = Runner(scratch, args.timeout, args.budget, args.plain, args.sample)
    runner.match = args.match or []
    try:
        for source in SOURCES:
            if args.source and source.name not in args.source:
                continue
            runner.run_source(source, args.mirror)
    finally:
        if args.keep:
            print(f"scratch folder kept: {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
        print()
        print(table(runner.items))
        if runner.sample_counts:
            total = sum(c[1] for c in runner.sample_counts)
            skipped = sum(c[2] for c in runner.sample_counts)
            drawn = sum(c[3] for c in runner.sample_counts)
            print(f"\nnki-library's suite: {drawn} of its {total} tests run ({runner.sample} per file, evenly spaced over "
                  f"the {total - skipped} its own rules do not skip)")
        perf = perf_table(runner.items)
        if perf:
            print()
            print(perf)
        if args.json:
            args.json.write_text(json.dumps([asdict(i) for i in runner.items], indent=1))


if __name__ == "__main__":
    main()
