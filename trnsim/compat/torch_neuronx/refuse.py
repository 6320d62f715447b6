"""Module ``__getattr__`` functions that refuse, by name, what trnsim does not provide yet."""

from __future__ import annotations

from typing import Callable, NoReturn

from trnsim.errors import NotProvidedError


def refuser(module: str, issue: int | None, what: str, instead: str) -> Callable[[str], NoReturn]:
    """A module ``__getattr__`` that raises :class:`NotProvidedError` for any public name,
    naming it, trnsim issue ``issue`` (which brings ``what``; None: trnsim provides ``what``
    another way) and what to use ``instead``."""

    def __getattr__(name: str) -> NoReturn:
        if name.startswith("__"):   # the import system and tools probe dunders; plain misses
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        if issue is None:
            raise NotProvidedError(f"{module}.{name} is not provided by trnsim, which gives {what} through "
                                   f"PyTorch's own API; {instead}")
        raise NotProvidedError(f"{module}.{name} is not provided by trnsim yet: {what} comes with trnsim "
                               f"issue {issue}; {instead}")

    return __getattr__
