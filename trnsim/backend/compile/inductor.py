"""``torch.compile(model)`` with its default backend, Inductor, on ``neuron`` tensors.

TorchNeuron compiles a graph for a Neuron device with its own backend when the user
names none, so code written for CUDA (``torch.compile(model)``, FlexAttention's
``torch.compile(flex_attention)``, torchtitan's compiled ``create_block_mask``) runs
unchanged. trnsim does the same: :func:`install` wraps the object ``torch.compile``
makes for ``backend="inductor"`` so that a graph holding a ``neuron`` tensor (among
its inputs, or made inside it) goes to the ``neuron`` backend, with the ``mode`` and
``options`` given to ``torch.compile``: as with ``backend="neuron"``, modes other than
``"default"`` and options warn once and compile as the default. Graphs of CPU tensors
still go to Inductor.

The wrapper is two attributes on a class of ``torch`` itself: installing it imports no
part of Inductor or Dynamo, so ``import torch`` stays as fast.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten

_originals: dict[str, Any] = {}


def _is_neuron(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "neuron"


def holds_neuron_tensors(gm: torch.fx.GraphModule, inputs: list) -> bool:
    """Whether Dynamo's graph ``gm`` works on ``neuron`` tensors: one of its ``inputs``
    is, or a value it makes is (a graph that creates its tensors with ``device="neuron"``)."""
    if any(_is_neuron(x) for x in inputs):
        return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if any(_is_neuron(x) for x in tree_flatten(value)[0]):
            return True
    return False


def _init(self, mode: str | None, options: dict | None, dynamic: bool | None, name: str | None = None) -> None:
    _originals["__init__"](self, mode, options, dynamic, name)
    # kept as given: Inductor's own config holds the mode only as the options it stands for
    self.neuron_mode, self.neuron_options = mode, dict(options or {})


def _call(self, model_, inputs_, **kwargs) -> Any:
    if holds_neuron_tensors(model_, inputs_):
        from trnsim.backend.compile.dynamo import neuron_backend

        mode, options = getattr(self, "neuron_mode", None), getattr(self, "neuron_options", None)
        return neuron_backend(model_, inputs_, mode=mode, options=options)
    return _originals["__call__"](self, model_, inputs_, **kwargs)


def install() -> None:
    """Wrap ``torch._TorchCompileInductorWrapper.__init__`` and ``__call__`` (once)."""
    if not _originals:
        cls = torch._TorchCompileInductorWrapper
        _originals.update(__init__=cls.__init__, __call__=cls.__call__)
        cls.__init__, cls.__call__ = _init, _call
