"""``torch.neuron``: the device module, named and shaped like ``torch.cuda``.

A process sees the NeuronCores of its instance (``device_count()``, 64 on a
trn2.48xlarge) and drives one of them, as Neuron runs one process per core: the one
``LOCAL_RANK`` names under torchrun, which PyTorch numbers ``neuron:0``; more cores come
through torch.distributed. Besides the
``torch.cuda`` names it gives trnsim's own view of the device: :func:`chip`,
:func:`elapsed_ms` / :func:`clock` (the simulated timeline) and :func:`current_trace`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from trnsim.backend import rng, state, timeline
from trnsim.backend.streams import Event, Stream, current_stream, default_stream, stream

__all__ = [
    "DeviceProperties", "Event", "Stream", "chip", "clock", "current_device", "current_stream", "current_trace",
    "default_stream", "device", "device_count", "elapsed_ms", "empty_cache", "fidelity", "get_amp_supported_dtype",
    "get_device_name", "get_device_properties", "get_dynamo_metrics", "get_rng_state", "get_rng_state_all",
    "initial_seed", "is_available", "is_bf16_supported", "is_initialized", "manual_seed", "manual_seed_all",
    "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved",
    "memory_stats", "reset_dynamo_metrics", "reset_peak_memory_stats", "seed", "seed_all", "set_chip", "set_device",
    "set_fidelity", "set_rng_state", "set_rng_state_all", "stream", "synchronize",
]


def is_available() -> bool:
    """Always True: the device is simulated."""
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """The ``neuron`` devices this process sees: the logical NeuronCores of one server of
    the instance (``NEURON_RT_VISIBLE_CORES`` / ``NEURON_RT_NUM_CORES`` narrow them)."""
    return state.device_count()


def current_device() -> int:
    return 0


_index = state.device_index


def set_device(dev: Any) -> None:
    """Select the current device: this process's NeuronCore, ``0`` or ``LOCAL_RANK``
    (another core of the instance is refused, naming the fix); a negative index does
    nothing, as in ``torch.cuda.set_device``."""
    if isinstance(dev, int) and not isinstance(dev, bool) and dev < 0:
        return
    _index(dev)


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What :func:`get_device_properties` reports: ``name``, the chip (e.g. ``"trn2"``),
    and ``total_memory``, the device's HBM in bytes (one logical NeuronCore's share)."""

    name: str
    total_memory: int


def get_device_name(dev: Any = None) -> str:
    """The device's name, ``"neuron:<index>"``, as torch_neuronx names it (any core of the
    instance: ``device_count()`` of them)."""
    return f"neuron:{state.any_device_index(dev)}"


def get_device_properties(dev: Any = None) -> DeviceProperties:
    """The chip and the HBM capacity of the device (``.name``, ``.total_memory``); any core
    of the instance, as each is the same."""
    state.any_device_index(dev)
    return DeviceProperties(state.chip().name, state.device_capacity())


class device(contextlib.ContextDecorator):
    """Context manager that selects device ``idx`` (this process's core: 0 or ``LOCAL_RANK``)."""

    def __init__(self, idx: Any) -> None:
        self.idx = _index(idx)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def synchronize(dev: Any = None) -> None:
    """Wait (in simulated time) until the device has finished every op issued so far."""
    _index(dev)
    timeline.sync("synchronize")


# -- memory ------------------------------------------------------------------

def memory_allocated(dev: Any = None) -> int:
    """Bytes of simulated HBM held by live neuron tensors."""
    _index(dev)
    return state.memory.allocated


def max_memory_allocated(dev: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last reset."""
    _index(dev)
    return state.memory.peak


def memory_reserved(dev: Any = None) -> int:
    """Bytes reserved: equal to :func:`memory_allocated` (trnsim keeps no cache)."""
    return memory_allocated(dev)


def max_memory_reserved(dev: Any = None) -> int:
    return max_memory_allocated(dev)


def reset_peak_memory_stats(dev: Any = None) -> None:
    _index(dev)
    state.memory.peak = state.memory.allocated


def reset_accumulated_memory_stats(dev: Any = None) -> None:
    """Zero the running totals of :func:`memory_stats` (bytes and blocks allocated and
    freed, out-of-memory errors); current and peak figures stay."""
    _index(dev)
    m = state.memory
    m.total_allocated = m.total_freed = m.allocations = m.frees = m.ooms = 0


def mem_get_info(dev: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device's HBM."""
    _index(dev)
    total = state.device_capacity()
    return total - state.memory.allocated, total


def memory_stats(dev: Any = None) -> dict[str, int]:
    """Allocator statistics under ``torch.cuda.memory_stats`` key names."""
    _index(dev)
    m = state.memory
    return {
        "allocated_bytes.all.current": m.allocated, "allocated_bytes.all.peak": m.peak,
        "allocated_bytes.all.allocated": m.total_allocated, "allocated_bytes.all.freed": m.total_freed,
        "reserved_bytes.all.current": m.allocated, "reserved_bytes.all.peak": m.peak,
        "active_bytes.all.current": m.allocated, "active_bytes.all.peak": m.peak,
        "allocation.all.current": m.allocations - m.frees, "allocation.all.allocated": m.allocations,
        "allocation.all.freed": m.frees, "num_ooms": m.ooms, "num_alloc_retries": 0,
    }


def empty_cache() -> None:
    """Nothing to release: freed tensors return their HBM at once."""


# -- random numbers ----------------------------------------------------------

manual_seed = rng.manual_seed
manual_seed_all = rng.manual_seed_all
seed = rng.seed
seed_all = rng.seed_all
initial_seed = rng.initial_seed


def _other_core(dev: Any) -> int | None:
    """None if ``dev`` names this process's core (0, ``LOCAL_RANK``), else the index of
    the instance's other core it names (an index past device_count() is refused)."""
    index = state.any_device_index(dev)
    return None if index == 0 or index == state.launcher_local_rank() else index


def get_rng_state(device: Any = "neuron") -> torch.Tensor:
    """The state of ``device``'s random generator (a uint8 CPU tensor); another core of
    the instance has its own generator, as each CUDA device has."""
    other = _other_core(device)
    return rng.get_rng_state() if other is None else rng.core_generator(other).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
    """Restore ``device``'s random generator from :func:`get_rng_state`'s tensor."""
    other = _other_core(device)
    if other is None:
        rng.set_rng_state(new_state)
    else:
        rng.core_generator(other).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    """The state of every device's generator, by index (``torch.cuda.get_rng_state_all``)."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    """Restore every device's generator from :func:`get_rng_state_all`'s list."""
    if not isinstance(states, (list, tuple)):
        raise TypeError(f"set_rng_state_all expects the list get_rng_state_all() returns, "
                        f"not {type(states).__name__}")
    for index, one in enumerate(states):
        set_rng_state(one, index)


# -- dtypes ------------------------------------------------------------------

def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Dtypes autocast may use on ``neuron``: bfloat16 (preferred) and float16."""
    return [torch.bfloat16, torch.float16]


def get_dynamo_metrics() -> list:
    """Every graph ``torch.compile(backend="neuron")`` compiled since the last reset, oldest
    first: a list of :class:`trnsim.backend.compile.metrics.NeuronCompilationMetrics` (node
    count, simulated compile time, compile id, and for a recompile the guard that failed)."""
    from trnsim.backend.compile import metrics

    return metrics.get_dynamo_metrics()


def reset_dynamo_metrics() -> None:
    """Forget the compilations :func:`get_dynamo_metrics` lists."""
    from trnsim.backend.compile import metrics

    metrics.reset_dynamo_metrics()


# -- trnsim's own view -------------------------------------------------------

def chip():
    """The ChipSpec of the device (``$TRNSIM_CHIP``, default trn2)."""
    return state.chip()


def set_chip(spec: Any) -> None:
    """Simulate another chip from now on (a name, a TOML path or a ChipSpec)."""
    state.set_chip(spec)
    timeline.reset_caches()


fidelity = state.fidelity


def set_fidelity(value: str) -> None:
    """``op`` (default), ``instruction`` or ``timing``; see docs/device.md."""
    state.set_fidelity(value)


def clock() -> state.Clock:
    """The simulated timeline: host and device times in picoseconds, ops issued, syncs."""
    return state.clock


def elapsed_ms() -> float:
    """Simulated milliseconds until the device finishes what has been issued."""
    return state.clock.device / 1e9


def current_trace():
    """The :class:`trnsim.profile` recording now, or None."""
    from trnsim.backend import profiler

    return profiler.current()
