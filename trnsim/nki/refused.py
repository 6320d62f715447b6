"""Documented NKI names that trnsim does not simulate.

Each such name exists, so a kernel module that merely mentions it imports; using it
raises a :class:`~trnsim.nki.tracer.KernelError` that names it and says why.
"""

from __future__ import annotations

from typing import Any, NoReturn

from trnsim.nki.tracer import KernelError, caller_source


class Refused:
    """A stand-in for the NKI name ``qualname``: calling it, or reading any attribute of
    it, raises a KernelError with ``reason``."""

    def __init__(self, qualname: str, reason: str) -> None:
        self.qualname = qualname
        self.reason = reason

    def refuse(self) -> NoReturn:
        where = caller_source()
        message = f"{self.qualname} is not supported by trnsim: {self.reason}"
        raise KernelError(f"{where}: {message}" if where else message)

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        self.refuse()

    def __getattr__(self, attr: str) -> NoReturn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        self.refuse()

    def __repr__(self) -> str:
        return f"<{self.qualname}: not supported by trnsim>"
