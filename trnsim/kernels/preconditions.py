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


def int_pair(v: object, what: str, kernel: str) -> tuple[int, int]:
    """A kernel's 2-D size argument as torch takes it: an int, or a sequence of one or
    two ints (``[0]`` is ``(0, 0)``, as torch.compile's graphs write a padding)."""
    pair = tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    if len(pair) == 1:
        pair = pair * 2
    if len(pair) != 2 or not all(isinstance(p, int) for p in pair):
        raise KernelError(f"{kernel}: {what} {v!r} must be an int or a pair of ints")
    return pair[0], pair[1]
