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


# the instance each chip comes in when $TRNSIM_INSTANCE does not say
DEFAULT_INSTANCE = {"trn1": "trn1.32xlarge", "trn2": "trn2.48xlarge", "trn3": "trn3.48xlarge"}


def instance_name() -> str:
    """The instance this process runs on: ``$TRNSIM_INSTANCE`` (``trnsim run --instance``
    sets it), else the one the device's chip comes in (trn1.32xlarge for Trainium1,
    trn2.48xlarge for Trainium2, the Trainium3 server for Trainium3)."""
    name = settings.env_instance()
    if name is not None:
        return name
    chip_name = chip().name
    found = DEFAULT_INSTANCE.get(chip_name)
    if found is None:
        from trnsim.hw.fabric import instances

        found = next((n for n, inst in instances().items() if inst.spec.chip == chip_name), None)
    if found is None:
        raise TrnSimError(f"no instance of chip {chip_name!r} is known to the fabric model; set TRNSIM_INSTANCE "
                          "to one that `trnsim chips` lists")
    return found


_visible: dict[tuple, int] = {}


def device_count() -> int:
    """The ``neuron`` devices this process sees, as the Neuron runtime shows them: every
    logical NeuronCore of one server of the instance (64 on a trn2.48xlarge, 32 on a
    trn1.32xlarge), or those ``NEURON_RT_VISIBLE_CORES`` / ``NEURON_RT_NUM_CORES`` leave."""
    key = (chip().name, settings.env_instance(), os.environ.get("NEURON_RT_VISIBLE_CORES"),
           os.environ.get("NEURON_RT_NUM_CORES"))
    count = _visible.get(key)
    if count is None:
        from trnsim.hw.fabric import instance

        count = _visible[key] = settings.visible_cores(instance(instance_name()).cores_per_server)
    return count


def launcher_local_rank() -> int | None:
    """``$LOCAL_RANK`` as torchrun sets it (None outside a launcher): the NeuronCore of the
    instance this process drives."""
    raw = os.environ.get("LOCAL_RANK")
    return int(raw) if raw is not None and raw.isdigit() else None


class InvalidDeviceError(TrnSimError, RuntimeError):
    """A ``neuron`` device index outside ``range(torch.neuron.device_count())`` (CUDA's
    "invalid device ordinal"; a RuntimeError, as CUDA's is), or another NeuronCore than the
    one this process drives."""


def visible_index(index: Any) -> int:
    """``index`` if it is one of the devices this process sees (any core of the instance,
    ``range(device_count())``); otherwise raise :class:`InvalidDeviceError`."""
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InvalidDeviceError(f"invalid neuron device index {index!r}; pass a whole number from 0 to "
                                 f"{device_count() - 1} (torch.neuron.device_count())")
    count = device_count() if index else 1
    if index >= count:
        raise InvalidDeviceError(
            f"invalid neuron device index {index}: this process sees {count} neuron devices "
            f"(torch.neuron.device_count(), the logical NeuronCores of one {instance_name()} server), "
            f"so neuron:0 to neuron:{count - 1}")
    return index


def check_device_index(index: int | None) -> int:
    """The index PyTorch gives this process's device (0) for ``index``, if ``index`` names
    that device; otherwise raise :class:`InvalidDeviceError` naming the index and the fix.

    A process drives one NeuronCore, as Neuron runs one process per core: the core
    ``$LOCAL_RANK`` names under a launcher (``neuron:<LOCAL_RANK>``), which PyTorch numbers
    ``neuron:0`` (every tensor reports ``neuron:0``). ``None`` and ``0`` name it too. Other
    indices below :func:`device_count` are the instance's other cores: refused, because
    PyTorch's autograd engine keeps work queues only for device 0 of a device written in
    Python, so tensors on any other index could not train (see docs/device.md).
    """
    if index is None or visible_index(index) == 0:
        return 0
    own = launcher_local_rank()
    if index == own:
        return 0
    mine = (f"neuron:{own} (LOCAL_RANK={own}), which PyTorch numbers neuron:0" if own is not None
            else "neuron:0, as no launcher set LOCAL_RANK")
    raise InvalidDeviceError(
        f"neuron:{index} is another NeuronCore of the instance; this process drives one core, {mine}. "
        "trnsim runs one process per NeuronCore, as Neuron does: start one process per core with torchrun "
        "(or accelerate launch) and use device 'neuron' or f'neuron:{LOCAL_RANK}' in each (docs/device.md)")


def any_device_index(dev: Any) -> int:
    """The index ``dev`` names (None: 0) if it is any device this process sees, its own or
    another core of the instance: for what every core shares (its name, its properties)."""
    if dev is None:
        return 0
    if isinstance(dev, int):
        return visible_index(dev)
    d = torch.device(dev)
    if d.type != "neuron":
        raise ValueError(f"expected a neuron device, got {d}; use torch.neuron for neuron devices only")
    return 0 if d.index is None else visible_index(d.index)


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
