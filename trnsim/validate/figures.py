"""The validation figures, running them, and the table of published against simulated."""

from __future__ import annotations

import re
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trnsim.errors import ConfigError, TrnSimError

#: What a figure measures.
KINDS = ("kernel", "dma", "collective", "e2e")
#: ``fit``: a chip-file parameter was fitted to it; ``check``: never used for fitting.
GROUPS = ("fit", "check")


@dataclass(frozen=True)
class Sources:
    """Where the public code lives: a fetched repository (a checkout or a bare git
    directory) per name, ``aws-neuron-sdk`` for instance. Figures that run public code from
    a repository not given are skipped and say which path to pass."""

    repos: dict[str, Path] = field(default_factory=dict)

    def read(self, repo: str, commit: str, path: str) -> str:
        """The text of ``path`` at ``commit`` in ``repo``: from git where the repository is
        one (a bare mirror or a checkout), else the file of the directory as it stands."""
        root = self.repos.get(repo)
        if root is None:
            raise ConfigError(f"this figure runs {repo}'s public code; pass --{repo} PATH (a checkout or git "
                              "directory of it)")
        git = ["git", f"--git-dir={root}"] if (root / "HEAD").is_file() else ["git", "-C", str(root)]
        shown = subprocess.run([*git, "show", f"{commit}:{path}"], capture_output=True, text=True)
        if shown.returncode == 0:
            return shown.stdout
        if (root / path).is_file():
            return (root / path).read_text()
        raise ConfigError(f"{repo} at {root} has no {path} at {commit} ({shown.stderr.strip()[:160]}); pass the "
                          f"repository {repo} itself, fetched with its history")


@dataclass(frozen=True)
class Figure:
    """One published measurement and how trnsim reproduces it.

    ``simulate(sources)`` returns trnsim's figure in ``unit``; ``source`` names the page and
    section the published value comes from; ``runs`` says what trnsim runs (public code at
    a commit, or trnsim's own equivalent); ``series`` and ``order`` place the figure in a
    published sequence of optimisation steps (the tutorial's kernels, in order)."""

    key: str
    kind: str
    what: str
    chip: str
    source: str
    published: float
    unit: str
    group: str
    runs: str
    simulate: Callable[[Sources], float]
    quick: bool = True
    repo: str | None = None
    series: str | None = None
    order: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.group not in GROUPS or not self.published > 0:
            raise ValueError(f"figure {self.key}: kind {self.kind!r} (one of {KINDS}), group {self.group!r} "
                             f"(one of {GROUPS}), published {self.published!r} (> 0)")


@dataclass(frozen=True)
class Result:
    """A figure run: the simulated value; or why it was skipped (its public code was not
    given); or ``refused``, trnsim's error where it refuses code the real toolchain runs
    (which counts against trnsim); and the host seconds it took."""

    figure: Figure
    simulated: float | None
    skipped: str | None
    host_s: float
    refused: str | None = None

    @property
    def error(self) -> float | None:
        """simulated / published - 1 (0.1 is 10% slow, -0.1 10% fast)."""
        return None if self.simulated is None else self.simulated / self.figure.published - 1


@dataclass(frozen=True)
class Step:
    """One published optimisation step: the kernel before and after, and the speed-ups
    (``simulated`` is None where trnsim refused either kernel)."""

    series: str
    before: str
    after: str
    published: float
    simulated: float | None

    @property
    def kept(self) -> bool:
        """Whether trnsim moves the same way (faster, or slower) as the hardware did; a
        step trnsim could not run is not kept."""
        return self.simulated is not None and (self.published > 1) == (self.simulated > 1)

    @property
    def error(self) -> float | None:
        return None if self.simulated is None else self.simulated / self.published - 1


def run(figures: Iterable[Figure], sources: Sources | None = None, *,
        progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Simulate each figure (a figure whose public code is not given is skipped, saying so;
    one whose code trnsim refuses with its own error is recorded as refused, with the
    error's first line)."""
    sources = sources or Sources()
    results = []
    for figure in figures:
        start = time.perf_counter()
        if figure.repo is not None and figure.repo not in sources.repos:
            result = Result(figure, None, f"needs --{figure.repo} PATH", 0.0)
        else:
            try:
                result = Result(figure, float(figure.simulate(sources)), None, time.perf_counter() - start)
            except ConfigError:
                raise
            except TrnSimError as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                first = re.sub(r"(?:\S*/)+(\S+\.py:\d+)", r"\1", first)   # a source line by file name alone
                result = Result(figure, None, None, time.perf_counter() - start, refused=first)
        results.append(result)
        if progress is not None:
            progress(result)
    return results


def steps(results: Sequence[Result]) -> list[Step]:
    """The published optimisation steps among ``results``: consecutive kernels of a series."""
    by_series: dict[str, list[Result]] = {}
    for r in results:
        if r.figure.series is not None and r.skipped is None:
            by_series.setdefault(r.figure.series, []).append(r)
    out = []
    for series, rs in by_series.items():
        rs = sorted(rs, key=lambda r: r.figure.order)
        for a, b in zip(rs, rs[1:]):
            simulated = None if a.simulated is None or b.simulated is None else a.simulated / b.simulated
            out.append(Step(series, _step_name(a.figure), _step_name(b.figure),
                            a.figure.published / b.figure.published, simulated))
    return out


def _step_name(figure: Figure) -> str:
    """A figure's name within its series: what follows the last colon of ``what``."""
    return figure.what.rsplit(": ", 1)[-1]


def summary(results: Sequence[Result]) -> list[tuple[str, str, int, float | None, float | None, int]]:
    """(kind, group, figures simulated, median |error|, worst |error|, figures refused) for
    each kind and group run, then ("all", group, ...) and ("all", "all", ...). The errors
    are None where every figure of the row was refused."""
    rows = []
    for kind in (*KINDS, "all"):
        for group in (*GROUPS, "all"):
            mine = [r for r in results if kind in ("all", r.figure.kind) and group in ("all", r.figure.group)]
            errs = [abs(r.error) for r in mine if r.error is not None]
            refused = sum(r.refused is not None for r in mine)
            if (errs or refused) and (kind == "all" or group != "all"):
                rows.append((kind, group, len(errs), statistics.median(errs) if errs else None,
                             max(errs) if errs else None, refused))
    return rows


def _value(v: float, unit: str) -> str:
    return f"{v:,.4g} {unit}" if v < 1000 else f"{v:,.0f} {unit}"


def report(results: Sequence[Result], *, markdown: bool = False) -> str:
    """The table: each figure, published, simulated and error; the summary per kind and
    group; the optimisation steps. ``markdown`` writes Markdown tables."""
    def table(head: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[int]) -> list[str]:
        rows = [list(r) for r in rows]
        if markdown:
            rule = ["---:" if i in right else "---" for i in range(len(head))]
            return [f"| {' | '.join(r)} |" for r in (list(head), rule, *rows)]
        widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
        fmt = [str.rjust if i in right else str.ljust for i in range(len(head))]
        return ["  ".join(f(str(c), w) for f, c, w in zip(fmt, r, widths)).rstrip() for r in (head, *rows)]

    lines = []
    rows = []
    for r in results:
        f = r.figure
        sim = ("skipped: " + r.skipped if r.skipped else "REFUSED: " + r.refused if r.refused
               else _value(r.simulated or 0.0, f.unit))
        err = "" if r.error is None else f"{r.error:+.1%}"
        rows.append((f.kind, f.what, f.chip, _value(f.published, f.unit), sim, err, f.group, f.source, f.runs))
    lines += table(("kind", "figure", "chip", "published", "simulated", "error", "group", "source", "trnsim runs"),
                   rows, (3, 4, 5))
    lines.append("")
    def pct(v: float | None) -> str:
        return "" if v is None else f"{v:.1%}"

    lines += table(("kind", "group", "figures", "median |error|", "worst |error|", "refused"),
                   ((k, g, str(n), pct(med), pct(worst), str(refused))
                    for k, g, n, med, worst, refused in summary(results)), (2, 3, 4, 5))
    found = steps(results)
    if found:
        lines.append("")
        lines += table(("optimisation step", "published speed-up", "simulated speed-up", "direction", "error"),
                       ((f"{s.series}: {s.before} -> {s.after}", f"{s.published:.2f}x",
                         "" if s.simulated is None else f"{s.simulated:.2f}x",
                         "NOT RUN (refused)" if s.simulated is None else "kept" if s.kept else "REVERSED",
                         "" if s.error is None else f"{s.error:+.1%}") for s in found), (1, 2, 4))
    return "\n".join(lines)
