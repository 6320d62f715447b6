"""Kernel CI without hardware: compare kernels with references, assert cycle budgets.

    from trnsim.testing import assert_kernel_matches, assert_latency

    def test_softmax_kernel():
        x = np.random.default_rng(0).standard_normal((256, 512), dtype=np.float32)
        assert_kernel_matches(softmax_kernel, reference_softmax, x)
        assert_latency(softmax_kernel, x, max_ns=30_000)

The pytest plugin (:mod:`trnsim.testing.plugin`, loaded automatically when trnsim is
installed) adds the ``nki`` marker (``@pytest.mark.nki(chip="trn1")``), the
``--trnsim-chip`` option and the ``nki_benchmark`` fixture.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from trnsim import dtypes as _dt

if TYPE_CHECKING:
    from trnsim.hw.spec import ChipLike

__all__ = ["assert_allclose", "assert_kernel_matches", "assert_latency", "tolerance"]

# Relative tolerances by the coarsest dtype involved: a few units in the last place
# of its mantissa, which accumulated fp32 sums and activation rounding stay within.
_RTOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float8_e4m3": 1.3e-1, "float8_e4m3fn": 1.3e-1,
         "float8_e5m2": 2.5e-1}


def tolerance(dtype: Any) -> tuple[float, float]:
    """(rtol, atol) for results computed through ``dtype`` (numpy dtype, chip dtype or name)."""
    name = _name(dtype)
    if name not in _RTOL:
        return 0.0, 0.0  # integers compare exactly
    rtol = _RTOL[name]
    return rtol, rtol


def _name(dtype: Any) -> str:
    if hasattr(dtype, "is_floating_point") or str(dtype).startswith("torch."):
        return {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16",
                "torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2"}.get(str(dtype), str(dtype))
    if str(dtype) == "float64":
        return "float32"  # kernels take float64 arrays as float32
    return _dt.as_dtype(dtype).name


def _coarsest(values: tuple[Any, ...]) -> str:
    names = [_name(v.dtype) for v in values if hasattr(v, "dtype")]
    floats = [n for n in names if n in _RTOL]
    return max(floats, key=lambda n: _RTOL[n]) if floats else "float32"


def assert_allclose(actual: Any, expected: Any, dtype: Any = "float32", rtol: float | None = None,
                    atol: float | None = None, what: str = "result") -> None:
    """Raise AssertionError unless ``actual`` is within the ``dtype`` tolerance of ``expected``.

    Shapes must be equal. NaNs must sit where the reference has NaNs, and infinities
    where it has infinities of the same sign. Finite elements compare within ``rtol``
    relative and ``atol`` absolute; the default absolute tolerance scales with the
    reference's largest finite magnitude, so sums of many rounded terms are judged
    against the size of what they sum to. Integer dtypes (tolerance 0) compare exactly.
    """
    actual, expected = _values(actual, what), _values(expected, "the reference")
    if actual.shape != expected.shape:
        raise AssertionError(f"{what} has shape {list(actual.shape)}, the reference {list(expected.shape)}")
    d_rtol, d_atol = tolerance(dtype)
    rtol = d_rtol if rtol is None else _limit(rtol, "rtol")
    finite = np.isfinite(expected)
    scale = float(np.max(np.abs(expected[finite]))) if finite.any() else 0.0
    atol = d_atol * max(scale, 1e-30) if atol is None else _limit(atol, "atol")
    both = finite & np.isfinite(actual)
    bad = ~both & ~((actual == expected) | (np.isnan(actual) & np.isnan(expected)))
    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.abs(actual - expected, where=both, out=np.zeros(actual.shape))
        bad |= both & (diff > atol + rtol * np.abs(expected))
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{what} differs from the reference at {int(bad.sum())} of {bad.size} elements (tolerance for "
            f"{_name(dtype)}: rtol={rtol:g}, atol={atol:g}); first at {list(idx)}: {actual[idx]!r} vs {expected[idx]!r}, "
            f"largest finite difference {float(np.max(diff, initial=0.0)):g}")


def _values(x: Any, what: str) -> np.ndarray:
    """``x`` as a float64 array (integers that float64 cannot hold exactly stay int64)."""
    if x is None:
        raise AssertionError(f"{what} is None, not an array; return the output tensor")
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise AssertionError(f"{what} holds {arr.dtype} values, not numbers")
    if arr.dtype.kind in "iu" and arr.size and int(np.max(np.abs(arr.astype(np.int64)))) > 2**53:
        return arr.astype(np.int64)
    return arr.astype(np.float64)


def _limit(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} is not a finite number >= 0; pass a tolerance such as {name}=1e-5")
    return float(value)


def assert_kernel_matches(kernel: Callable, reference: Callable, *args: Any, dtype: Any = None, chip: ChipLike = None,
                          rtol: float | None = None, atol: float | None = None, **kwargs: Any) -> Any:
    """Run ``kernel`` on the simulated chip and compare each output with ``reference(*args)``
    (given the arguments as float64 numpy arrays). ``dtype`` defaults to the coarsest float
    dtype among the arguments. Returns the kernel's outputs."""
    from trnsim.nki import simulate

    if not callable(reference):
        raise TypeError(f"assert_kernel_matches needs a reference function (numpy arrays in, the expected outputs "
                        f"out), not {type(reference).__name__} {reference!r:.40}")
    out = simulate(kernel, chip=chip)(*args, **kwargs)
    ref = reference(*(_float64(a) for a in args), **kwargs)
    dtype = dtype if dtype is not None else _coarsest(args)
    outs = tuple(out) if isinstance(out, (tuple, list)) else () if out is None else (out,)
    refs = tuple(ref) if isinstance(ref, (tuple, list)) else () if ref is None else (ref,)
    if len(outs) != len(refs):
        raise AssertionError(f"the kernel returned {len(outs)} outputs, the reference {len(refs)}")
    if not any(np.size(r) for r in refs):
        raise AssertionError(f"the reference returned no values to compare ({len(refs)} outputs, all empty); "
                             "a check of nothing cannot fail, so return the reference's result")
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert_allclose(o, r, dtype, rtol, atol, what=f"output {i}" if len(outs) > 1 else "output")
    return out


def _float64(a: Any) -> Any:
    if hasattr(a, "detach"):
        return a.detach().float().numpy().astype(np.float64)
    if hasattr(a, "array") and hasattr(a, "dtype") and not isinstance(a, np.ndarray):  # nki.typed
        from trnsim.compute import decode, encode

        return decode(encode(np.asarray(a.array, np.float64), a.dtype), a.dtype)
    if isinstance(a, np.ndarray):
        return a.astype(np.float64)
    return a


def assert_latency(kernel: Callable, *args: Any, max_ns: float, chip: ChipLike = None, numerics: bool = False,
                   **kwargs: Any) -> Any:
    """Raise AssertionError if ``kernel``'s simulated latency on these arguments exceeds
    ``max_ns``; returns the :class:`trnsim.nki.BenchmarkResult` (simulated time is exact,
    so budgets can be tight)."""
    from trnsim.nki import benchmark

    if isinstance(max_ns, bool) or not isinstance(max_ns, numbers.Real) or not 0 < max_ns < math.inf:
        raise ValueError(f"max_ns={max_ns!r} is not a positive finite budget in nanoseconds; pass e.g. max_ns=30_000")
    result = benchmark(kernel, chip=chip, numerics=numerics)(*args, **kwargs)
    if result.instructions == 0:
        raise AssertionError(f"{getattr(kernel, '__name__', kernel)} traced no instructions, so its latency of 0 ns "
                             "proves nothing; check that the kernel loads, computes and stores")
    if result.latency_ns > max_ns:
        raise AssertionError(f"{getattr(kernel, '__name__', kernel)} takes {result.latency_ns:,.1f} ns of simulated time, "
                             f"over its budget of {max_ns:,.1f} ns\n{result.summary()}")
    return result
