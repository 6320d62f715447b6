"""torch.distributed on the ``neuron`` device: the ``"neuron"`` process-group backend.

:func:`register` (run when the device registers) makes ``backend="neuron"`` known to
torch.distributed for ``neuron`` tensors; the group itself (:mod:`.group`) and the
fabric model load at the first ``init_process_group``.
"""

from __future__ import annotations


def _create(options, backend_options=None):
    from trnsim.backend.distributed.group import create

    return create(options, backend_options)


def register() -> None:
    """Register backend ``"neuron"`` with torch.distributed (idempotent)."""
    import torch.distributed as dist

    if not dist.is_available() or "NEURON" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("neuron", _create, extended_api=True, devices=["neuron"])
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = set_timeout


def set_timeout(timeout, group=None) -> None:
    """``torch.distributed.set_timeout`` of PyTorch 2.14 (TorchNeuron runs on 2.13 and 2.14;
    torchtitan 0.3 calls it after its first step): the timeout of ``group``'s (default:
    the default group's) collectives from now on. Given on 2.13, where it is missing."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timeout, group)
