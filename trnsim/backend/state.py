"""Process-wide state of the one simulated ``neuron`` device: its chip, fidelity,
HBM account and simulated clock. Nothing here loads the simulator."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from trnsim import settings
from trnsim.errors import TrnSimError

FIDELITIES = settings.FIDELITIES


class MemoryAccount:
    """Exact byte counts of simulated HBM, like the CUDA caching allocator's statistics
    (without a cache: reserved equals allocated)."""

    def __init__(self) -> None:
        self.capacity: int | None = None   # set when the chip is first needed
        self.allocated = 0
        self.peak = 0
        self.total_allocated = 0
        self.total_freed = 0
        self.allocations = 0
        self.frees = 0
        self.ooms = 0

    def check(self, nbytes: int) -> None:
        """Raise torch.OutOfMemoryError if ``nbytes`` more would not fit."""
        cap = self.capacity if self.capacity is not None else device_capacity()
        if self.allocated + nbytes > cap:
            self.ooms += 1
            chip_name = chip().name
            raise torch.OutOfMemoryError(
                f"neuron out of memory: tried to allocate {_fmt(nbytes)} with {_fmt(self.allocated)} already "
                f"allocated of the {_fmt(cap)} HBM of one {chip_name} NeuronCore ({_fmt(cap - self.allocated)} free); "
                "free tensors, use smaller batches or a chip with more HBM (TRNSIM_CHIP)")

    def allocate(self, nbytes: int) -> None:
        self.check(nbytes)
        self.allocated += nbytes
        self.total_allocated += nbytes
        self.allocations += 1
        if self.allocated > self.peak:
            self.peak = self.allocated

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes
        self.total_freed += nbytes
        self.frees += 1

    def reallocate(self, old: int, new: int) -> None:
        """One block going from ``old`` to ``new`` bytes in place (an ``out=`` argument a
        kernel regrew): counted as CUDA counts a reallocation, one allocation of ``new``
        and one free of ``old``, so the live count stays the number of live blocks."""
        self.check(new - old)
        self.allocated += new - old
        self.total_allocated += new
        self.total_freed += old
        self.allocations += 1
        self.frees += 1
        if self.allocated > self.peak:
            self.peak = self.allocated


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"


@dataclass
class Clock:
    """Simulated time of the eager timeline, in picoseconds.

    ``host`` is when the host issues its next op, ``device`` when the device finishes
    the last op it was given; ops run one after another on the device.
    """

    host: int = 0
    device: int = 0
    ops: int = 0
    syncs: int = 0


memory = MemoryAccount()
clock = Clock()
_chip = None
_fidelity: str | None = None


def chip():
    """The chip of the ``neuron`` device (``$TRNSIM_CHIP``, default trn2), loaded once."""
    global _chip
    if _chip is None:
        from trnsim.hw.spec import load_chip

        _chip = load_chip(None)
        memory.capacity = _chip.device_hbm_bytes
    return _chip


def set_chip(spec) -> None:
    """Use ``spec`` (a name, a TOML path or a ChipSpec) for the device from now on."""
    global _chip
    from trnsim.hw.spec import ChipSpec, load_chip_from

    new = spec if isinstance(spec, ChipSpec) else load_chip_from(spec, f"set_chip({spec!r})", "")
    if memory.allocated > new.device_hbm_bytes:
        raise torch.OutOfMemoryError(
            f"cannot switch the neuron device to {new.name}: {_fmt(memory.allocated)} is allocated and it has "
            f"{_fmt(new.device_hbm_bytes)}; free tensors first")
    _chip = new
    memory.capacity = new.device_hbm_bytes


def device_capacity() -> int:
    return chip().device_hbm_bytes


def fidelity() -> str:
    """The current fidelity: ``op`` (default), ``instruction`` or ``timing``."""
    global _fidelity
    if _fidelity is None:
        _fidelity = env_fidelity()
    return _fidelity


def env_fidelity() -> str:
    """The fidelity ``TRNSIM_FIDELITY`` asks for (``op`` when unset), checked."""
    return settings.env_fidelity()


def set_fidelity(value: str) -> None:
    """Switch fidelity for the ops that follow (tensors made under ``timing`` keep no data)."""
    global _fidelity
    _fidelity = settings.fidelity(value if isinstance(value, str) else "", f"set_fidelity({value!r})", "pass")


DEVICE_COUNT = 1   # one logical NeuronCore per process, as Neuron runs one process per core


def launcher_local_rank() -> int | None:
    """``$LOCAL_RANK`` as torchrun sets it (None outside a launcher): the NeuronCore of the
    instance this process drives. ``torch.neuron.set_device(local_rank)`` and tensors on
    ``neuron:<local_rank>`` name this process's one device, which PyTorch numbers 0."""
    raw = os.environ.get("LOCAL_RANK")
    return int(raw) if raw is not None and raw.isdigit() else None


class InvalidDeviceError(TrnSimError, RuntimeError):
    """A ``neuron`` device index outside ``range(torch.neuron.device_count())`` (CUDA's
    "invalid device ordinal"; a RuntimeError, as CUDA's is)."""


def check_device_index(index: int | None) -> int:
    """``index`` (None means the current device, 0) if it names a device of this
    process; otherwise raise :class:`InvalidDeviceError` naming the index and the fix."""
    if index is None:
        return 0
    if index == launcher_local_rank() and not isinstance(index, bool):
        return 0   # this process's own core, as torchrun numbers it: the one device it drives
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < DEVICE_COUNT:
        raise InvalidDeviceError(
            f"invalid neuron device index {index!r}: this process has {DEVICE_COUNT} neuron device "
            f"(torch.neuron.device_count() == {DEVICE_COUNT}, so only neuron:0), as Neuron runs one process per "
            "NeuronCore; for more cores start one process per core with torchrun (each process's LOCAL_RANK "
            "says which core it is) and use device 'neuron' in each (docs/device.md)")
    return index


def device_index(dev: Any) -> int:
    """The device index that ``dev`` (None, an int, a string or a torch.device) names,
    refused unless it is a neuron device of this process (:func:`check_device_index`);
    another device type raises ValueError, as torch.cuda's functions do for a CPU device."""
    if dev is None or isinstance(dev, int):
        return check_device_index(dev)
    d = torch.device(dev)
    if d.type != "neuron":
        raise ValueError(f"expected a neuron device, got {d}; use torch.neuron for neuron devices only")
    return check_device_index(d.index)


def no_data_error() -> RuntimeError:
    return RuntimeError(
        "this neuron tensor was made under TRNSIM_FIDELITY=timing, which keeps shapes and times but no values; "
        "run with fidelity 'op' or 'instruction' to read values")
