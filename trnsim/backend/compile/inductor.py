"""``torch.compile(model)`` with its default backend, Inductor, on ``neuron`` tensors.

Inductor generates C++ or Triton code for the CPU and GPUs; it has no code generator for
a PrivateUse1 device, and failed deep inside its code generation (``InductorError:
KeyError: 'neuron'``). :func:`install` wraps the object ``torch.compile`` makes for
``backend="inductor"`` so that a graph with a neuron tensor among its inputs is refused
at its first call, in one line that names ``backend="neuron"``. The wrapper is one
attribute on a class of ``torch`` itself: installing it imports no part of Inductor or
Dynamo, so ``import torch`` stays as fast.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from trnsim.errors import CompileError

MESSAGE = ('torch.compile\'s default backend, Inductor, cannot compile for the neuron device (it generates CPU '
           'and GPU code); compile with torch.compile(model, backend="neuron"), which fuses the graph into '
           'kernels for the simulated chip')

_original = None
_error_class: list[type] = []


def _error() -> Exception:
    """The refusal, as an exception Dynamo passes on without its own frames (a
    ShortenTraceback, whose module loads with Dynamo, hence the class made on first use)."""
    if not _error_class:
        from torch._dynamo.exc import ShortenTraceback

        class InductorDeviceError(CompileError, ShortenTraceback):
            """Inductor was asked to compile a graph of neuron tensors."""

        InductorDeviceError.__qualname__ = InductorDeviceError.__name__
        _error_class.append(InductorDeviceError)
    return _error_class[0](MESSAGE, first_useful_frame=inspect.currentframe().f_back)


def _call(self, model_, inputs_, **kwargs) -> Any:
    if any(isinstance(x, torch.Tensor) and x.device.type == "neuron" for x in inputs_):
        raise _error()
    return _original(self, model_, inputs_, **kwargs)


def install() -> None:
    """Wrap ``torch._TorchCompileInductorWrapper.__call__`` (once)."""
    global _original
    if _original is None:
        _original = torch._TorchCompileInductorWrapper.__call__
        torch._TorchCompileInductorWrapper.__call__ = _call
