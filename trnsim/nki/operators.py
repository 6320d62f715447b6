"""What a kernel tensor's operators and conversions call: ``a + b`` is ``nl.add(a, b)``,
``-a`` is ``nl.negative(a)``, ``t.astype(d)`` is ``nl.copy(t, dtype=d)``.

The tensor classes (:mod:`trnsim.nki.tiles`, :mod:`trnsim.nki.views`) sit below
:mod:`trnsim.nki.language`, which makes and reads their instances, so they cannot import
it. The language hands itself to :func:`install` when it is imported (``import
trnsim.nki`` imports it), and the tensor methods look its functions up by name at call
time, so they follow whatever ``nl`` holds.
"""

from __future__ import annotations

from types import ModuleType

from trnsim.nki.tracer import KernelError

_language: ModuleType | None = None


def install(language: ModuleType) -> None:
    """Make ``language`` (the ``nki.language`` namespace) what tensor operators call."""
    global _language
    _language = language


def language() -> ModuleType:
    """The installed ``nki.language`` namespace."""
    if _language is None:
        raise KernelError("kernel tensor operators need nki.language, which is not loaded; import trnsim.nki first")
    return _language
