"""``nki_cpu_simulator.nki.language``: every name of :mod:`trnsim.nki.language`, looked up
there; a package, since AWS's simulator has ``language.dtypes`` below it."""

from __future__ import annotations

from typing import Any

import trnsim.nki.language as _language

__trnsim_alias_of__ = "trnsim.nki.language"


def __getattr__(name: str) -> Any:
    return getattr(_language, name)


def __dir__() -> list[str]:
    return sorted(set(dir(_language)) | set(globals()))
