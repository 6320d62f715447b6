"""Random numbers in kernels: ``nl.rand``, ``nl.random_seed`` and ``nl.dropout``.

The chip's generator is not modelled. trnsim draws the values on the host when the
kernel is traced (numpy's generator, seeded per kernel trace, so a kernel gives the
same values every run) and hands them to the kernel as an input tensor that it
loads with one DMA; uniform in [0, 1) as NKI documents.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import numpy as np

from trnsim.isa import Memory
from trnsim.nki import emit as _e
from trnsim.nki.compute import greater_equal, multiply
from trnsim.nki.memory import load, sbuf, shared_constant
from trnsim.nki.tiles import NkiTensor
from trnsim.nki.tracer import Tracer

__all__ = ["rand", "random_seed", "dropout"]

_generators: weakref.WeakKeyDictionary[Tracer, np.random.Generator] = weakref.WeakKeyDictionary()


def _generator(tr: Tracer) -> np.random.Generator:
    return _generators.setdefault(tr, np.random.default_rng(0))


def random_seed(seed: Any) -> None:
    """Restart the generator: from ``seed`` when it is a number; a seed tile's value is
    not known while tracing, so a tile restarts it from one fixed state (the same
    seeding still gives the same values, as on the chip)."""
    value = int(seed) if isinstance(seed, (int, np.integer)) else 0
    _generators[_e.tracer()] = np.random.default_rng(value)


def rand(shape: Sequence[int], dtype: Any = np.float32, buffer: Any = sbuf, name: str = "") -> NkiTensor:
    """A tile (or, with ``buffer=nl.hbm``, an HBM tensor) of values uniform in [0, 1);
    ``dtype`` defaults to float32, as in the legacy ``neuronxcc`` signature."""
    tr = _e.tracer()
    data = _generator(tr).random(tuple(int(s) for s in shape), dtype=np.float32)
    hbm = shared_constant(data, dtype=dtype)
    if buffer is Memory.HBM:
        return hbm
    if buffer is not Memory.SBUF:
        raise tr.fail(f"nl.rand into {buffer!r}: trnsim makes random tiles in SBUF or HBM")
    return load(hbm)


def dropout(x: Any, rate: Any, dtype: Any = None) -> NkiTensor:
    """``x`` with each element zeroed with probability ``rate`` (a number, or a [P, 1]
    tile of per-partition rates); kept elements are not rescaled."""
    x = _e.readable(x)
    keep = greater_equal(rand(x.shape, np.float32), rate, dtype=np.float32)
    return multiply(x, keep, dtype=dtype or x.dtype)
