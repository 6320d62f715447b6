"""Which ops of two runs compute the same thing: the one matching that ``trnsim diff``,
:func:`~trnsim.trace.plot_comparison` and ``plot_timeline(op=...)`` use.

Eager and compiled runs name the same work differently, in three ways:

- **overload families and twins**: an op's family is its aten name without the
  namespace, the overload (``sum.dim_IntList``: ``sum``), the private and in-place
  underscores (``_softmax``, ``add_``: ``softmax``, ``add``), the ``native_`` prefix
  and the suffixes of a backend's or a functional twin (``_overrideable``,
  ``_functional``, ``_legit``, ``_no_training``). So eager's ``convolution_overrideable``
  and a compiled graph's ``convolution`` are both ``convolution``, and eager's
  ``native_batch_norm`` and ``_native_batch_norm_legit_functional`` both ``batch_norm``;
- **decompositions**: AOT Autograd decomposes some eager ops into several
  (``threshold_backward`` into ``le``, ``scalar_tensor`` and ``where``). A compiled
  graph's kernel records, beside its aten ops (its ``ops`` argument), the eager op
  each came from (``from``), and is matched by those;
- **fused kernels**: a kernel that fused several ops (``fused[addmm+gelu]``) computes
  all their eager ops, so it ties their families together.

:func:`match` groups the op slices of any number of runs into rows: a row holds every
family that a kernel ties to another, so each op's time is in exactly one row and no
two rows split one piece of work between them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from trnsim.trace.events import Slice

# suffixes of an op's twins: a backend's (_overrideable), functionalization's (_functional)
# and batch norm's split by training mode (_legit, _no_training)
_TWIN_SUFFIXES = ("_overrideable", "_functional", "_no_training", "_legit")
_NAMED_FAMILIES = 4   # families a row's name lists before "+ N more"


def family(name: str) -> str:
    """The overload family of an op name (see the module): ``aten::add_.Tensor`` and
    ``add`` are ``add``, ``convolution_backward_overrideable`` is ``convolution_backward``."""
    base = name.split("::")[-1].split(".")[0].strip("_")
    base = base.removeprefix("native_")
    for suffix in _TWIN_SUFFIXES:
        base = base.replace(suffix, "")
    return base.strip("_") or name


def _unique(names: list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def members(s: Slice) -> tuple[str, ...]:
    """The families of the aten ops an op slice ran: a compiled kernel's ``ops``, or the
    slice's own name."""
    ops = s.args.get("ops")
    if "graph" in s.args and isinstance(ops, list) and ops:
        return _unique([family(str(o)) for o in ops])
    return (family(s.name),)


def computes(s: Slice) -> tuple[str, ...]:
    """The families of the eager ops an op slice computes: a compiled kernel's ops'
    eager origins (``from``; a trace written before kernels recorded them: its ops), or
    the slice's own name."""
    origins = s.args.get("from")
    if "graph" in s.args and isinstance(origins, list) and origins:
        return _unique([family(str(o)) for o in origins])
    return members(s)


def is_named(s: Slice, op: str) -> bool:
    """Whether the op slice ``s`` ran ``op`` (a name, with or without ``aten::``): its
    name, or the family of ``op`` among what it ran and what it computes."""
    want = op.removeprefix("aten::")
    return s.name == want or family(want) in members(s) + computes(s)


def close_names(slices: list[Slice], op: str, n: int = 8) -> list[str]:
    """The op names and families of ``slices`` closest to ``op``, closest first."""
    names = sorted({s.name for s in slices} | {f for s in slices for f in members(s) + computes(s)})
    want = op.removeprefix("aten::")
    return difflib.get_close_matches(want, names, n=n, cutoff=0.5) or \
        difflib.get_close_matches(family(want), names, n=n, cutoff=0.5)


@dataclass(frozen=True)
class Match:
    """One row of a comparison: the op families it covers and, per run, its op slices."""

    name: str
    families: tuple[str, ...]
    slices: tuple[tuple[Slice, ...], ...]


def match(*runs: list[Slice]) -> list[Match]:
    """The op slices of ``runs`` (each a list of ``ops``-track slices) grouped into rows
    of what they compute (see the module). A row is named by its families, the one with
    most time first (``addmm + gelu``); rows come largest total time first."""
    parent: dict[str, str] = {}

    def root(f: str) -> str:
        while parent.setdefault(f, f) != f:
            parent[f] = parent[parent[f]]
            f = parent[f]
        return f

    for run in runs:
        for s in run:
            first, *rest = computes(s)
            for f in rest:
                parent[root(f)] = root(first)
    time: dict[str, float] = {}
    for run in runs:
        for s in run:
            for f in computes(s):
                time[f] = time.get(f, 0.0) + s.own_ns / len(computes(s))
    groups: dict[str, list[str]] = {}
    for f in sorted(time, key=lambda f: (-time[f], f)):
        groups.setdefault(root(f), []).append(f)
    rows = []
    for fams in groups.values():
        mine = set(fams)
        per_run = tuple(tuple(s for s in run if computes(s)[0] in mine) for run in runs)
        shown = " + ".join(fams[:_NAMED_FAMILIES])
        if len(fams) > _NAMED_FAMILIES:
            shown += f" + {len(fams) - _NAMED_FAMILIES} more"
        rows.append(Match(shown, tuple(fams), per_run))
    rows.sort(key=lambda m: (-sum(s.own_ns for ss in m.slices for s in ss), m.name))
    return rows


@dataclass(frozen=True)
class Unfused:
    """An aten op that compiled graphs ran as a kernel of its own: its family, the
    family of the eager op it came from, its calls and their total simulated time (ns)."""

    op: str
    origin: str
    calls: int
    total_ns: float

    def __str__(self) -> str:
        name = self.op if self.origin == self.op else f"{self.op} ({self.origin})"
        return f"{name} {self.total_ns / 1000:,.3f} us in {self.calls} call{'s' if self.calls != 1 else ''}"


def unfused(slices: list[Slice]) -> list[Unfused]:
    """The ops without matmul work that compiled graphs left unfused (kernels with a
    ``not_fused`` reason and no matmul FLOPs: the elementwise ops and reductions whose
    HBM round trips fusion would have saved), by op family and eager origin, costliest
    first."""
    groups: dict[tuple[str, str], list[Slice]] = {}
    for s in slices:
        if s.track == "ops" and "graph" in s.args and s.args.get("not_fused") and not s.args.get("flops"):
            groups.setdefault((members(s)[0], computes(s)[0]), []).append(s)
    rows = [Unfused(op, origin, len(ss), sum(s.own_ns for s in ss)) for (op, origin), ss in groups.items()]
    rows.sort(key=lambda u: (-u.total_ns, u.op, u.origin))
    return rows
