"""``torch.compile(backend="neuron")``: whole graphs as fused kernels on the simulated chip.

The backend is registered under the ``torch_dynamo_backends`` entry point, so
``backend="neuron"`` needs no import. Dynamo's graphs go through AOT Autograd with a
decomposition table to core aten ops (forward and backward graphs for training, one
graph for inference; no Inductor); each graph is partitioned into fused kernels
(:mod:`.partition`), timed (:mod:`.lower`) and run (:mod:`.runtime`).

As on the real backend: shapes are static (``dynamic=False`` is the default and
``dynamic=True`` is refused), modes other than ``"default"`` warn and compile as the
default, ``fullgraph`` and graph breaks both work.
"""

from __future__ import annotations

from typing import Any

__all__ = ["neuron_backend"]


def __getattr__(name: str) -> Any:
    # the backend (and with it torch._dynamo) loads when backend="neuron" is looked up,
    # not when a profile reads the compile metrics
    if name == "neuron_backend":
        from trnsim.backend.compile.dynamo import neuron_backend

        return neuron_backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
