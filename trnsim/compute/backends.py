"""Choosing a numeric backend: the numpy reference or the numba kernels."""

from __future__ import annotations

import importlib
from typing import Protocol

import numpy as np

from trnsim.dtypes import DType
from trnsim.errors import ProgramError
from trnsim.isa import ActivationFunc, AluOp, ReduceOp

BACKENDS = {"numpy": "trnsim.compute.reference", "numba": "trnsim.compute.fast"}


class Backend(Protocol):
    """What a backend module provides; :mod:`trnsim.compute.reference` documents each function."""

    def encode(self, values: np.ndarray, dtype: DType) -> np.ndarray: ...

    def decode(self, storage: np.ndarray, dtype: DType) -> np.ndarray: ...

    def activation(self, x: np.ndarray, func: ActivationFunc | str, scale: np.ndarray, bias: np.ndarray) -> np.ndarray: ...

    def alu(self, a: np.ndarray, b: np.ndarray, op: AluOp | str) -> np.ndarray: ...

    def reduce(self, x: np.ndarray, op: ReduceOp | str) -> np.ndarray: ...

    def matmul(self, acc: np.ndarray, stationary: np.ndarray, moving: np.ndarray) -> np.ndarray: ...

    def bn_stats(self, x: np.ndarray) -> np.ndarray: ...

    def bn_aggr(self, stats: np.ndarray) -> np.ndarray: ...

    def scan(self, a: np.ndarray, b: np.ndarray, initial: np.ndarray, op0: AluOp | str, op1: AluOp | str,
             reverse0: bool = False, reverse1: bool = False) -> np.ndarray: ...

    def max8(self, x: np.ndarray) -> np.ndarray: ...

    def find_index8(self, x: np.ndarray, vals: np.ndarray) -> np.ndarray: ...

    def match_replace8(self, x: np.ndarray, vals: np.ndarray, imm: float) -> tuple[np.ndarray, np.ndarray]: ...

    def sequence_bounds(self, ids: np.ndarray) -> np.ndarray: ...


def get_backend(name: str) -> Backend:
    """The backend module called ``name``: ``"numpy"`` (reference) or ``"numba"`` (compiled).

    numba is imported here, on first request, never by ``import trnsim``.
    """
    module = BACKENDS.get(name)
    if module is None:
        raise ProgramError(f"unknown compute backend {name!r}; use one of: {', '.join(BACKENDS)}")
    return importlib.import_module(module)  # type: ignore[return-value]
