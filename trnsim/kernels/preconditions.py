"""Shape checks the kernels run before tracing: a shape a kernel's loops do not cover
is refused with one error naming the shape, the rule and the fix, never computed in part."""

from __future__ import annotations

from trnsim.nki.tracer import KernelError


def require(ok: bool, kernel: str, message: str) -> None:
    """Raise KernelError (a ProgramError) ``"{kernel} {message}"`` unless ``ok``."""
    if not ok:
        raise KernelError(f"{kernel} {message}")


def require_multiple(kernel: str, name: str, value: int, multiple: int, fix: str) -> None:
    """Require ``value`` (dimension ``name``) to be a positive multiple of ``multiple``."""
    require(value > 0 and value % multiple == 0, kernel,
            f"needs {name} a multiple of {multiple}, got {name} = {value}; {fix}")
