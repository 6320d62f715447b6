"""Two runs side by side, by what their ops compute: where ``b`` saves (or loses) simulated time against ``a``.

:func:`compare` groups the ``ops`` tracks of two traces (or job traces: their ranks
summed) with :func:`trnsim.trace.matching.match`: eager ops and compiled kernels that
compute the same thing share a row, whatever each run calls them. Eager's
``convolution_overrideable`` and a compiled graph's ``convolution`` are the row
``convolution``; the ``le``, ``scalar_tensor`` and ``where`` kernels that AOT Autograd
decomposed ``threshold_backward`` into are the row ``threshold_backward``; and a fused
kernel ties the eager ops it fused into one row (``fused[addmm+gelu]`` and eager's
``addmm`` and ``gelu``: the row ``addmm + gelu``). So each op's time is in exactly one
row, and a row's saving is what compiling that work saved.

Rows are sorted by the absolute time saved, largest first; the totals compare all op
time and the simulated time, which also holds what the device waited for the host
(fewer launches are much of what compiling saves). Where ``b`` is slower than ``a``
(or ``a`` than ``b``), a last line says so and names the costliest ops the slower
run's compiled graphs left unfused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trnsim.trace.events import Trace
from trnsim.trace.job import JobTrace
from trnsim.trace.matching import Unfused, match, unfused
from trnsim.trace.reporting import UNFUSED_NAMED, Report, rank_traces, report


@dataclass(frozen=True)
class OpDiff:
    """One row: the op families it covers, the op and kernel names each run gave them,
    and the calls and total simulated time (ns) of each run."""

    name: str
    calls_a: int
    calls_b: int
    a_ns: float
    b_ns: float
    families: tuple[str, ...] = ()
    names_a: tuple[str, ...] = ()
    names_b: tuple[str, ...] = ()

    @property
    def saved_ns(self) -> float:
        """Time ``b`` saves against ``a`` (negative: ``b`` spends more)."""
        return self.a_ns - self.b_ns

    @property
    def ratio(self) -> float | None:
        """``b``'s time over ``a``'s, None where ``a`` has none."""
        return self.b_ns / self.a_ns if self.a_ns else None


@dataclass(frozen=True)
class Comparison:
    """The comparison of two runs; ``str()`` prints it as a table, with a line on the
    slower run's unfused ops where one is slower."""

    a: Report
    b: Report
    rows: tuple[OpDiff, ...]
    names: tuple[str, str] = ("a", "b")
    top: int = 20
    unfused_a: tuple[Unfused, ...] = ()   # unfused ops in rows where a spends more than b
    unfused_b: tuple[Unfused, ...] = ()   # and where b spends more than a
    compiled: tuple[bool, bool] = (False, False)

    @property
    def saved_ns(self) -> float:
        """Simulated time ``b`` saves against ``a``."""
        return self.a.total_ns - self.b.total_ns

    def slower(self) -> str:
        """One line on a compiled run that is slower than the other (in simulated time,
        else in op time) and the costliest ops its compiled graphs left unfused; empty
        where no compiled run is slower."""
        for mine, other, me, them, left, compiled in (("b", "a", self.b, self.a, self.unfused_b, self.compiled[1]),
                                                      ("a", "b", self.a, self.b, self.unfused_a, self.compiled[0])):
            if not compiled:
                continue
            if me.total_ns > them.total_ns:
                line = (f"{mine} is slower than {other}: {_times(me.total_ns, them.total_ns, 'its simulated time')} "
                        f"({(me.total_ns - them.total_ns) / 1e3:,.3f} us more)")
            elif me.op_ns > them.op_ns:
                line = (f"{mine}'s ops are slower than {other}'s: {_times(me.op_ns, them.op_ns, 'their time')} "
                        f"({(me.op_ns - them.op_ns) / 1e3:,.3f} us more), though fewer launches shorten its "
                        "simulated time")
            else:
                continue
            if left:
                line += (f"; the costliest unfused ops of its compiled graphs where it spends more: "
                         f"{', '.join(str(u) for u in left[:UNFUSED_NAMED])}")
            return line
        return ""

    def __str__(self) -> str:
        na, nb = self.names
        width = max([40] + [len(r.name) for r in self.rows[:self.top]])
        lines = [f"a: {na}", f"b: {nb}",
                 f"{'op':{width}} {'calls a':>8} {'calls b':>8} {'a us':>12} {'b us':>12} {'saved us':>12} {'b/a':>6}"]

        def row(name: str, ca: str, cb: str, a: float, b: float) -> str:
            ratio = f"{b / a:6.2f}" if a else f"{'new':>6}"
            saved = round((a - b) / 1e3, 3) or 0.0   # float noise prints 0.000, not -0.000
            return f"{name:{width}} {ca:>8} {cb:>8} {a / 1e3:12.3f} {b / 1e3:12.3f} {saved:12.3f} {ratio}"

        for r in self.rows[:self.top]:
            lines.append(row(r.name, str(r.calls_a), str(r.calls_b), r.a_ns, r.b_ns))
        rest = self.rows[self.top:]
        if rest:
            lines.append(row(f"... {len(rest)} more", str(sum(r.calls_a for r in rest)), str(sum(r.calls_b for r in rest)),
                             sum(r.a_ns for r in rest), sum(r.b_ns for r in rest)))
        lines.append(row("all ops", str(sum(r.calls_a for r in self.rows)), str(sum(r.calls_b for r in self.rows)),
                         self.a.op_ns, self.b.op_ns))
        lines.append(row("simulated time", "", "", self.a.total_ns, self.b.total_ns))
        slower = self.slower()
        return "\n".join(lines + ([slower] if slower else []))


def compare(a: Trace | JobTrace | str | os.PathLike, b: Trace | JobTrace | str | os.PathLike, *,
            names: tuple[str, str] | None = None, top: int = 20) -> Comparison:
    """Compare run ``b`` with run ``a`` by what their ops compute (traces, job traces or
    saved traces' paths; see the module); ``names`` label them (default the paths, or
    ``a`` and ``b``); ``top`` rows are printed."""
    if names is None:
        names = tuple(str(x) if isinstance(x, (str, os.PathLike)) else label for x, label in ((a, "a"), (b, "b")))
    (a, ta), (b, tb) = rank_traces(a, "compare"), rank_traces(b, "compare")
    ops_a = [s for t in ta for s in t.slices if s.track == "ops"]
    ops_b = [s for t in tb for s in t.slices if s.track == "ops"]
    rows = []
    for m in match(ops_a, ops_b):
        sa, sb = m.slices
        rows.append(OpDiff(m.name, len(sa), len(sb), sum(s.own_ns for s in sa), sum(s.own_ns for s in sb),
                           m.families, tuple(dict.fromkeys(s.name for s in sa)),
                           tuple(dict.fromkeys(s.name for s in sb))))
    rows.sort(key=lambda r: (-abs(r.saved_ns), r.name))
    compiled = (any("graph" in s.args for s in ops_a), any("graph" in s.args for s in ops_b))
    row_of = {f: r for r in rows for f in r.families}
    # a run's unfused ops that matter to it being slower: those in rows where it spends more
    worse_a = tuple(u for u in unfused(ops_a) if row_of[u.origin].saved_ns > 0)
    worse_b = tuple(u for u in unfused(ops_b) if row_of[u.origin].saved_ns < 0)
    return Comparison(report(a), report(b), tuple(rows), names, top, worse_a, worse_b, compiled)


def _times(mine: float, theirs: float, what: str) -> str:
    """``mine`` as a multiple of ``theirs``: "1.25x its simulated time", or, where
    ``theirs`` is no time at all (a trace in which nothing ran), "its simulated time, where
    the other run has none"."""
    return f"{mine / theirs:.2f}x {what}" if theirs > 0 else f"{what}, where the other run has none"
