"""Choosing a numeric backend: the numpy reference or the numba kernels."""

from __future__ import annotations

import importlib
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from trnsim.compute.reference import Accumulator
from trnsim.dtypes import DType, Storage, Values
from trnsim.errors import ProgramError
from trnsim.isa import ActivationFunc, AluOp, ReduceOp

BACKENDS = {"numpy": "trnsim.compute.reference", "numba": "trnsim.compute.fast"}


class Backend(Protocol):
    """What a backend module provides; :mod:`trnsim.compute.reference` documents each function."""

    def encode(self, values: Values, dtype: DType) -> Storage: ...

    def decode(self, storage: Storage, dtype: DType) -> Values: ...

    def activation(self, x: Values, func: ActivationFunc | str, scale: Values, bias: Values) -> Values: ...

    def alu(self, a: Values, b: Values, op: AluOp | str) -> Values: ...

    def reduce(self, x: Values, op: ReduceOp | str) -> Values: ...

    def matmul(self, acc: Accumulator, stationary: Values, moving: Values) -> NDArray[np.float32]: ...

    def bn_stats(self, x: Values) -> Values: ...

    def bn_aggr(self, stats: Values) -> Values: ...

    def scan(self, a: Values, b: Values, initial: Values, op0: AluOp | str, op1: AluOp | str,
             reverse0: bool = False, reverse1: bool = False) -> Values: ...

    def max8(self, x: Values) -> Values: ...

    def find_index8(self, x: Values, vals: Values) -> NDArray[np.int64]: ...

    def match_replace8(self, x: Values, vals: Values, imm: float) -> tuple[Values, NDArray[np.int64]]: ...

    def sequence_bounds(self, ids: Values) -> Values: ...


def get_backend(name: str) -> Backend:
    """The backend module called ``name``: ``"numpy"`` (reference) or ``"numba"`` (compiled).

    numba is imported here, on first request, never by ``import trnsim``.
    """
    module = BACKENDS.get(name)
    if module is None:
        raise ProgramError(f"unknown compute backend {name!r}; use one of: {', '.join(BACKENDS)}")
    return importlib.import_module(module)   # a module has the Protocol's functions as attributes
