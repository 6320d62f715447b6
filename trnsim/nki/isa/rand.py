"""Random numbers of ``nki.isa``: ``rng``, ``rand2``, seeding and ``dropout``.

The simulated engines draw from one seeded numpy generator per run (see
:mod:`trnsim.compute.machine`), not the hardware's XORWOW: the same program gives
the same numbers, but not the chip's.
"""

from __future__ import annotations

from numbers import Real
from typing import Any

from trnsim.isa import Dropout, Engine, Memory, RandomUniform, RngSeed, RngState
from trnsim.nki import emit as _e
from trnsim.nki.isa._common import (fail, needs_version, no_mask, out_tile, pick_engine, same_free, scalar_or_view,
                                    split_dst, take, tile)
from trnsim.nki.tiles import NkiTensor


def rng(*args: Any, engine: Any = None, **kwargs: Any) -> NkiTensor:
    """32 random bits per element of ``dst`` (an integer tile), truncated to its dtype."""
    dst = tile(take(kwargs, args, 0, "dst"), "rng dst")
    if dst.dtype.is_float:
        raise fail(f"rng: dst is {dst.dtype.name}; it must be an integer type (int8, int16, int32, uint8, uint32)")
    _e.emit(RandomUniform(dst.view, bits=True, engine=pick_engine(engine, Engine.VECTOR)))
    return dst


def rand2(*args: Any, **kwargs: Any) -> NkiTensor:
    """Uniform random values in [min, max) into ``dst`` (vector engine); min and max are numbers."""
    needs_version("rand2", 4)
    dst = tile(take(kwargs, args, 0, "dst"), "rand2 dst")
    low, high = take(kwargs, args, 1, "min", 0.0), take(kwargs, args, 2, "max", 1.0)
    if not isinstance(low, Real) or not isinstance(high, Real):
        raise fail("rand2: trnsim takes min and max as numbers; per-partition bound tiles are not supported")
    if not low < high:
        raise fail(f"rand2: min {low} must be below max {high}")
    _e.emit(RandomUniform(dst.view, float(low), float(high), engine=Engine.VECTOR))
    return dst


def set_rng_seed(*args: Any, engine: Any = None, **kwargs: Any) -> None:
    """Seed the random generator from the values of ``src_seeds``."""
    seeds = tile(take(kwargs, args, 0, "src_seeds"), "set_rng_seed src_seeds")
    _e.emit(RngSeed(seeds.view, engine=pick_engine(engine, Engine.VECTOR)))


def rand_set_state(*args: Any, engine: Any = None, **kwargs: Any) -> None:
    """Seed the random generator from ``src_seeds`` (trnsim's generator state is a seed, not XORWOW words)."""
    seeds = tile(take(kwargs, args, 0, "src_seeds"), "rand_set_state src_seeds")
    _e.emit(RngSeed(seeds.view, engine=pick_engine(engine, Engine.GPSIMD)))


#: Elements per partition of a rand_get_state destination, by engine (NKI's XORWOW state sizes).
_STATE_WORDS = {Engine.GPSIMD: 6, Engine.VECTOR: 24}


def rand_get_state(*args: Any, engine: Any = None, **kwargs: Any) -> NkiTensor:
    """Store the random generator's state into ``dst``: a 2-D uint32 tile, 6 elements per
    partition on GpSimd (SBUF only) or 24 on the vector engine (SBUF or PSUM, NeuronCore-v4+).

    Each partition's row holds the 32-bit words of the simulated generator's state (numpy
    PCG64: state then increment, repeated to fill the row), not the hardware's XORWOW state.
    """
    needs_version("rand_get_state", 3)
    dst = tile(take(kwargs, args, 0, "dst"), "rand_get_state dst")
    if dst.dtype.name != "uint32" or len(dst.shape) != 2:
        raise fail(f"rand_get_state: dst is {list(dst.shape)} {dst.dtype.name}; it must be a 2-D uint32 tile")
    chosen = pick_engine(engine, Engine.GPSIMD if dst.shape[1] == _STATE_WORDS[Engine.GPSIMD] else Engine.VECTOR)
    if chosen not in _STATE_WORDS:
        raise fail(f"rand_get_state: engine {chosen.name} has no random generator; use nisa.gpsimd_engine or "
                    "nisa.vector_engine")
    if chosen is Engine.VECTOR:
        needs_version("rand_get_state on the vector engine", 4)
    if dst.shape[1] != _STATE_WORDS[chosen]:
        raise fail(f"rand_get_state: dst has {dst.shape[1]} elements per partition; the {chosen.name} engine's "
                    f"state is {_STATE_WORDS[chosen]}")
    if chosen is Engine.GPSIMD and dst.buffer is not Memory.SBUF:
        raise fail("rand_get_state: GpSimd cannot write PSUM; put dst in SBUF")
    _e.emit(RngState(dst.view, engine=chosen))
    return dst


def dropout(*args: Any, dtype: Any = None, **kwargs: Any) -> NkiTensor:
    """Zero each element of ``data`` with probability ``prob`` (a number or [P, 1] tile); vector engine."""
    no_mask(kwargs, "dropout")
    dst, rest = split_dst(args, kwargs, lambda a: len(a) >= 3 or (len(a) == 2 and "prob" in kwargs), "data")
    data = tile(take(kwargs, rest, 0, "data"), "dropout data")
    prob = scalar_or_view(take(kwargs, rest, 1, "prob"), "dropout prob")
    out = out_tile(dst, data, dtype)
    if out.dtype is not data.dtype:
        raise fail(f"dropout: the output data type must match the input's ({out.dtype.name} vs {data.dtype.name})")
    same_free("dropout", out, data)
    _e.emit(Dropout(out.view, data.view, prob, engine=Engine.VECTOR))
    return out
