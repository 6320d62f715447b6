"""``nki_cpu_simulator.nki``: trnsim's NKI (every name of :mod:`trnsim.nki`, looked up
there) and :func:`cpu_simulate`.

This is a module of its own, not :mod:`trnsim.nki`, so that ``cpu_simulate`` (the
simulator's name, which AWS's ``nki`` lacks) stays out of ``import nki``. Submodules of
``nki`` that the NKI library imports after its test set-up put this module in
``sys.modules["nki"]`` (``nki.collectives``) still resolve to trnsim's, through
:data:`__trnsim_alias_of__`.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import trnsim.nki as _nki
# ``dtype`` is the module of data types here, as in AWS's simulator, whose set-up also puts it in
# sys.modules["nki.dtype"]: ``import nki.dtype as nt`` takes the attribute before the module
from trnsim.compat.nki_cpu_simulator.nki.language import dtypes as dtype  # noqa: F401 - a name of the module
from trnsim.nki.jit import PLATFORM_TARGETS, Simulated, platform_target, simulate

# the module whose names and submodules this one stands for (read by trnsim.compat.aliases)
__trnsim_alias_of__ = "trnsim.nki"
#: The variable AWS's simulator reads for the NeuronCore generation (``gen2``, ``gen3``, ``gen4``).
NC_VERSION_ENV = "NKI_NC_VERSION"


def cpu_simulate(kernel: Callable) -> Simulated:
    """``cpu_simulate(kernel)[lnc](**numpy_inputs)``: run ``kernel`` (a function or an
    ``@nki.jit`` kernel) on trnsim's simulator, at instruction fidelity, and return its
    outputs as numpy arrays, as :func:`trnsim.nki.simulate` does; ``[lnc]`` launches it
    on that many logical cores. The chip is ``$NEURON_PLATFORM_TARGET_OVERRIDE``'s, else
    ``$NKI_NC_VERSION``'s (``gen2`` trn1, ``gen3`` trn2, ``gen4`` trn3), else trnsim's default."""
    chip = platform_target()
    if chip is None:
        version = os.environ.get(NC_VERSION_ENV, "").strip().lower()
        if version and version not in PLATFORM_TARGETS:
            raise _nki.KernelError(f"{NC_VERSION_ENV}={version!r} is not a NeuronCore generation; "
                                   "use gen2 (trn1), gen3 (trn2) or gen4 (trn3)")
        chip = PLATFORM_TARGETS.get(version)
    return simulate(kernel, chip=chip)


def __getattr__(name: str) -> Any:
    return getattr(_nki, name)


def __dir__() -> list[str]:
    return sorted(set(dir(_nki)) | set(globals()))
