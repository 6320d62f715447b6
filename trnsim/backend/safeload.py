"""``safetensors`` loading onto ``neuron``.

``safetensors.torch.load_file(path, device=...)`` opens the file with the device named,
and its reader knows the devices it was built for, not ``neuron`` ("device neuron is
invalid"). PEFT's ``load_peft_weights`` passes it the current accelerator, so loading a
LoRA adapter while ``neuron`` is the accelerator failed. :func:`install` makes the
``safe_open`` that ``safetensors.torch`` calls read a ``neuron`` file's tensors on the
host and move each to the device (once the module loads: an import hook, so ``import
torch`` does not import safetensors). Other devices go to safetensors as they are.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from trnsim.backend import importhook

MODULE = "safetensors.torch"


def _on_neuron(device: Any) -> torch.device | None:
    """``device`` as a ``neuron`` torch device, or None for any other."""
    if isinstance(device, torch.device):
        return device if device.type == "neuron" else None
    if isinstance(device, str) and (device == "neuron" or device.startswith("neuron:")):
        return torch.device(device)
    return None


class _Moved:
    """A ``safe_open`` handle on the host whose tensors come out on ``device``."""

    def __init__(self, handle: Any, device: torch.device) -> None:
        self._handle = handle
        self._device = device

    def __enter__(self) -> _Moved:
        self._handle.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._handle.__exit__(*exc)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._handle.get_tensor(name).to(self._device)

    def get_tensors(self) -> dict[str, torch.Tensor]:
        return {k: v.to(self._device) for k, v in self._handle.get_tensors().items()}

    def __getattr__(self, name: str) -> Any:   # keys, metadata, get_slice, offset_keys ...
        return getattr(self._handle, name)


def _patch(module: ModuleType) -> None:
    original = module.safe_open
    if getattr(original, "trnsim_neuron", False):
        return

    def safe_open(filename: Any, framework: str, device: Any = "cpu", **kwargs: Any) -> Any:
        target = _on_neuron(device)
        if target is None:
            return original(filename, framework=framework, device=device, **kwargs)
        return _Moved(original(filename, framework=framework, device="cpu", **kwargs), target)

    safe_open.trnsim_neuron = True   # type: ignore[attr-defined]
    module.safe_open = safe_open


def install() -> None:
    """Let ``safetensors.torch`` load onto ``neuron`` (now if loaded, else when it loads)."""
    importhook.when_imported(MODULE, _patch)
