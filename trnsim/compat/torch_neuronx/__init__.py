"""trnsim's ``torch_neuronx``: what ``import torch_neuronx`` gives without AWS's package.

It mirrors TorchNeuron's top level: the device functions of ``torch.neuron``
(``is_available``, ``device_count``, ``synchronize``, the memory and RNG functions,
...), op tracking (:func:`get_executed_ops`, :func:`get_fallback_ops`,
:func:`clear_op_tracking`), NKI kernels as PyTorch ops (:func:`nki_op`,
:func:`wrap_nki`, and the legacy :func:`nki_jit` of ``torch_neuronx.xla_impl.ops``) and
the submodules ``distributed`` and ``profiling``, which refuse by name what trnsim does
not have yet.

Op tracking: every aten op on a ``neuron`` tensor computes on the host CPU in
trnsim, so "fallback" cannot mean where the op ran. Here it means what the
simulated time rests on: an op timed by the bandwidth estimate (bytes over HBM
bandwidth, no kernel of its own; see ``trnsim coverage``) is a fallback, the way an
op without a Neuron kernel falls back to the CPU on the real device. An op timed by
a simulated kernel from :mod:`trnsim.kernels` is executed on the device.
"""

from __future__ import annotations

from typing import Any, Callable

import trnsim  # registers the neuron device
from trnsim.backend import timeline
from trnsim.backend.device import (  # the device functions, as torch.neuron has them
    Event, Stream, current_device, current_stream, default_stream, device, device_count, empty_cache,
    get_amp_supported_dtype, get_device_name, get_device_properties, get_rng_state, get_rng_state_all,
    initial_seed, is_available, is_bf16_supported, is_initialized, manual_seed, manual_seed_all,
    max_memory_allocated, max_memory_reserved, mem_get_info, memory_allocated, memory_reserved, memory_stats,
    reset_peak_memory_stats, seed, seed_all, set_device, set_rng_state, set_rng_state_all, stream, synchronize)
from trnsim.compat.torch_neuronx import distributed, profiling, xla_impl
from trnsim.compat.torch_neuronx.xla_impl.ops import nki_jit

__version__ = trnsim.__version__

__all__ = [
    "Event", "Stream", "clear_op_tracking", "current_device", "current_stream", "default_stream", "device",
    "device_count", "distributed", "empty_cache", "get_amp_supported_dtype", "get_device_name",
    "get_device_properties", "get_executed_ops", "get_fallback_ops", "get_rng_state", "get_rng_state_all",
    "initial_seed", "is_available", "is_bf16_supported", "is_initialized", "manual_seed", "manual_seed_all",
    "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved",
    "memory_stats", "nki_jit", "nki_op", "profiling", "reset_peak_memory_stats", "seed", "seed_all", "set_device",
    "set_rng_state", "set_rng_state_all", "stream", "synchronize", "wrap_nki", "xla_impl",
]


def get_executed_ops() -> list[str]:
    """The aten ops (``"aten::mm"``, ``"aten::add.Tensor"``) that ran on ``neuron`` tensors
    since the process started or :func:`clear_op_tracking`, sorted. Views, which do no
    device work, are not ops here; a compiled graph's ops are listed as the kernels it
    ran (``"fused[...]"``), each under its kernel's name."""
    return sorted(name for name, source in timeline.executed.items() if source != "none")


def get_fallback_ops() -> list[str]:
    """The executed ops (see :func:`get_executed_ops`) whose simulated time is the bandwidth
    estimate rather than a kernel: the ops trnsim has no device kernel for, sorted."""
    return sorted(name for name, source in timeline.executed.items() if source == "estimate")


def clear_op_tracking() -> None:
    """Start :func:`get_executed_ops` and :func:`get_fallback_ops` afresh."""
    timeline.executed.clear()


def nki_op(name: str, fn: Callable | None = None, *, mutates_args: Any = (), schema: str | None = None) -> Any:
    """Make a launcher of NKI kernels the PyTorch custom op ``name`` (``"ns::name"``), used
    as ``@torch_neuronx.nki_op("mylib::my_op", mutates_args=())``; see
    :func:`trnsim.backend.nkicall.nki_op`."""
    from trnsim.backend import nkicall

    return nkicall.nki_op(name, fn, mutates_args=mutates_args, schema=schema)


def wrap_nki(kernel: Any) -> Any:
    """An NKI kernel made callable on torch tensors; see :func:`trnsim.backend.nkicall.wrap_nki`."""
    from trnsim.backend import nkicall

    return nkicall.wrap_nki(kernel)
