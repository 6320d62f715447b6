"""``nki.compiler``: compiler hints and direct allocation.

The hints are accepted and change nothing: ``skip_middle_end_transformations``,
``enable_stack_allocator`` and ``force_auto_alloc`` return the kernel unchanged.
``buffer=ncc.sbuf.mod_alloc(...)``, ``ncc.sbuf.alloc(func)`` and their PSUM twins place
each logical block where they say (:mod:`trnsim.nki.allocation`); ``auto_alloc()``
gives the plain memory (``nl.sbuf`` / ``nl.psum``), placed by trnsim.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, Callable, Iterator

from trnsim.isa import Memory
from trnsim.nki.allocation import DirectAllocation, LocateFunc, psum_mod_alloc, sbuf_mod_alloc

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


def _allocators(memory: Memory, mod_alloc: Callable[..., DirectAllocation]) -> SimpleNamespace:
    kind = memory.value

    def alloc(func: LocateFunc) -> DirectAllocation:
        return DirectAllocation(memory, func, f"ncc.{kind}.alloc({getattr(func, '__name__', func)!r})")

    def auto_alloc(*args: Any, **kwargs: Any) -> Memory:
        return memory

    alloc.__doc__ = (f"``ncc.{kind}.alloc(func)``: logical block ``idx`` where ``func(idx, pdim_size, fdim_size)`` "
                     "says" + (" ((bank, start_partition, byte_addr))" if memory is Memory.PSUM
                               else " ((start_partition, byte_addr))"))
    auto_alloc.__doc__ = f"``ncc.{kind}.auto_alloc()``: ``nl.{kind}``, placed by trnsim."
    return SimpleNamespace(alloc=alloc, mod_alloc=mod_alloc, auto_alloc=auto_alloc)


_HINT = "accepted; changes nothing in trnsim's placement or schedule"

#: Documented names that trnsim implements with a difference (read by ``trnsim.nki.apitable``).
DIFFERENCES: dict[str, str] = {
    "skip_middle_end_transformations": _HINT, "enable_stack_allocator": _HINT, "force_auto_alloc": _HINT,
}

#: ``ncc.sbuf.alloc``, ``ncc.sbuf.mod_alloc``, ``ncc.sbuf.auto_alloc``.
sbuf = _allocators(Memory.SBUF, sbuf_mod_alloc)
#: ``ncc.psum.alloc``, ``ncc.psum.mod_alloc``, ``ncc.psum.auto_alloc``.
psum = _allocators(Memory.PSUM, psum_mod_alloc)
