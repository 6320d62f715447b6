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


class ConfigError(TrnSimError, ValueError):
    """A setting (an environment variable such as TRNSIM_FIDELITY) has a value trnsim does not know."""


class FileWriteError(TrnSimError, OSError):
    """A file cannot be written where asked (a folder in the way, no permission, no space)."""


class TraceFileError(TrnSimError, ValueError):
    """A trace file cannot be read back: not JSON, not a trnsim trace, or damaged."""
