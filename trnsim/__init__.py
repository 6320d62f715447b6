"""trnsim: a cycle-approximate simulator of AWS Trainium.

The simulator core (chips, instruction set, timing, numerics, traces) runs on
numpy arrays and never imports torch; importing trnsim registers the PyTorch
``neuron`` device (trnsim.backend), as ``import torch`` alone does when trnsim is
installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trnsim.errors import AllocationError, ChipSpecError, ProgramError, SimulationError, TrnSimError

if TYPE_CHECKING:
    from trnsim.hw.spec import ChipSpec, load_chip, shipped_chips
    from trnsim.program import Program

__version__ = "0.1.0"

# Loaded on first use: ``import torch`` imports trnsim (the backend autoload), and the
# device's registration needs none of the simulator.
_LAZY = {"ChipSpec": "trnsim.hw.spec", "load_chip": "trnsim.hw.spec", "shipped_chips": "trnsim.hw.spec",
         "Program": "trnsim.program"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trnsim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

from trnsim.compat.aliases import install as _install_aliases  # noqa: E402
from trnsim.backend import register as _register_device  # noqa: E402

# ``import nki`` / ``neuronxcc.nki`` / ``torch_neuronx`` give trnsim's modules unless the
# real packages are installed (TRNSIM_NO_ALIASES=1: never)
_install_aliases()
_register_device()

__all__ = [
    "AllocationError",
    "ChipSpec",
    "ChipSpecError",
    "Program",
    "ProgramError",
    "SimulationError",
    "TrnSimError",
    "load_chip",
    "profile",
    "set_fidelity",
    "shipped_chips",
    "simulate",
]


def simulate(program: Program, inputs: dict | None = None, *, fidelity: str = "timing", trace: object = None):
    """Run ``program`` on its chip; see :func:`trnsim.simulator.simulate`."""
    from trnsim.simulator import simulate as _simulate

    return _simulate(program, inputs, fidelity=fidelity, trace=trace)


def profile(path=None, *, engines: bool = True):
    """Record the ``neuron`` device's ops; see :class:`trnsim.backend.profiler.profile`."""
    from trnsim.backend.profiler import profile as _profile

    return _profile(path, engines=engines)


def set_fidelity(value: str) -> None:
    """``op`` (default), ``instruction`` or ``timing`` for the ``neuron`` device."""
    from trnsim.backend.state import set_fidelity as _set

    _set(value)
