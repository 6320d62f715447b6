"""trnsim's ``torch_xla``: what ``import torch_xla`` gives without PyTorch/XLA installed.

The Neuron SDK's older tutorials and NKI samples run their kernels through PyTorch/XLA
(``device = xm.xla_device()``, ``xm.mark_step()``). Here those names stand for trnsim's
``neuron`` device: the XLA device is ``torch.device("neuron", i)`` and a step boundary
waits for the queued work (``torch.neuron.synchronize``). Only the device API that NKI
code uses is provided: :mod:`.core.xla_model` and the top-level :func:`device`,
:func:`devices`, :func:`device_count` and :func:`sync`. There is no ``torch_xla.runtime``
nor any XLA graph: ops on ``neuron`` tensors run eagerly, as they do on TorchNeuron.

Libraries that switch to their TPU code paths when they find ``torch_xla``
(transformers, accelerate, peft, ...) do not see this alias (see
:mod:`trnsim.compat.aliases`), and importing it sets ``USE_TORCH_XLA=0`` unless it is
set, which those libraries read when they are imported after it.
"""

from __future__ import annotations

import os
import sys

import torch

import trnsim  # registers the neuron device
from trnsim.compat.torch_xla import core

__version__ = trnsim.__version__

# transformers and accelerate take their TPU paths when ``torch_xla`` is importable
# unless USE_TORCH_XLA says otherwise: once a script has imported this alias, every
# library sees it in sys.modules, so it says otherwise (a value the user set stays).
# transformers reads the variable when it is imported: one imported before this alias
# gets the value too.
if "USE_TORCH_XLA" not in os.environ:
    os.environ["USE_TORCH_XLA"] = "0"
    _hf = sys.modules.get("transformers.utils.import_utils")
    if _hf is not None and hasattr(_hf, "USE_TORCH_XLA"):
        _hf.USE_TORCH_XLA = "0"

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
