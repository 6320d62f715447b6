"""``nki_cpu_simulator.nki.tensor``: host-side constants for ``nl.shared_constant``."""

from __future__ import annotations

from typing import Any

import numpy as np

from trnsim.dtypes import as_dtype

__all__ = ["identity"]


def identity(n: int, dtype: Any) -> np.ndarray:
    """An [n, n] identity matrix in ``dtype``'s host numpy type, for ``nl.shared_constant``
    (which stores it in ``dtype`` when given it)."""
    return np.eye(int(n), dtype=as_dtype(dtype).dtype)
