"""``nl.NKIObject``: the base of the classes NKI kernels define for their configuration.

NKI's language guide: "In NKI all classes are similar to Python data classes ... The
@dataclass decorator is optional; classes with and without [it] will be compiled in the
same way", the compiler making ``__init__`` (every field a parameter, defaulting to its
class default or None) and ``__post_init__`` where the class defines none. A subclass
here gets such an ``__init__`` when it is created, before a ``@dataclass`` decorator runs,
which then keeps it (dataclasses leave an ``__init__`` the class already has): so
``C(x=1)`` works whether or not ``C`` declares ``x`` with an annotation, and a field
left out is None, as AWS's kernels (nki-library's attention_cte, mlp_tkg) rely on.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def _fields(cls: type) -> list[tuple[str, Any]]:
    """(name, default) of ``cls``'s fields in order, base classes first: its dataclass
    fields once ``@dataclass`` has run, else its annotated class attributes."""
    if dataclasses.is_dataclass(cls):
        out = []
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out.append((f.name, lambda d=f.default: d))
            elif f.default_factory is not dataclasses.MISSING:
                out.append((f.name, f.default_factory))
            else:
                out.append((f.name, lambda: None))
        return out
    names: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name in vars(klass).get("__annotations__", {}):
            names[name] = (lambda n=name: getattr(cls, n, None))
    return list(names.items())


def _nki_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """NKI's default initializer: positional arguments fill the fields in order, keyword
    arguments set any attribute, fields left out take their default (None without one)."""
    fields = _fields(type(self))
    if len(args) > len(fields):
        raise TypeError(f"{type(self).__name__}() takes {len(fields)} positional arguments (its fields "
                        f"{[n for n, _ in fields]}), got {len(args)}")
    values = dict(zip((n for n, _ in fields), args))
    for name in values.keys() & kwargs.keys():
        raise TypeError(f"{type(self).__name__}() got two values for {name!r}")
    values.update(kwargs)
    for name, default in fields:
        if name not in values:
            values[name] = default()
    for name, value in values.items():
        object.__setattr__(self, name, value)   # a frozen dataclass too
    post = getattr(self, "__post_init__", None)
    if post is not None:
        post()


class NKIObject:
    """Base class for kernel dataclasses and configuration objects: each subclass without
    an ``__init__`` of its own takes its fields (and any other attribute) as arguments."""

    def __init__(self, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):
            return
        inherited = next(k for k in cls.__mro__[1:] if "__init__" in vars(k))
        if inherited is NKIObject or vars(inherited)["__init__"] is _nki_init:
            cls.__init__ = _nki_init  # type: ignore[method-assign]
