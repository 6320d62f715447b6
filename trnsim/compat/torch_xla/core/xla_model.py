"""``torch_xla.core.xla_model`` (``xm``) on trnsim's ``neuron`` device.

The XLA device is ``neuron``; :func:`mark_step` waits for queued work instead of
cutting a lazy graph; ordinals and world size come from ``torch.distributed`` when a
process group is up (torchrun, one process per core) and are 0 and 1 otherwise. The
random state is the device generator's seed, an int, as PyTorch/XLA keeps it.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, TextIO

import torch

from trnsim.compat import torch_xla

__all__ = [
    "get_local_ordinal", "get_ordinal", "get_rng_state", "is_master_ordinal", "mark_step", "master_print",
    "mesh_reduce", "optimizer_step", "rendezvous", "set_rng_state", "wait_device_ops", "xla_device",
    "xla_device_hw", "xrt_world_size",
]


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """The device to put tensors on: ``torch.device("neuron", n)``, the current core if
    ``n`` is None. ``devkind`` (``"TPU"``, ``"NEURON"``) picks nothing: there is one kind."""
    return torch_xla.device(n)


def xla_device_hw(device: Any) -> str:
    """The hardware behind ``device``: ``"NEURON"``."""
    return "NEURON"


def mark_step(wait: bool = False) -> None:
    """End the step: wait until the work queued on the device is done."""
    torch_xla.sync(wait)


def wait_device_ops(devices: Any = None) -> None:
    """Wait until every op queued on the device is done."""
    torch_xla.sync(True)


def _group() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def get_ordinal(local: bool = False) -> int:
    """This process's rank among all replicas (``local``: on this instance)."""
    if local:
        return get_local_ordinal()
    return _group()[0]


def get_local_ordinal() -> int:
    """This process's rank on its instance (``LOCAL_RANK``, 0 without a launcher)."""
    from trnsim.backend import state

    return state.launcher_local_rank() or 0


def xrt_world_size() -> int:
    """How many replicas take part: the process group's size, 1 without one."""
    return _group()[1]


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this process is replica 0 (``local``: of its instance)."""
    return get_ordinal(local=local) == 0


def master_print(*args: Any, fd: TextIO | None = None, finalize: bool = False, **kwargs: Any) -> None:
    """``print`` on the master replica only."""
    if is_master_ordinal(local=False):
        print(*args, file=fd if fd is not None else sys.stdout, **kwargs)


def rendezvous(tag: str, payload: bytes = b"", replicas: Any = None) -> list[bytes]:
    """Wait for every replica to arrive at ``tag``; returns each replica's ``payload``."""
    import torch.distributed as dist

    world = _group()[1]
    if world == 1:
        return [payload]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, payload)
    return gathered


def mesh_reduce(tag: str, data: Any, reduce_fn: Callable[[list[Any]], Any]) -> Any:
    """``reduce_fn`` of every replica's ``data`` (a host object), the same on every replica."""
    import torch.distributed as dist

    world = _group()[1]
    if world == 1:
        return reduce_fn([data])
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, data)
    return reduce_fn(gathered)


def optimizer_step(optimizer: torch.optim.Optimizer, barrier: bool = False,
                   optimizer_args: dict[str, Any] | None = None, groups: Any = None, pin_layout: bool = True) -> Any:
    """Average the gradients over the replicas (when there are several), then step
    ``optimizer``; returns what ``optimizer.step`` returns."""
    import torch.distributed as dist

    world = _group()[1]
    if world > 1:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    dist.all_reduce(param.grad)
                    param.grad.div_(world)
    result = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return result


def get_rng_state(device: Any = None) -> int:
    """The seed of the device's random generator, an int."""
    from trnsim.backend import device as neuron

    return int(neuron.initial_seed())


def set_rng_state(seed: int, device: Any = None) -> None:
    """Seed the device's random generator with ``seed``."""
    from trnsim.backend import device as neuron

    neuron.manual_seed(int(seed))
