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
