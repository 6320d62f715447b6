"""Compilations and recompilations of ``torch.compile(backend="neuron")``, made visible.

The backend calls :func:`on_compile` when Dynamo hands it a graph and :func:`finish`
once per graph it compiles from it (the inference graph, or AOT Autograd's forward and
backward). Each Dynamo compile of a code object is a *compilation*; every one after the
first is a *recompilation* and has a cause, the guard that failed (a shape, a dtype, a
Python value), read by :mod:`trnsim.backend.compile.causes`.

Each compiled graph is one :class:`NeuronCompilationMetrics` in
:func:`get_dynamo_metrics` (also ``torch.neuron.get_dynamo_metrics``), with the field
names TorchNeuron uses; ``torch_neuronx_compile_us`` is the *simulated* compile time
(the chip file's ``[compiler]`` assumptions), what the real compiler would take, kept
apart from device time. :func:`summary` sums them up for a profile.

When one function has recompiled :data:`RECOMPILE_WARN_AT` times, a
:class:`trnsim.errors.RecompileWarning` names the changing input and points to static
shapes and static caches, once per function. Everything here is process-wide and
thread-safe.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

from trnsim.backend.compile import causes
from trnsim.backend.compile.causes import GuardFailure
from trnsim.errors import RecompileWarning, TrnSimError, warn
from trnsim.units import Picos

#: A function's recompilation count at which the warning is issued (once per function):
#: the third recompile, that is the fourth compile of one code object. Fewer is common
#: and harmless (a last short batch, train then eval); Dynamo itself gives up at
#: ``torch._dynamo.config.recompile_limit`` (8) compiles and runs the function eagerly.
RECOMPILE_WARN_AT = 3

#: The graph kinds :func:`finish` takes.
KINDS = ("inference", "forward", "backward")


@dataclass
class NeuronCompilationMetrics:
    """One compiled graph, as TorchNeuron's ``get_dynamo_metrics()`` lists it, plus trnsim's fields.

    TorchNeuron's fields: ``graph_id`` (a key of the graph and its input shapes and
    dtypes), ``graph_name`` (``{model_name}_{compilation}_{kind}_{nth}``: the process-wide
    compilation index and how many compiles of the function came before),
    ``model_name`` (the compiled function's name), ``has_collectives``,
    ``graph_node_count`` (operator nodes), ``timestamp`` (the compilation index, for
    ordering), ``torch_neuronx_fx_passes_us`` (host time trnsim spent on the graph),
    ``torch_neuronx_lower_us`` (0: there is no lowering) and ``torch_neuronx_compile_us``
    (the simulated compile time on the real chip).

    trnsim's: ``kind`` (``inference``, ``forward`` or ``backward``), ``compile_id``
    (Dynamo's ``frame/compile``), ``code`` (``name (file:line)``), ``recompile``,
    ``reason`` (the failed guard in words, None on a first compile),
    ``simulated_compile_ps`` and ``host_clock_ps`` (the simulated host clock when it
    compiled, to place it on a trace).
    """

    graph_id: str
    graph_name: str = ""
    model_name: str = ""
    has_collectives: bool = False
    graph_node_count: int = 0
    timestamp: str = ""
    torch_neuronx_fx_passes_us: int = 0
    torch_neuronx_lower_us: int = 0
    torch_neuronx_compile_us: int = 0
    kind: str = "inference"
    compile_id: str | None = None
    code: str = ""
    recompile: bool = False
    reason: str | None = None
    simulated_compile_ps: Picos = 0
    host_clock_ps: Picos = 0

    @property
    def simulated_compile_s(self) -> float:
        """Simulated compile time in seconds."""
        return self.simulated_compile_ps / 1e12

    @property
    def host_compile_s(self) -> float:
        """Host time trnsim spent on the graph, in seconds."""
        return self.torch_neuronx_fx_passes_us / 1e6


@dataclass
class CompileEvent:
    """One Dynamo compilation of a function (what :func:`on_compile` returns).

    ``index`` counts compilations process-wide from 0 (since :func:`reset_dynamo_metrics`);
    ``name``, ``file`` and ``line`` say which function (``line`` its first line);
    ``count`` is how many times it has compiled, this one included; ``recompile`` is
    True when it had compiled before and a guard failed; ``reason`` is that guard (None
    on a first compile, or where Dynamo recorded none); ``graphs`` the graphs
    :func:`finish` has recorded for it; ``thread`` the thread that compiled it.
    """

    index: int
    compile_id: str | None
    name: str
    file: str
    line: int
    count: int
    recompile: bool
    reason: GuardFailure | None
    graph_key: str
    graphs: list[NeuronCompilationMetrics] = field(default_factory=list)
    thread: int = field(default_factory=threading.get_ident)
    _mark_ns: int = field(default=0, repr=False)

    @property
    def code(self) -> str:
        """The function as ``name (file:line)``."""
        return f"{self.name} ({os.path.basename(self.file)}:{self.line})"

    @property
    def simulated_compile_ps(self) -> Picos:
        """Simulated compile time of all its graphs."""
        return sum(g.simulated_compile_ps for g in self.graphs)


@dataclass
class _CodeState:
    compiles: int = 0
    recompiles: int = 0
    last_compile_id: str | None = None
    last: CompileEvent | None = None
    failures_seen: int = 0
    reasons: list[GuardFailure] = field(default_factory=list)
    simulated_ps: Picos = 0
    warned: bool = False
    children: list[CompileEvent] = field(default_factory=list)   # recompilations the backend made itself


_lock = threading.Lock()
_events: list[CompileEvent] = []
_graphs: list[NeuronCompilationMetrics] = []
_codes: dict[Any, _CodeState] = {}

_STACK_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')


def _where(gm: Any, code: types.CodeType | None) -> tuple[Any, str, str, int]:
    """The key, name, file and first line of the function being compiled; where Dynamo's
    frame is unknown, the first user stack line a graph node records."""
    if code is not None:
        return code, code.co_name, code.co_filename, code.co_firstlineno
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        m = _STACK_LINE.search(node.meta.get("stack_trace") or "")
        if m:
            key = (m.group("file"), m.group("name"))
            return key, m.group("name"), m.group("file"), int(m.group("line"))
    return "<unknown>", "<unknown>", "<unknown>", 0


def _graph_key(gm: Any, example_inputs: Sequence[Any]) -> str:
    inputs = [(tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))) for x in example_inputs]
    text = f"{getattr(gm, 'code', '')}\n{inputs}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def on_compile(gm: Any, example_inputs: Sequence[Any]) -> CompileEvent:
    """Record that Dynamo handed the backend ``gm`` to compile; call it first in the backend.

    Returns the :class:`CompileEvent`: which function, how many times it has compiled,
    and for a recompile the failed guard. A second graph from the same Dynamo compile
    (same compile id) is recorded as part of that compilation, not as another. At the
    :data:`RECOMPILE_WARN_AT`-th recompile of a function, issues one RecompileWarning.
    """
    frame = causes.current_frame()
    key, name, file, line = _where(gm, frame.code)
    graph_key = _graph_key(gm, example_inputs)
    with _lock:
        st = _codes.setdefault(key, _CodeState())
        if frame.compile_id is not None and frame.compile_id == st.last_compile_id and st.last is not None:
            prev = st.last
            event = CompileEvent(len(_events), frame.compile_id, name, file, line, prev.count, prev.recompile,
                                 prev.reason, graph_key)
            warn_now = False
        else:
            recompile = frame.frame_compile_id > 0 if frame.frame_compile_id is not None else st.compiles > 0
            reason = None
            if frame.code is not None:
                failures, st.failures_seen = causes.new_failures(frame.code, st.failures_seen)
                text = causes.latest_reason(failures) if recompile else None
                reason = causes.parse(text) if text else None
            st.compiles += 1
            c = _counters()
            c["compilations"] += 1
            if recompile:
                st.recompiles += 1
                c["recompilations"] += 1
                if reason is not None:
                    st.reasons.append(reason)
            st.last_compile_id = frame.compile_id
            event = CompileEvent(len(_events), frame.compile_id, name, file, line, st.compiles, recompile, reason,
                                 graph_key)
            warn_now = recompile and st.recompiles >= RECOMPILE_WARN_AT and not st.warned
            st.warned = st.warned or warn_now
        st.last = event
        _events.append(event)
        event._mark_ns = time.perf_counter_ns()
        if warn_now:
            message = _warning(event, st)
    if warn_now:
        if frame.code is not None:
            warnings.warn_explicit(message, RecompileWarning, file, line)
        else:
            warn(message, RecompileWarning)
    return event


def respecialize(parent: CompileEvent, reason: str | None) -> CompileEvent:
    """Record a recompilation the backend makes itself: a graph Dynamo traced with
    symbolic sizes (automatic dynamic shapes, after a size changed) is compiled again for
    each new set of concrete sizes, as the Neuron compiler compiles every shape.

    ``parent`` is the Dynamo compilation of that graph; ``reason`` the change in Dynamo's
    words (``tensor 'x' size mismatch at index 1. expected 8, actual 9``), or None for a
    graph of the same recompilation (a backward after its forward): then the latest
    recompilation of ``parent`` is returned. Call :func:`finish` for each graph compiled.
    """
    with _lock:
        st = next((s for s in _codes.values() if s.last is parent or parent in s.children), None)
        if st is None:   # the metrics were reset since ``parent`` compiled
            st = _codes.setdefault((parent.file, parent.name), _CodeState())
        if reason is None and st.children:
            return st.children[-1]
        failure = causes.parse(reason) if reason else None
        st.compiles += 1
        st.recompiles += 1
        c = _counters()
        c["compilations"] += 1
        c["recompilations"] += 1
        if failure is not None:
            st.reasons.append(failure)
        # its own compile id: Dynamo's, plus which recompilation of that graph it is
        compile_id = f"{parent.compile_id}.{len(st.children) + 1}"
        event = CompileEvent(len(_events), compile_id, parent.name, parent.file, parent.line, st.compiles,
                             True, failure, parent.graph_key)
        st.children.append(event)
        _events.append(event)
        event._mark_ns = time.perf_counter_ns()
        warn_now = st.recompiles >= RECOMPILE_WARN_AT and not st.warned
        st.warned = st.warned or warn_now
        message = _warning(event, st) if warn_now else ""
    if warn_now:
        warnings.warn_explicit(message, RecompileWarning, parent.file, parent.line)
    return event


def finish(event: CompileEvent, nodes: int, kind: str = "inference", has_collectives: bool = False) -> Picos:
    """Record one graph compiled for ``event`` and return its simulated compile time in picoseconds.

    ``nodes`` is the graph's operator (aten) node count; ``kind`` is ``"inference"``,
    ``"forward"`` or ``"backward"`` (AOT Autograd compiles a forward and a backward graph
    per training compilation; call once for each). The time is the chip's
    ``[compiler]`` figures: ``graph_base_s + nodes * per_node_ms``, at most ``graph_max_s``.
    It is host time on the real chip, not device time: nothing here moves the device clock.
    """
    if kind not in KINDS:
        raise TrnSimError(f"graph kind {kind!r} is not one of {', '.join(KINDS)}; pass the kind of graph compiled")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
        raise TrnSimError(f"node count {nodes!r} is not a whole number of nodes >= 0; pass len(graph.nodes) "
                          "or the count of call_function nodes")
    from trnsim.backend import state

    ps = state.chip().compiler.graph_ps(nodes)
    now = time.perf_counter_ns()
    with _lock:
        host_us = max(now - event._mark_ns, 0) // 1000
        event._mark_ns = now
        g = NeuronCompilationMetrics(
            graph_id=f"{event.graph_key}_{kind}",
            graph_name=f"{event.name}_{event.index}_{kind}_{event.count - 1}",
            model_name=event.name,
            has_collectives=has_collectives,
            graph_node_count=nodes,
            timestamp=str(event.index),
            torch_neuronx_fx_passes_us=host_us,
            torch_neuronx_compile_us=ps // 1_000_000,
            kind=kind,
            compile_id=event.compile_id,
            code=event.code,
            recompile=event.recompile,
            reason=event.reason.describe() if event.reason is not None else None,
            simulated_compile_ps=ps,
            host_clock_ps=state.clock.host,
        )
        event.graphs.append(g)
        _graphs.append(g)
        c = _counters()
        c["compiled_graphs"] += 1
        if has_collectives:
            c["graphs_with_collectives"] += 1
    return ps


def _counters() -> Any:
    """Dynamo's counters under ``"neuron"``, as TorchNeuron keeps them (compiled_graphs,
    graphs_with_collectives; trnsim adds compilations and recompilations)."""
    from torch._dynamo.utils import counters

    return counters["neuron"]


_HINTS = {
    "shape": "keep shapes static: pad inputs to a fixed length (TRL pads sequences to a multiple of 128 on "
             "neuron) or to a few bucket lengths, and generate with a static KV cache "
             "(generate(..., cache_implementation=\"static\"))",
    "dtype": "give the input one dtype, device and requires_grad on every call (cast it once, before the loop)",
    "value": "Python values are baked into the graph: keep them constant from call to call, or pass them as tensors",
    "other": "keep input shapes (pad to static shapes, use static caches such as cache_implementation=\"static\"), "
             "dtypes and Python arguments the same from call to call",
}
_HINT_OF = {"shape": "shape", "rank": "shape", "stride": "shape", "length": "shape", "dtype": "dtype",
            "device": "dtype", "requires_grad": "dtype", "dispatch keys": "dtype", "value": "value", "type": "value"}


def _warning(event: CompileEvent, st: _CodeState) -> str:
    """The RecompileWarning text: which input keeps changing and what to do."""
    from trnsim.backend import state

    compiler = state.chip().compiler
    latest = st.reasons[-1] if st.reasons else None
    names = list(dict.fromkeys(r.input for r in st.reasons if r.input))
    cause = f"the latest because {latest.describe()}" if latest else "Dynamo recorded no guard failure"
    also = f"; inputs that changed: {', '.join(repr(n) for n in names)}" if len(names) > 1 else ""
    kinds = list(dict.fromkeys(_HINT_OF.get(r.kind, "other") for r in st.reasons)) or ["other"]
    hints = "; ".join(_HINTS[k] for k in kinds)
    return (f"torch.compile: {event.code} has compiled {st.compiles} times ({st.recompiles} recompilations), "
            f"{cause}{also}. Every new graph is compiled again on the real chip ({compiler.graph_base_s:g}-"
            f"{compiler.graph_max_s:g} s each, simulated here apart from device time). To stop it, {hints}. "
            "torch.neuron.get_dynamo_metrics() lists every compilation and its cause.")


def get_dynamo_metrics() -> list[NeuronCompilationMetrics]:
    """Every graph compiled since the last reset, oldest first (a copy): TorchNeuron's
    ``get_dynamo_metrics()``. Each is a :class:`NeuronCompilationMetrics`."""
    with _lock:
        return list(_graphs)


def reset_dynamo_metrics() -> None:
    """Forget every compilation and graph recorded, and the warnings given: TorchNeuron's
    ``reset_dynamo_metrics()``. Dynamo's own caches stay (``torch._dynamo.reset()`` clears them)."""
    with _lock:
        _events.clear()
        _graphs.clear()
        _codes.clear()
        _counters().clear()


def compilations() -> list[CompileEvent]:
    """Every Dynamo compilation recorded since the last reset, oldest first (a copy)."""
    with _lock:
        return list(_events)


def mark() -> int:
    """A position in the record of compilations, for :func:`compilations_since`."""
    with _lock:
        return len(_events)


def compilations_since(position: int) -> list[CompileEvent]:
    """The compilations recorded after :func:`mark` returned ``position`` (all of them if
    a reset came in between)."""
    with _lock:
        return list(_events[position:] if position <= len(_events) else _events)


@dataclass(frozen=True)
class FunctionRow:
    """One function's line of :class:`CompileSummary`."""

    code: str
    compilations: int
    recompilations: int
    simulated_compile_s: float
    host_compile_s: float
    causes: tuple[str, ...]


@dataclass(frozen=True)
class CompileSummary:
    """Compilations and their cost, by function; ``str()`` prints it as a table."""

    compilations: int
    recompilations: int
    graphs: int
    simulated_compile_s: float
    host_compile_s: float
    rows: tuple[FunctionRow, ...]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        """The table as lines: a total line, then one line per function."""
        head = (f"torch.compile: {self.compilations} compilations ({self.recompilations} recompilations), "
                f"{self.graphs} graphs; simulated compile time {self.simulated_compile_s:.1f} s "
                f"(host time on the real chip, not device time); trnsim host {self.host_compile_s:.2f} s")
        if not self.rows:
            return [head]
        width = max([24] + [len(r.code) for r in self.rows])
        lines = [head, f"  {'function':{width}} {'compiles':>8} {'recompiles':>10} {'compile s':>10}  causes"]
        for r in self.rows:
            lines.append(f"  {r.code:{width}} {r.compilations:8d} {r.recompilations:10d} "
                         f"{r.simulated_compile_s:10.1f}  {'; '.join(r.causes) or '-'}")
        return lines


def summary(events: Sequence[CompileEvent] | None = None) -> CompileSummary:
    """Sum up ``events`` (default: all since the last reset) by function, in order of first compile."""
    events = compilations() if events is None else list(events)
    by_code: dict[str, list[CompileEvent]] = {}
    for e in events:
        by_code.setdefault(e.code, []).append(e)
    rows = []
    for code, es in by_code.items():
        firsts = {e.compile_id or id(e): e for e in es}.values()
        recompiles = [e for e in firsts if e.recompile]
        found = causes.describe_all([e.reason for e in recompiles if e.reason is not None])
        unknown = sum(e.reason is None for e in recompiles)
        found += [f"cause unknown, {unknown} times" if unknown > 1 else "cause unknown"] if unknown else []
        rows.append(FunctionRow(code, len(firsts), len(recompiles), sum(e.simulated_compile_ps for e in es) / 1e12,
                                sum(g.host_compile_s for e in es for g in e.graphs), tuple(found)))
    return CompileSummary(sum(r.compilations for r in rows), sum(r.recompilations for r in rows),
                          sum(len(e.graphs) for e in events), sum(r.simulated_compile_s for r in rows),
                          sum(r.host_compile_s for r in rows), tuple(rows))


def summary_lines() -> list[str]:
    """:func:`summary` of everything since the last reset, as printable lines."""
    return summary().lines()
