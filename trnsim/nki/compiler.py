"""``nki.compiler``: compiler hints and explicit allocation.

trnsim places tiles itself (first fit, given back when a tile dies), so the hints
are accepted and change nothing: ``skip_middle_end_transformations``,
``enable_stack_allocator`` and ``force_auto_alloc`` return the kernel unchanged, and
the ``buffer=ncc.sbuf.mod_alloc(...)`` allocators give the plain memory
(``nl.sbuf`` / ``nl.psum``), so a kernel that asks for fixed addresses gets
trnsim's placement instead.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from trnsim.isa import Memory

__all__ = ["skip_middle_end_transformations", "enable_stack_allocator", "force_auto_alloc", "no_reorder",
           "sbuf", "psum"]


def _hint(name: str) -> Callable[..., Any]:
    def hint(func: Any = None, **options: Any) -> Any:
        if func is None:
            return lambda f: f
        return func

    hint.__name__ = name
    hint.__doc__ = f"``@nki.compiler.{name}``: accepted; trnsim's placement and schedule do not change."
    return hint


skip_middle_end_transformations = _hint("skip_middle_end_transformations")
enable_stack_allocator = _hint("enable_stack_allocator")
force_auto_alloc = _hint("force_auto_alloc")


@contextlib.contextmanager
def no_reorder() -> Iterator[None]:
    """``with nki.compiler.no_reorder():``: trnsim keeps program order inside each
    engine's queue already, so the block runs as written."""
    yield


def _allocators(memory: Memory) -> SimpleNamespace:
    def alloc(*args: Any, **kwargs: Any) -> Memory:
        return memory

    return SimpleNamespace(alloc=alloc, mod_alloc=alloc, auto_alloc=alloc)


_PLACES = "accepted; trnsim places tiles itself, so the tile gets trnsim's placement, not the asked address"
_HINT = "accepted; changes nothing in trnsim's placement or schedule"

#: Documented names that trnsim implements with a difference (read by ``trnsim.nki.apitable``).
DIFFERENCES: dict[str, str] = {
    "skip_middle_end_transformations": _HINT, "enable_stack_allocator": _HINT, "force_auto_alloc": _HINT,
    **{f"{mem}.{kind}": _PLACES for mem in ("sbuf", "psum") for kind in ("alloc", "mod_alloc", "auto_alloc")},
}

#: ``ncc.sbuf.alloc``, ``ncc.sbuf.mod_alloc``, ``ncc.sbuf.auto_alloc``: each gives ``nl.sbuf``.
sbuf = _allocators(Memory.SBUF)
#: ``ncc.psum.alloc``, ``ncc.psum.mod_alloc``, ``ncc.psum.auto_alloc``: each gives ``nl.psum``.
psum = _allocators(Memory.PSUM)
