"""Lazily conjugated and negated tensors (``x.conj()``, ``x.conj().imag``) on ``neuron``.

A conjugate or negative view shares its input's memory and carries a bit on its
TensorImpl. PyTorch's Conjugate and Negative fallbacks resolve the bit before most
ops by cloning the tensor. Cloning a neuron tensor ends in ``copy_``, which for a
device without a C++ copy kernel calls ``_copy_from``, which the math-bit fallbacks
would resolve again by cloning, without end (a stack overflow). The CPU's ``copy_``
handles the bits itself, so ``_copy_from`` goes straight through these two keys to the
neuron fallback, whose host aliases carry the bits to the CPU kernel
(:func:`trnsim.backend.storage.host_alias`).
"""

from __future__ import annotations

import torch

# the ops through which the CPU's copy kernel is reached from the neuron device
_COPIES = ("_copy_from", "_copy_from_and_resize")
_KEYS = ("Conjugate", "Negative")


def install(lib: torch.library.Library) -> None:
    """Let the copies into and out of neuron memory through the math-bit keys
    (``lib`` is an ``aten`` IMPL library)."""
    for key in _KEYS:
        for name in _COPIES:
            lib.impl(name, torch.library.fallthrough_kernel, key)
