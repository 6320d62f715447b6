"""trnsim's ``torch_xla``: what ``import torch_xla`` gives without PyTorch/XLA installed.

The Neuron SDK's older tutorials and NKI samples run their kernels through PyTorch/XLA
(``device = xm.xla_device()``, ``xm.mark_step()``). Here those names stand for trnsim's
``neuron`` device: the XLA device is ``torch.device("neuron", i)`` and a step boundary
waits for the queued work (``torch.neuron.synchronize``). Only the device API that NKI
code uses is provided: :mod:`.core.xla_model` and the top-level :func:`device`,
:func:`devices`, :func:`device_count` and :func:`sync`. There is no ``torch_xla.runtime``
nor any XLA graph: ops on ``neuron`` tensors run eagerly, as they do on TorchNeuron.

Libraries that switch to their TPU code paths when they find ``torch_xla``
(transformers, accelerate, peft, ...) do not see this alias; see
:mod:`trnsim.compat.aliases`.
"""

from __future__ import annotations

import torch

import trnsim  # registers the neuron device
from trnsim.compat.torch_xla import core

__version__ = trnsim.__version__

__all__ = ["core", "device", "device_count", "devices", "sync"]


def device(index: int | None = None) -> torch.device:
    """The XLA device ``index`` (the current one if None): ``torch.device("neuron", index)``."""
    from trnsim.backend import device as neuron

    return torch.device("neuron", neuron.current_device() if index is None else int(index))


def devices() -> list[torch.device]:
    """Every device this process can address: one ``neuron`` device per NeuronCore."""
    from trnsim.backend import device as neuron

    return [torch.device("neuron", i) for i in range(neuron.device_count())]


def device_count() -> int:
    """How many devices :func:`devices` lists."""
    from trnsim.backend import device as neuron

    return neuron.device_count()


def sync(wait: bool = False) -> None:
    """End the step: wait until the work queued on the device is done (``xm.mark_step``)."""
    from trnsim.backend import device as neuron

    neuron.synchronize()
