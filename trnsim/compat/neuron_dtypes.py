"""``neuron_dtypes`` without AWS's package: the numpy dtypes of Neuron's narrow floats.

AWS's NKI library builds its test inputs and goldens with ``neuron_dtypes``: numpy
dtypes for bfloat16, the float8 and float4 formats and the microscaling (MX) types
that pack four narrow floats in one element, and :func:`static_cast`, which converts
an array to one of them as a cast does (round to nearest, ties to even). Here the
scalar types are ml_dtypes' (``bfloat16`` is ``ml_dtypes.bfloat16``), imported when
this module is, never by ``import trnsim``.

The packed types (:data:`float8_e4m3fn_x4`, :data:`float8_e5m2_x4`,
:data:`float4_e2m1fn_x4`) are unsigned integer dtypes (uint32, uint32, uint16) that
carry their name in the dtype's metadata. :func:`static_cast` to one of them packs
four values of the last axis into one element (the first in the lowest bits), so a
float array [..., 4n] becomes [..., n]; a cast from one unpacks. Casts to a
finite-only format (float8_e4m3fn, float4_e2m1fn) saturate at its largest finite
value, as the chip's conversions do; NaN stays NaN.

Every function also takes trnsim's NKI dtypes (``nl.bfloat16``, ``nl.float8_e4m3``,
``nl.float8_e4m3fn_x4``): ``nl.float8_e4m3`` is the NeuronCore's IEEE 754 style e4m3
(:data:`float8_e4m3`, largest 240, with infinities), ``nl.float8_e4m3fn`` OCP's
finite-only one (:data:`float8_e4m3fn`, largest 448).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from trnsim.dtypes import DType

__all__ = [
    "bfloat16", "finfo", "float4_e2m1fn", "float4_e2m1fn_x4", "float8_e4m3", "float8_e4m3fn", "float8_e4m3fn_x4",
    "float8_e5m2", "float8_e5m2_x4", "float8_e8m0fnu", "is_float_type", "sizeinbytes", "static_cast",
]

bfloat16 = ml_dtypes.bfloat16
float8_e4m3fn = ml_dtypes.float8_e4m3fn
# the NeuronCore's float8_e4m3 is the IEEE 754 style e4m3 (AWS's NxD Inference guide:
# the device supports FP8_EXP4 (IEEE-754), whose range differs from OCP's e4m3fn)
float8_e4m3 = ml_dtypes.float8_e4m3
float8_e5m2 = ml_dtypes.float8_e5m2
float8_e8m0fnu = ml_dtypes.float8_e8m0fnu
float4_e2m1fn = ml_dtypes.float4_e2m1fn

_META = "neuron_dtype"
# each packed type: its storage, the format of its four values, and the bits of one value
_PACKED = {
    "float8_e4m3fn_x4": (np.uint32, np.dtype(float8_e4m3fn), 8),
    "float8_e5m2_x4": (np.uint32, np.dtype(float8_e5m2), 8),
    "float4_e2m1fn_x4": (np.uint16, np.dtype(float4_e2m1fn), 4),
}
float8_e4m3fn_x4 = np.dtype(np.uint32, metadata={_META: "float8_e4m3fn_x4"})
float8_e5m2_x4 = np.dtype(np.uint32, metadata={_META: "float8_e5m2_x4"})
float4_e2m1fn_x4 = np.dtype(np.uint16, metadata={_META: "float4_e2m1fn_x4"})
_PACKED_DTYPES = {"float8_e4m3fn_x4": float8_e4m3fn_x4, "float8_e5m2_x4": float8_e5m2_x4,
                  "float4_e2m1fn_x4": float4_e2m1fn_x4}

# trnsim's chip dtypes that numpy holds in another type than their own
_FROM_CHIP = {"bfloat16": np.dtype(bfloat16), "float8_e4m3": np.dtype(float8_e4m3),
              "float8_e4m3fn": np.dtype(float8_e4m3fn),
              "float8_e5m2": np.dtype(float8_e5m2), "float8_e8m0fnu": np.dtype(float8_e8m0fnu),
              "bool_": np.dtype(np.bool_), **_PACKED_DTYPES}
_FLOAT_NAMES = {"bfloat16", "float8_e4m3fn", "float8_e4m3", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn"}
_FINITE_ONLY = {"float8_e4m3fn", "float4_e2m1fn"}


def _numpy_dtype(dtype: Any) -> np.dtype:
    """``dtype`` (a numpy dtype or type, an ml_dtypes type, a trnsim chip dtype) as a numpy dtype."""
    if isinstance(dtype, DType):
        found = _FROM_CHIP.get(dtype.name)
        return found if found is not None else np.dtype(dtype.storage)
    if isinstance(dtype, str) and dtype in _PACKED_DTYPES:
        return _PACKED_DTYPES[dtype]
    return np.dtype(dtype)


def _packed_name(dtype: np.dtype) -> str | None:
    return (dtype.metadata or {}).get(_META)


def sizeinbytes(dtype: Any) -> int:
    """Bytes of one element of ``dtype`` (a packed type's element holds four values)."""
    return _numpy_dtype(dtype).itemsize


def is_float_type(dtype: Any) -> bool:
    """Whether ``dtype`` holds floating-point values (numpy's floats, ml_dtypes' narrow
    floats and the packed MX types)."""
    np_dtype = _numpy_dtype(dtype)
    return np_dtype.kind == "f" or np_dtype.name in _FLOAT_NAMES or _packed_name(np_dtype) is not None


def finfo(dtype: Any) -> Any:
    """Machine limits of float ``dtype`` (``ml_dtypes.finfo``; of one value, for a packed type)."""
    np_dtype = _numpy_dtype(dtype)
    packed = _packed_name(np_dtype)
    return ml_dtypes.finfo(_PACKED[packed][1] if packed else np_dtype)


def static_cast(array: Any, dtype: Any) -> np.ndarray:
    """``array`` converted to ``dtype`` as a cast does: floats round to nearest, ties to
    even, in one step from the source's values; a finite-only float8/float4 saturates
    at its largest finite value; to an integer type, floats truncate toward zero. To a
    packed MX type, the last axis (a multiple of 4) packs into a quarter as many
    elements; from one, it unpacks to four times as many."""
    src = np.asarray(array)
    target = _numpy_dtype(dtype)
    packed_src = _packed_name(src.dtype)
    if packed_src is not None:
        src = _unpack(src, packed_src)
    packed_dst = _packed_name(target)
    if packed_dst is not None:
        return _pack(src, packed_dst)
    return _cast(src, target)


def _cast(src: np.ndarray, target: np.dtype) -> np.ndarray:
    if target.name in _FINITE_ONLY and src.dtype.kind != "b":
        largest = float(ml_dtypes.finfo(target).max)
        with np.errstate(invalid="ignore"):
            src = np.clip(src.astype(np.float64), -largest, largest)
    return src.astype(target)


def _pack(values: np.ndarray, name: str) -> np.ndarray:
    storage, element, bits = _PACKED[name]
    if values.ndim == 0 or values.shape[-1] % 4:
        raise ValueError(f"static_cast to {name} packs four values of the last axis into one element; "
                         f"shape {list(values.shape)} has a last axis that is not a multiple of 4")
    codes = _cast(values, element).view(np.uint8).astype(storage) & storage((1 << bits) - 1)
    out = np.zeros(values.shape[:-1] + (values.shape[-1] // 4,), storage)
    for i in range(4):
        out |= codes[..., i::4] << storage(bits * i)
    return out.view(_PACKED_DTYPES[name])


def _unpack(packed: np.ndarray, name: str) -> np.ndarray:
    storage, element, bits = _PACKED[name]
    raw = packed.view(storage)
    codes = np.empty(raw.shape[:-1] + (raw.shape[-1] * 4,), np.uint8)
    for i in range(4):
        codes[..., i::4] = (raw >> storage(bits * i)) & storage((1 << bits) - 1)
    return codes.view(element).astype(np.float32)
