"""The error and warning classes of trnsim: one base class each, one subclass per concern."""

import os
import sys
import warnings


class TrnSimError(Exception):
    """Base class of every error trnsim raises on purpose."""


class ChipSpecError(TrnSimError, ValueError):
    """A chip description is missing, malformed or names an unknown chip."""


class ProgramError(TrnSimError, ValueError):
    """An instruction or Program breaks a hardware limit (partitions, capacity, alignment)."""


class AllocationError(ProgramError):
    """An SBUF, PSUM or HBM allocation does not fit."""


class SimulationError(TrnSimError, RuntimeError):
    """A Program cannot run to completion (a dependency cycle, a semaphore never signalled)."""


class ConfigError(TrnSimError, ValueError):
    """A setting (an environment variable such as TRNSIM_FIDELITY) has a value trnsim does not know."""


class FileWriteError(TrnSimError, OSError):
    """A file cannot be written where asked (a folder in the way, no permission, no space)."""


class TraceFileError(TrnSimError, ValueError):
    """A trace file cannot be read back: not JSON, not a trnsim trace, or damaged."""


class PathTypeError(TrnSimError, TypeError):
    """A file argument is not a path: a number (which ``open`` would take as a file
    descriptor), None where a path is needed, bytes, an empty string."""


class TrnSimWarning(UserWarning):
    """Base class of every warning trnsim issues: a result that is likely not what was meant."""


class UnwrittenOutputWarning(TrnSimWarning):
    """A simulated Program (or NKI kernel) left part of an output tensor unwritten; those
    elements read as NaN (0 for integer dtypes). Make it an error with
    ``warnings.simplefilter("error", UnwrittenOutputWarning)``."""


class UninitializedReadWarning(TrnSimWarning):
    """A simulated DMA read HBM that nothing wrote (an internal HBM tensor, or an output
    read back before it is stored); those elements read as NaN (0 for integer dtypes)."""


class RecompileWarning(TrnSimWarning):
    """A function compiled with ``torch.compile`` keeps recompiling because an input's shape,
    dtype or a Python value changes between calls; each new graph costs a compile (seconds on
    the real chip). Issued once per function; the message names the changing input."""


def warn(message: str, category: type[TrnSimWarning]) -> None:
    """Issue ``message`` as a ``category`` warning attributed to the first caller outside trnsim."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level + 1)


class CompileError(TrnSimError, RuntimeError):
    """``torch.compile(backend="neuron")`` was asked for something it does not do."""


class CompileModeWarning(TrnSimWarning):
    """A ``torch.compile`` mode or option the ``neuron`` backend does not have; it
    compiles as in the default mode."""


class NotProvidedError(TrnSimError, AttributeError):
    """A name of a real package's API (``torch_neuronx.distributed.X``) that trnsim does not
    provide yet; the message names it and the issue that will bring it."""
