"""``nki.language`` ops that trnsim builds from several simulated instructions.

NKI runs each of these as one instruction (or a short fixed sequence); trnsim has
no single engine operation for them, so it composes them from the ones it has.
Each costs what its parts cost, which ``docs/nki_api.md`` notes.
"""

from __future__ import annotations

import builtins
import math
from typing import Any

from trnsim import dtypes as _dt
from trnsim.nki import emit as _e
from trnsim.nki.compute import abs  # noqa: A004 - nl.abs, NKI's name; the builtin is builtins.abs here
from trnsim.nki.compute import (
    add, cos, divide, equal, exp, greater, less, log, maximum, minimum, multiply, not_equal, sigmoid, sin,
    softplus, sqrt, square, subtract, tanh,
)
from trnsim.nki.emit import MatmulResult
from trnsim.nki.isa.affine import iota
from trnsim.nki.isa.gather import nc_n_gather
from trnsim.nki.loops import arange
from trnsim.nki.memory import copy, copy_into, full, zeros
from trnsim.nki.reductions import min, sum  # noqa: A004 - nl.min and nl.sum, NKI's names
from trnsim.nki.tiles import Mask, NkiTensor
from trnsim.nki.tracer import caller_source

__all__ = [
    "logical_and", "logical_or", "logical_xor", "logical_not", "abs_max", "abs_min", "tan", "arctan", "mish",
    "gelu_apprx_sigmoid", "gelu_apprx_sigmoid_dx", "erf_dx", "floor", "ceil", "trunc", "mod", "fmod", "all", "prod",
    "loop_reduce", "gather_flattened", "shared_identity_matrix",
]


def _nonzero(x: Any) -> NkiTensor:
    return not_equal(x, 0.0, dtype=_dt.float32)


def logical_and(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """1 where both ``x`` and ``y`` are non-zero, else 0."""
    return multiply(_nonzero(x), _nonzero(y), dtype=dtype or _dt.uint8, mask=mask)


def logical_or(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """1 where ``x`` or ``y`` is non-zero, else 0."""
    return maximum(_nonzero(x), _nonzero(y), dtype=dtype or _dt.uint8, mask=mask)


def logical_xor(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """1 where exactly one of ``x`` and ``y`` is non-zero, else 0."""
    return not_equal(_nonzero(x), _nonzero(y), dtype=dtype or _dt.uint8, mask=mask)


def logical_not(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """1 where ``x`` is zero, else 0."""
    return equal(x, 0.0, dtype=dtype or _dt.uint8, mask=mask)


def abs_max(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``max(|x|, |y|)`` elementwise."""
    return maximum(abs(x), abs(y) if isinstance(y, (NkiTensor, MatmulResult)) else builtins.abs(y), dtype=dtype, mask=mask)


def abs_min(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``min(|x|, |y|)`` elementwise."""
    return minimum(abs(x), abs(y) if isinstance(y, (NkiTensor, MatmulResult)) else builtins.abs(y), dtype=dtype, mask=mask)


def tan(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``sin(x) / cos(x)``."""
    return divide(sin(x, dtype=_dt.float32), cos(x, dtype=_dt.float32), dtype=dtype, mask=mask)


def mish(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``x * tanh(softplus(x))``."""
    return multiply(x, tanh(softplus(x, dtype=_dt.float32)), dtype=dtype, mask=mask)


def gelu_apprx_sigmoid(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``x * sigmoid(1.702 x)``."""
    return multiply(x, sigmoid(multiply(x, 1.702, dtype=_dt.float32)), dtype=dtype, mask=mask)


def _nearest(x: Any) -> NkiTensor:
    """``x`` rounded to the nearest integer (half to even) through an int32 conversion."""
    return copy(copy(x, dtype=_dt.int32), dtype=_dt.float32)


def floor(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """The largest integer not above ``x``: ``round(x) - (round(x) > x)``."""
    r = _nearest(x)
    return subtract(r, greater(r, x, dtype=_dt.float32), dtype=dtype or _dt.float32, mask=mask)


def ceil(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """The smallest integer not below ``x``: ``round(x) + (round(x) < x)``."""
    r = _nearest(x)
    return add(r, less(r, x, dtype=_dt.float32), dtype=dtype or _dt.float32, mask=mask)


def trunc(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``x`` rounded toward zero: ``floor(x)``, plus 1 where ``x`` is negative and not whole."""
    f = floor(x)
    up = multiply(less(x, 0.0, dtype=_dt.float32), less(f, x, dtype=_dt.float32), dtype=_dt.float32)
    return add(f, up, dtype=dtype or _dt.float32, mask=mask)


def mod(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``x - y * floor(x / y)``: the remainder with the sign of ``y`` (numpy's mod)."""
    return subtract(x, multiply(floor(divide(x, y, dtype=_dt.float32)), y, dtype=_dt.float32),
                    dtype=dtype or _dt.float32, mask=mask)


def fmod(x: Any, y: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``x - y * trunc(x / y)``: the remainder with the sign of ``x`` (C's fmod)."""
    return subtract(x, multiply(trunc(divide(x, y, dtype=_dt.float32)), y, dtype=_dt.float32),
                    dtype=dtype or _dt.float32, mask=mask)


def erf_dx(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """The derivative of erf: ``2 / sqrt(pi) * exp(-x^2)``."""
    e = exp(multiply(square(x, dtype=_dt.float32), -1.0))
    return multiply(e, 2.0 / math.sqrt(math.pi), dtype=dtype, mask=mask)


def gelu_apprx_sigmoid_dx(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """The derivative of ``x * sigmoid(1.702 x)``: ``s + 1.702 x s (1 - s)``."""
    s_ = sigmoid(multiply(x, 1.702, dtype=_dt.float32))
    slope = multiply(multiply(s_, subtract(1.0, s_)), multiply(x, 1.702, dtype=_dt.float32))
    return add(s_, slope, dtype=dtype, mask=mask)


def arctan(x: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:
    """``arctan(x)`` as ``4 arctan(t)``, halving the angle twice with ``t -> t / (1 + sqrt(1 + t^2))``
    (so ``|t| < tan(pi / 8) < 0.42``), and the odd series of arctan(t) to the t^13 term
    (error below 1e-6)."""
    t = _e.readable(x)
    for _ in range(2):
        t = divide(t, add(sqrt(add(square(t, dtype=_dt.float32), 1.0)), 1.0), dtype=_dt.float32)
    t2 = square(t)
    series = full(t.shape, 0.0, _dt.float32)
    for k in range(13, 0, -2):
        # Horner in t^2: c_k + t^2 * (...), with c_k = (-1)^((k-1)/2) / k
        series = add(multiply(series, t2), (-1.0) ** ((k - 1) // 2) / k)
    return multiply(multiply(series, t), 4.0, dtype=dtype, mask=mask)


def prod(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, mask: Mask | None = None) -> NkiTensor:
    """The product along ``axis``: ``exp(sum(log|x|))`` with the sign from the count of
    negative elements, and 0 where any element is 0."""
    x = _e.readable(x)
    magnitude = exp(sum(log(abs(x, dtype=_dt.float32)), axis, keepdims=keepdims, mask=mask))
    negatives = sum(less(x, 0.0, dtype=_dt.float32), axis, keepdims=keepdims, mask=mask)
    sign_ = subtract(1.0, multiply(mod(negatives, 2.0), 2.0))
    nonzero = all(x, axis, dtype=_dt.float32, mask=mask)
    if keepdims is False and len(nonzero.shape) != len(sign_.shape):
        nonzero = nonzero.reshape(sign_.shape)
    return multiply(multiply(magnitude, sign_), nonzero, dtype=dtype or _dt.float32)


def all(x: Any, axis: Any, dtype: Any = None, mask: Mask | None = None) -> NkiTensor:  # noqa: A001 - NKI's name
    """1 where every element along ``axis`` is non-zero, else 0."""
    return min(_nonzero(x), axis, dtype=dtype or _dt.uint8, mask=mask)


def gather_flattened(data: Any, indices: Any, axis: int = 0, dtype: Any = None, mask: Mask | None = None,
                     **kwargs: Any) -> NkiTensor:
    """``out[p, ...] = data[p].flatten()[indices[p, ...]]``: each partition gathers from its own
    row of ``data`` (free dimensions flattened) with the integer ``indices`` of that partition.
    ``data`` [P, ...] and ``indices`` [P, ...] are SBUF tiles; the result is [P, *indices.shape[1:]]
    in ``dtype`` (``data``'s by default), made by one GpSimd gather (nisa.nc_n_gather)."""
    tr = _e.tracer()
    if mask is not None:
        raise tr.fail("nl.gather_flattened: trnsim does not take a mask here; slice data and indices instead")
    if axis != 0:
        raise tr.fail(f"nl.gather_flattened: axis={axis!r}; trnsim gathers along the flattened free dimensions "
                      "only (axis=0)")
    if not isinstance(data, NkiTensor) or not isinstance(indices, NkiTensor):
        raise tr.fail("nl.gather_flattened needs tiles for data and indices")
    if indices.dtype.is_float:
        raise tr.fail(f"nl.gather_flattened: indices are {indices.dtype.name}; they must be an integer tile")
    if data.view.partitions != indices.view.partitions:
        raise tr.fail(f"nl.gather_flattened: data {list(data.shape)} and indices {list(indices.shape)} must have "
                      "the same number of partitions")
    kwargs.pop("name", None)
    if kwargs:
        raise tr.fail(f"nl.gather_flattened got unexpected arguments {sorted(kwargs)}")
    return nc_n_gather(data, indices, dtype=dtype)


def shared_identity_matrix(n: int, dtype: Any = _dt.uint8, dst: NkiTensor | None = None) -> NkiTensor:
    """An [n, n] identity matrix in SBUF (``nisa.iota`` of ``p - f`` compared with 0)."""
    i_p = arange(n)[:, None]
    i_f = arange(n)[None, :]
    diff = iota(i_p - i_f, dtype=_dt.float32)
    out = equal(diff, 0.0, dtype=dtype)
    if dst is not None:
        copy_into(dst, out)
        return dst
    return out


_LOOP_OPS = {"add": add, "maximum": maximum, "max": maximum, "minimum": minimum, "min": minimum,
             "multiply": multiply, "subtract": subtract}


def loop_reduce(x: Any, op: Any, loop_indices: Any, dtype: Any = None, mask: Mask | None = None,
                name: str | None = None) -> NkiTensor:
    """``b = op(b, x)`` for the ``b`` this call returned in the last iteration of the loops
    ``loop_indices`` name, from zeros when every one of them is 0 (their first
    iteration), as NKI's ``b = nl.zeros(...)`` then ``b = nl.loop_reduce(a, op, [k])``
    reads. Each iteration of the other enclosing ``affine_range``/``sequential_range``
    loops keeps its own ``b``: ``acc[i_q] = nl.loop_reduce(x, np.add, [i_k])`` in a loop
    over ``i_q`` inside one over ``i_k`` sums over ``i_k`` for each ``i_q``.

    When the result is assigned to a tile (``acc[i] = nl.loop_reduce(...)``), that tile
    is the accumulator from then on, as the Neuron compiler reads the pattern: later
    iterations compute ``op(acc[i], x)`` into ``acc[i]`` in place, so the running value
    takes no SBUF of its own. ``name`` names the instruction for the compiler's reports
    and changes nothing here."""
    tr = _e.tracer()
    fn = _LOOP_OPS.get(getattr(op, "__name__", str(op)))
    if fn is None:
        raise tr.fail(f"nl.loop_reduce op {op!r}: use np.add, np.maximum, np.minimum, np.multiply or np.subtract")
    indices = loop_indices if isinstance(loop_indices, (list, tuple)) else (loop_indices,)
    reduced = {getattr(i, "depth", None) for i in indices}
    others = tuple(v for depth, v in enumerate(tr.loop_values, 1) if depth not in reduced)
    key = (caller_source(), others if None not in reduced else ())
    x = _e.readable(x)
    running, assigned = (None, False) if builtins.all(int(i) == 0 for i in indices) else tr.running.get(key, (None, False))
    if assigned:
        fn(running, x, mask=mask, out=running)
        return running
    result = fn(running if running is not None else zeros(x.shape, dtype or x.dtype), x, dtype=dtype or x.dtype,
                mask=mask)
    tr.running[key] = (result, False)
    tr.running_unassigned[id(result.view.tensor)] = (key, result)
    return result

