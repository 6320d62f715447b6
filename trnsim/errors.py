"""The error classes of trnsim: one base class, one subclass per concern."""


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


class TrnSimWarning(UserWarning):
    """Base class of every warning trnsim issues: a result that is likely not what was meant."""


class UnwrittenOutputWarning(TrnSimWarning):
    """A simulated Program (or NKI kernel) left part of an output tensor unwritten; those
    elements read as NaN (0 for integer dtypes). Make it an error with
    ``warnings.simplefilter("error", UnwrittenOutputWarning)``."""
