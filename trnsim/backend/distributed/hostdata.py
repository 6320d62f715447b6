"""Host memory of the tensors a collective moves: what gloo reads and writes.

A ``neuron`` tensor's data lives in host memory (:mod:`trnsim.backend.storage`); gloo
works on CPU tensors. A dense tensor is handed over as a zero-copy CPU alias; a tensor
gloo cannot take as it is (not contiguous) goes through a contiguous copy, written back
when the collective is done. CPU tensors pass through untouched.
"""

from __future__ import annotations

import torch

from trnsim.backend import storage


class HostView:
    """The CPU tensor gloo works on for one tensor of a collective."""

    __slots__ = ("tensor", "host", "_copied", "_output")

    def __init__(self, tensor: torch.Tensor, output: bool) -> None:
        self.tensor = tensor
        self._output = output
        on_device = tensor.device.type == "neuron"
        alias = storage.host_alias(tensor, overwrite=output and on_device) if on_device else tensor
        self._copied = not alias.is_contiguous()
        self.host = alias.contiguous() if self._copied else alias

    def finish(self) -> None:
        """After the collective wrote ``host``: the tensor has the result."""
        if not self._output:
            return
        if self._copied:
            storage.host_alias(self.tensor).copy_(self.host)
        if self.tensor.device.type == "neuron":
            storage.mark_written(self.tensor)


def has_data(tensors: list[torch.Tensor]) -> bool:
    """Whether the tensors hold values (neuron tensors made in ``timing`` fidelity keep
    none: their collectives are timed, and nothing moves)."""
    for t in tensors:
        if t.device.type == "neuron" and t.untyped_storage()._trnsim_block.host is None and t.untyped_storage().nbytes():
            return False
    return True


def inputs(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """CPU tensors to read ``tensors`` through."""
    return [HostView(t, output=False).host for t in tensors]


def outputs(tensors: list[torch.Tensor]) -> list[HostView]:
    """Host views for ``tensors`` that a collective writes whole."""
    return [HostView(t, output=True) for t in tensors]


def in_place(tensors: list[torch.Tensor]) -> list[HostView]:
    """Host views for ``tensors`` that a collective reads and then writes (all-reduce,
    broadcast): their data is read, so nothing is skipped as unwritten."""
    views = []
    for t in tensors:
        v = HostView(t, output=False)
        v._output = True
        views.append(v)
    return views
