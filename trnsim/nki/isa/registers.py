"""Registers of ``nki.isa``: integers known when the kernel is traced."""

from __future__ import annotations

from typing import Any

from trnsim.nki.isa._common import fail


class VirtualRegister:
    """An engine register holding an integer known when the kernel is traced."""

    def __init__(self, value: int = 0) -> None:
        self.value = int(value)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


def register_alloc(x: int | None = None) -> VirtualRegister:
    """A register holding ``x`` (0 when None)."""
    return VirtualRegister(0 if x is None else int(x))


def register_move(dst: VirtualRegister, src: Any) -> None:
    """Set register ``dst`` to ``src`` (a register or an integer)."""
    if not isinstance(dst, VirtualRegister):
        raise fail(f"register_move: dst {dst!r} is not a register from nisa.register_alloc")
    dst.value = int(src)
