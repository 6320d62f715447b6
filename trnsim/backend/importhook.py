"""Patch a third-party module when it loads, so that ``import torch`` (which imports
trnsim) never imports it: :func:`when_imported` runs ``patch(module)`` now if the module
is loaded, else right after it loads (a :data:`sys.meta_path` finder that wraps the
module's own loader)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, Callable


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the patch on what it loaded."""

    def __init__(self, inner: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str) -> Any:   # get_source, get_code, ... for tracebacks and inspect
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds one module where the path finder does, with a :class:`_Loader`."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, self.patch)
        return spec


def when_imported(name: str, patch: Callable[[ModuleType], None]) -> None:
    """``patch(module)`` for the module ``name``: now if it is loaded, else once it loads."""
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _Finder(name, patch))
