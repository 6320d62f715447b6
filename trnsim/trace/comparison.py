"""Two runs side by side, op by op: where ``b`` saves (or loses) simulated time against ``a``.

:func:`compare` matches the ``ops`` tracks of two traces (or job traces: their ranks
summed) by op name. A compiled run's fused kernels (``fused[mm+add+silu]``) have no
eager counterpart, so they are rows of their own, present in ``b`` only; the eager ops
they replaced are rows present in ``a`` only. Read together, the rows say what fusion
saved: the eager ops' time is saved, the fused kernels' time is spent. A compiled
kernel of one op (``fused[mm]``, or an op the graph left unfused) is compared under
that op's eager name (:func:`match_name`). Rows are sorted by the absolute time saved,
largest first; the totals compare all op time and the simulated time, which also holds
what the device waited for the host (fewer launches are much of what compiling saves).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trnsim.trace.events import Slice, Trace
from trnsim.trace.job import JobTrace
from trnsim.trace.reporting import Report, op_times, rank_traces, report


@dataclass(frozen=True)
class OpDiff:
    """One op name in both runs: calls and total simulated time (ns) of each."""

    name: str
    calls_a: int
    calls_b: int
    a_ns: float
    b_ns: float

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
    """The op-by-op comparison of two runs; ``str()`` prints it as a table."""

    a: Report
    b: Report
    rows: tuple[OpDiff, ...]
    names: tuple[str, str] = ("a", "b")
    top: int = 20

    @property
    def saved_ns(self) -> float:
        """Simulated time ``b`` saves against ``a``."""
        return self.a.total_ns - self.b.total_ns

    def __str__(self) -> str:
        na, nb = self.names
        width = max([40] + [len(r.name) for r in self.rows[:self.top]])
        lines = [f"a: {na}", f"b: {nb}",
                 f"{'op':{width}} {'calls a':>8} {'calls b':>8} {'a us':>12} {'b us':>12} {'saved us':>12} {'b/a':>6}"]

        def row(name: str, ca: str, cb: str, a: float, b: float) -> str:
            ratio = f"{b / a:6.2f}" if a else f"{'new':>6}"
            return f"{name:{width}} {ca:>8} {cb:>8} {a / 1e3:12.3f} {b / 1e3:12.3f} {(a - b) / 1e3:12.3f} {ratio}"

        for r in self.rows[:self.top]:
            lines.append(row(r.name, str(r.calls_a), str(r.calls_b), r.a_ns, r.b_ns))
        rest = self.rows[self.top:]
        if rest:
            lines.append(row(f"... {len(rest)} more", str(sum(r.calls_a for r in rest)), str(sum(r.calls_b for r in rest)),
                             sum(r.a_ns for r in rest), sum(r.b_ns for r in rest)))
        lines.append(row("all ops", str(sum(r.calls_a for r in self.rows)), str(sum(r.calls_b for r in self.rows)),
                         self.a.op_ns, self.b.op_ns))
        lines.append(row("simulated time", "", "", self.a.total_ns, self.b.total_ns))
        return "\n".join(lines)


def compare(a: Trace | JobTrace | str | os.PathLike, b: Trace | JobTrace | str | os.PathLike, *,
            names: tuple[str, str] | None = None, top: int = 20) -> Comparison:
    """Compare run ``b`` with run ``a`` op by op (traces, job traces or saved traces' paths);
    ``names`` label them (default the paths, or ``a`` and ``b``); ``top`` rows are printed."""
    if names is None:
        names = tuple(str(x) if isinstance(x, (str, os.PathLike)) else label for x, label in ((a, "a"), (b, "b")))
    (a, ta), (b, tb) = rank_traces(a, "compare"), rank_traces(b, "compare")
    ops_a = {o.name: o for o in op_times(ta, match_name)}
    ops_b = {o.name: o for o in op_times(tb, match_name)}
    rows = []
    for name in {**ops_a, **ops_b}:
        oa, ob = ops_a.get(name), ops_b.get(name)
        rows.append(OpDiff(name, oa.calls if oa else 0, ob.calls if ob else 0,
                           oa.total_ns if oa else 0.0, ob.total_ns if ob else 0.0))
    rows.sort(key=lambda r: (-abs(r.saved_ns), r.name))
    return Comparison(report(a), report(b), tuple(rows), names, top)


def match_name(s: Slice) -> str:
    """The row an op slice is compared under: its name, or for a compiled graph's kernel
    of one op (``fused[mm]``), that op's name (``mm``), as eager names it."""
    ops = s.args.get("ops")
    if "graph" in s.args and isinstance(ops, list) and len(ops) == 1:
        return str(ops[0]).removeprefix("aten::")
    return s.name
