"""The eager timeline: simulated time of each op, memoized, on one device queue.

The host issues ops; each costs the host the chip's ``runtime.op_launch_us`` and
cannot start on the device before it is launched. The device runs ops one after
another. ``synchronize()``, ``.item()``, ``.cpu()`` and printing make the host wait
for the device. An op's device time comes from :mod:`trnsim.backend.costs` and is
memoized on (op, shapes, strides, dtypes, other arguments, chip, fidelity), so a
training loop pays the simulation once per distinct op.

Threads: ops from several threads share the one device queue (the clock is updated
under a lock), and a kernel simulation runs under :data:`simulating`, one at a time,
since tracing a kernel uses process-wide tracer state. A recording (a
:class:`trnsim.profile`) sees the ops of the thread that started it, as PyTorch's
profiler does, including the backward ops the autograd engine runs for that thread
on its device thread: the recordings live in PyTorch's thread-local state, which the
engine carries over.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from trnsim.backend import state
from trnsim.backend.opcost import OpCost


@dataclass(frozen=True)
class OpRecord:
    """One op on the eager timeline (what a profile records)."""

    name: str
    shapes: tuple
    dtypes: tuple
    start_ps: int
    end_ps: int
    cost: OpCost
    info: Any = field(default=None, compare=False)   # a compiled graph's kernel: its graph, ops and source lines


_memo: dict[tuple, OpCost] = {}
# every op the timeline charged since the last clear, with its cost's source ("kernel",
# "estimate", "none"): torch_neuronx.get_executed_ops / get_fallback_ops read it
executed: dict[str, str] = {}
_LAUNCH: list[int] = []
_clock_lock = threading.Lock()
# one kernel simulation at a time (tracing uses process-wide state); re-entrant, since a
# compiled graph's lowering, and an op made of others (``_foreach``), cost ops through
# cost_of while they hold it
simulating = threading.RLock()
_RECORDERS = "trnsim.recorders"
_recording = [0]   # recordings active in all threads; ops look for their thread's only then


def thread_list(key: str) -> list:
    """The list stored under ``key`` in this thread's PyTorch thread-local state (made
    empty on first use). The autograd engine's threads see the list of the thread whose
    backward they run."""
    if torch._C._is_key_in_tls(key):
        return torch._C._get_obj_in_tls(key)
    new: list = []
    torch._C._stash_obj_in_tls(key, new)
    return new


def start_recording(raw: list) -> None:
    """Append every op and sync of this thread to ``raw`` until :func:`stop_recording`."""
    thread_list(_RECORDERS).append(raw)
    with _clock_lock:
        _recording[0] += 1


def stop_recording(raw: list) -> bool:
    """Stop appending to ``raw`` (found by identity: two recordings of the same ops are
    equal lists). Returns False, changing nothing, if ``raw`` was not recording, so the
    count of recordings always equals the recorders registered."""
    recorders = thread_list(_RECORDERS)
    kept = [r for r in recorders if r is not raw]
    if len(kept) == len(recorders):
        return False
    recorders[:] = kept
    with _clock_lock:
        _recording[0] -= 1
    return True


def _recorders() -> list:
    if _recording[0] and torch._C._is_key_in_tls(_RECORDERS):
        return torch._C._get_obj_in_tls(_RECORDERS)
    return []


def _meta_key(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.is_cpu)
    if isinstance(x, (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
                      torch.layout)):
        return x
    return type(x).__name__


def key_of(name: str, flat: list) -> tuple:
    return (name, state.chip().name, state.fidelity(), *map(_meta_key, flat))


def cost_of(name: str, args: tuple, kwargs: dict, out: Any, flat: list | None = None) -> OpCost:
    """The (memoized) simulated cost of op ``name`` called with ``args`` and ``kwargs``."""
    if flat is None:
        flat = tree_flatten((args, kwargs))[0]
    key = key_of(name, flat)
    cost = _memo.get(key)
    if cost is None:
        from trnsim.backend import costs

        with simulating:
            cost = _memo.get(key)
            if cost is None:
                cost = _memo[key] = costs.op_cost(name, args, kwargs, flat, out, cost_of)
    return cost


_host_only = threading.local()


class graph_execution:
    """While active, ops this thread runs are not put on the timeline: they compute a
    compiled graph's values on the host, and the graph is charged as a whole
    (:func:`charge_graph`)."""

    def __enter__(self) -> None:
        _host_only.depth = getattr(_host_only, "depth", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _host_only.depth -= 1


def host_only() -> bool:
    """Whether this thread's ops are off the timeline (a compiled graph computing its values)."""
    return bool(getattr(_host_only, "depth", 0))


#: Ops whose time depends on their data (FlexAttention's block mask), by name: a compiled
#: graph charges the cost each reports when it runs (:func:`report_measured`) in place of
#: the cost its kernel was lowered with.
MEASURED: set[str] = set()


class measuring:
    """While active (a compiled graph computing its values), this thread's ops in
    :data:`MEASURED` report their costs to the list it returns, in the order they run."""

    def __enter__(self) -> list[OpCost]:
        self.costs: list[OpCost] = []
        self.outer = getattr(_host_only, "measured", None)
        _host_only.measured = self.costs
        return self.costs

    def __exit__(self, *exc: Any) -> None:
        _host_only.measured = self.outer


def report_measured(cost: OpCost) -> None:
    """An op of :data:`MEASURED` that ran inside a compiled graph reports its ``cost``."""
    costs = getattr(_host_only, "measured", None)
    if costs is not None:
        costs.append(cost)


def charge_kernel(name: str, cost: OpCost, shapes: tuple, dtypes: tuple) -> None:
    """Put one kernel the host launched itself (an NKI kernel called on neuron tensors) on
    the timeline, as an op named ``name`` of cost ``cost``."""
    charge_graph([(name, cost, shapes, dtypes, None)])


def charge(op: Any, info: Any, args: tuple, kwargs: dict, flat: list, out: Any) -> None:
    """Put op ``info.name`` on the timeline."""
    if getattr(_host_only, "depth", 0):
        return
    cost = cost_of(info.name, args, kwargs, out, flat)
    executed[info.name] = cost.source
    if cost.source == "none":
        return
    start = _launch(cost.ps)
    end = start + cost.ps
    recorders = _recorders()
    if recorders:
        shapes = tuple(tuple(x.shape) for x in flat if isinstance(x, torch.Tensor))
        dtypes = tuple(str(x.dtype).removeprefix("torch.") for x in flat if isinstance(x, torch.Tensor))
        rec = OpRecord(info.name, shapes, dtypes, start, end, cost)
        for r in recorders:
            r.append(rec)


def charge_graph(kernels: list[tuple[str, OpCost, tuple, tuple, Any]], launch: bool = True) -> None:
    """Put one compiled graph on the timeline: one launch, then its kernels
    ``(name, cost, shapes, dtypes, info)`` in turn, each ending ``info["after_ps"]``
    after the one ahead of it and starting ``info["lead_ps"]`` before its end (its place
    beside the kernels around it: :mod:`trnsim.backend.compile.overlap`; a kernel
    without them runs alone, after the one ahead). ``launch=False`` continues a graph
    already launched (its kernels after a collective inside it): they start when the
    device is free."""
    executed.update((name, cost.source) for name, cost, _, _, _ in kernels)
    starts: list[int] = []
    ends: list[int] = []
    end = 0
    for _, cost, _, _, info in kernels:
        info = info or {}
        end += info.get("after_ps", cost.ps)
        starts.append(max(0, end - info.get("lead_ps", cost.ps)))
        ends.append(end)
    ps = max(ends, default=0)
    if launch:
        start = _launch(ps)
    else:
        with _clock_lock:
            start = state.clock.device
            state.clock.device = start + ps
    recorders = _recorders()
    if recorders:
        for at, stop, (name, cost, shapes, dtypes, info) in zip(starts, ends, kernels):
            rec = OpRecord(name, shapes, dtypes, start + at, start + stop, cost, info)
            for r in recorders:
                r.append(rec)


def _launch(ps: int) -> int:
    """Launch ``ps`` of device work from the host: the host pays one launch, the work
    starts when both it is launched and the device is free. Returns its start."""
    clock = state.clock
    launch = _LAUNCH[0] if _LAUNCH else _launch_ps()
    with _clock_lock:
        issued = clock.host + launch
        start = issued if issued > clock.device else clock.device
        clock.host = issued
        clock.device = start + ps
        clock.ops += 1
    return start


def _launch_ps() -> int:
    _LAUNCH.append(state.chip().runtime.op_launch_ps)
    return _LAUNCH[0]


def sync(reason: str = "synchronize") -> None:
    """The host waits until the device has finished everything issued so far."""
    clock = state.clock
    with _clock_lock:
        if clock.device > clock.host:
            clock.host = clock.device
        clock.syncs += 1
        now = clock.host
    for r in _recorders():
        r.append(("sync", reason, now))


def reset_caches() -> None:
    """Forget memoized op times, compiled kernels' overlaps and the launch cost (after a
    chip or fidelity change)."""
    from trnsim.backend.compile import overlap

    _memo.clear()
    _LAUNCH.clear()
    overlap.reset()
