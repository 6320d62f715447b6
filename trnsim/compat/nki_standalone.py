"""``neuronxcc.nki_standalone`` when the Neuron compiler is not installed: compiling a
kernel on its own, from numpy inputs by name, as nki-library's test framework does in its
``trace_only`` and ``compile_only`` modes (``test/utils/kernel_tracer.py``).

The compiler lowers the kernel to its IR and then to a NEFF; trnsim has neither. Here
"compiling" traces the kernel into a trnsim Program on the chip named by the target
(``trn1``, ``trn2``, ``trn3``), which runs every check trnsim makes at trace time (the
kernel's own asserts included), and what would be written as IR or a NEFF is the
Program's instruction listing, a text file. A kernel that traces passes, as one the
compiler lowers does; the listing is for reading, no Neuron tool takes it.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Any

__all__ = ["NKI_IR_VERSION", "compile_nki_ir_kernel_to_neff"]

# a name the framework gives an argument whose output aliases it, not the kernel's
# parameter name (its simulation mode strips it so too)
_ALIAS_SUFFIX = ".must_alias_input"
LISTING = "kernel.trnsim.txt"


class NKI_IR_VERSION(enum.Enum):   # the compiler's name
    """The NKI IR versions a kernel is lowered to (the same trace in trnsim)."""

    beta1 = "beta1"
    beta2 = "beta2"


class TracedKernel:
    """A kernel traced for compilation: its Program and what it was traced for."""

    def __init__(self, name: str, program: Any, target: str, lnc: int) -> None:
        self.name, self.program, self.target, self.lnc = name, program, target, lnc

    def listing(self) -> str:
        return self.program.listing(f"{self.name} traced by trnsim for {self.target} (logical NeuronCores: {self.lnc}); "
                                    f"{len(self.program.instructions)} instructions; not NKI IR or a NEFF")


def _trace(kernel: Any, target: str, lnc: Any, inputs: dict[str, Any]) -> TracedKernel:
    from trnsim import nki

    lnc = int(lnc or 1)
    if lnc < 1:
        raise ValueError(f"logical_nc_config={lnc!r}: give 1 or 2, the logical NeuronCores the kernel spans")
    args = {k.removesuffix(_ALIAS_SUFFIX): v for k, v in (inputs or {}).items()}
    jitted = nki.jit(kernel)
    launched = jitted[lnc] if lnc > 1 else jitted
    program = nki.trace_program(launched, chip=str(target), **args)
    return TracedKernel(getattr(kernel, "__name__", type(kernel).__name__), program, str(target), lnc)


def _write(traced: TracedKernel, directory: str | os.PathLike, name: str) -> Path:
    from trnsim.atomic import write_atomic

    path = Path(directory) / name
    write_atomic(path, lambda f: f.write(traced.listing()))
    return path


def _compile_nki_ir_to_tensorizer_ir(kernel: Any, target: str, lnc: Any, inputs: dict[str, Any], outputs: Any,
                                     version: Any = NKI_IR_VERSION.beta2) -> tuple[TracedKernel, None]:
    """Trace ``kernel`` on ``inputs`` (numpy arrays and values by parameter name) for chip
    ``target``; returns the traced kernel (the compiler returns its IR module) and None."""
    return _trace(kernel, target, lnc, inputs), None


def _write_tensorizer_ir(traced: TracedKernel, directory: str | os.PathLike) -> Path:
    """Write the traced kernel's instruction listing into ``directory``."""
    return _write(traced, directory, LISTING)


def compile_nki_ir_kernel_to_neff(kernel: Any, inputs: dict[str, Any], outputs: Any, target: str, lnc: Any,
                                  directory: str | os.PathLike, version: Any = NKI_IR_VERSION.beta2,
                                  additional_args: Any = None) -> Path:
    """Trace ``kernel`` as :func:`_compile_nki_ir_to_tensorizer_ir` does and write its
    instruction listing into ``directory`` (there is no NEFF); returns the listing's path."""
    return _write(_trace(kernel, target, lnc, inputs), directory, LISTING)
