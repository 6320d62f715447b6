"""``neuronxcc`` when the Neuron compiler is not installed: only ``neuronxcc.nki``,
which is :mod:`trnsim.nki` (see :mod:`trnsim.compat.aliases`)."""

from __future__ import annotations

import importlib
from types import ModuleType

# a package, so that the import system looks for neuronxcc.nki below it
__path__: list[str] = []


def __getattr__(name: str) -> ModuleType:
    # ``from neuronxcc import nki`` looks the submodule up under this module's own name
    # (trnsim.compat.neuronxcc): give it the aliased one
    if name == "nki":
        return importlib.import_module("neuronxcc.nki")
    raise AttributeError(f"module 'neuronxcc' has no attribute {name!r}; trnsim provides only neuronxcc.nki")
