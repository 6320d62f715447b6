"""The data types a NeuronCore stores and computes with.

Each dtype has a numpy *storage* type: bfloat16 is kept as its uint16 bit
pattern, the float8 types as uint8 bit patterns, everything else as the numpy
type of the same name. ``trnsim.compute`` converts between storage and values.

Each dtype is also accepted by numpy (``np.ones(4, dtype=nl.float8_e5m2)``) through
its ``dtype`` attribute, the numpy type that holds its *values* on the host: the
type of the same name where numpy has one, float32 for bfloat16, tfloat32 and the
float8 types (numpy has no 8-bit floats; the values are rounded to the chip dtype
when a kernel reads them), uint32 for the packed four-in-one types, bool for bool_.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from numpy.typing import NDArray

from trnsim.errors import ProgramError

#: Values of a chip dtype on the host: float64, which holds every chip dtype's values exactly.
Values: TypeAlias = NDArray[np.float64]
#: A chip dtype's storage array: its values or bit patterns in the dtype's numpy storage type.
Storage: TypeAlias = NDArray[np.generic]


class DType:
    """A chip data type: its name, size in bytes, numpy storage type and kind.

    Each dtype exists once, so dtypes compare by identity, and it cannot change. It is
    not a dataclass, as NKI's dtypes (ml_dtypes' types) are not: ``dataclasses.asdict``
    of a kernel's configuration that holds one keeps the dtype (nki-library's tests
    pass ``**asdict(test_cfg)`` with ``dtype=nl.bfloat16`` in it)."""

    __slots__ = ("name", "itemsize", "storage", "is_float", "host")
    name: str
    itemsize: int
    storage: np.dtype
    is_float: bool
    host: np.dtype | None

    def __init__(self, name: str, itemsize: int, storage: np.dtype, is_float: bool, host: np.dtype | None = None) -> None:
        for field_name, value in (("name", name), ("itemsize", itemsize), ("storage", storage), ("is_float", is_float),
                                  ("host", host)):
            object.__setattr__(self, field_name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"dtype {self.name} cannot change its {name}: each dtype exists once")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"dtype {self.name} cannot lose its {name}: each dtype exists once")

    def __reduce__(self) -> tuple:
        # a pickled dtype comes back as the one of that name
        return (as_dtype, (self.name,))

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of this dtype's values on the host, as NKI's are: numpy reads
        this attribute, so ``np.zeros(shape, dtype=nl.bfloat16)`` is an ml_dtypes
        bfloat16 array and ``a.dtype == nl.bfloat16`` holds for one (AWS's NKI library's
        tests compare so); the narrow floats are ml_dtypes' (imported on first use)."""
        narrow = _ML_DTYPES.get(self.name)
        if narrow is not None:
            import ml_dtypes

            return np.dtype(getattr(ml_dtypes, narrow))
        return self.host if self.host is not None else self.storage

    def __repr__(self) -> str:
        return self.name


_F32 = np.dtype(np.float32)
# the chip's narrow floats by ml_dtypes' names: the NeuronCore's float8_e4m3 is the IEEE
# 754 style e4m3 (largest 240, with infinities), ml_dtypes' float8_e4m3; float8_e4m3fn is
# OCP's finite-only e4m3 (largest 448), a dtype of its own in NKI
_ML_DTYPES = {"bfloat16": "bfloat16", "float8_e4m3": "float8_e4m3", "float8_e4m3fn": "float8_e4m3fn",
              "float8_e5m2": "float8_e5m2"}

float32 = DType("float32", 4, np.dtype(np.float32), True)
bfloat16 = DType("bfloat16", 2, np.dtype(np.uint16), True, _F32)
float16 = DType("float16", 2, np.dtype(np.float16), True)
float8_e4m3 = DType("float8_e4m3", 1, np.dtype(np.uint8), True, _F32)
float8_e4m3fn = DType("float8_e4m3fn", 1, np.dtype(np.uint8), True, _F32)
float8_e5m2 = DType("float8_e5m2", 1, np.dtype(np.uint8), True, _F32)
int8 = DType("int8", 1, np.dtype(np.int8), False)
uint8 = DType("uint8", 1, np.dtype(np.uint8), False)
int16 = DType("int16", 2, np.dtype(np.int16), False)
uint16 = DType("uint16", 2, np.dtype(np.uint16), False)
int32 = DType("int32", 4, np.dtype(np.int32), False)
uint32 = DType("uint32", 4, np.dtype(np.uint32), False)
#: NKI's boolean: one byte per value, 0 or 1.
bool_ = DType("bool_", 1, np.dtype(np.uint8), False, np.dtype(np.bool_))
#: Microscaling (MX) formats: an 8-bit power-of-two scale, and four narrow floats packed
#: in one 32-bit element. Kernels move and store them as bit patterns.
float8_e8m0fnu = DType("float8_e8m0fnu", 1, np.dtype(np.uint8), True, np.dtype(np.uint8))
float8_e5m2_x4 = DType("float8_e5m2_x4", 4, np.dtype(np.uint32), True, np.dtype(np.uint32))
float8_e4m3fn_x4 = DType("float8_e4m3fn_x4", 4, np.dtype(np.uint32), True, np.dtype(np.uint32))
float4_e2m1fn_x4 = DType("float4_e2m1fn_x4", 2, np.dtype(np.uint16), True, np.dtype(np.uint16))

#: The dtypes engines compute with.
ALL: tuple[DType, ...] = (float32, bfloat16, float16, float8_e4m3, float8_e4m3fn, float8_e5m2, int8, uint8, int16,
                          uint16, int32, uint32, bool_)
#: The 8-bit floats the engines compute with.
FLOAT8: tuple[DType, ...] = (float8_e4m3, float8_e4m3fn, float8_e5m2)
#: Dtypes held as bit patterns only: kernels move them, no engine computes with them in trnsim.
PACKED: tuple[DType, ...] = (float8_e8m0fnu, float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4)
_BY_NAME = {d.name: d for d in ALL + PACKED}
_ALIASES = {
    "fp32": float32, "float": float32, "bf16": bfloat16, "fp16": float16, "half": float16,
    "fp8_e4m3": float8_e4m3, "fp8_e5m2": float8_e5m2, "bool": bool_,
    "tfloat32": float32, "float32r": float32,
}
_FROM_NUMPY = {np.dtype(np.float32): float32, np.dtype(np.float16): float16, np.dtype(np.int8): int8,
               np.dtype(np.uint8): uint8, np.dtype(np.int16): int16, np.dtype(np.uint16): uint16,
               np.dtype(np.int32): int32, np.dtype(np.uint32): uint32, np.dtype(np.bool_): bool_}
# ml_dtypes' scalar types by their numpy names
_FROM_EXTENSION = {"bfloat16": bfloat16, "float8_e4m3fn": float8_e4m3fn, "float8_e4m3": float8_e4m3,
                   "float8_e5m2": float8_e5m2, "float8_e8m0fnu": float8_e8m0fnu}


def _from_numpy(value: np.dtype) -> DType | None:
    """The chip dtype of a numpy dtype: numpy's own, ml_dtypes' narrow floats (known by
    name, so ml_dtypes need not be imported) and the packed types of ``neuron_dtypes``
    (uint dtypes that carry their name in the dtype's metadata)."""
    packed = (value.metadata or {}).get("neuron_dtype")
    if packed is not None:
        return _BY_NAME.get(packed)
    found = _FROM_NUMPY.get(value)
    if found is None and value.kind in "Vf":   # ml_dtypes' types are kind V, or f in newer releases
        return _FROM_EXTENSION.get(value.name)
    return found


def is_extension(value: np.dtype) -> bool:
    """Whether ``value`` is one of ml_dtypes' narrow floats (bfloat16, float8...), which
    numpy computes with only after a cast to float32."""
    return value.kind in "Vf" and value not in _FROM_NUMPY and value.name in _FROM_EXTENSION


def as_dtype(value: object) -> DType:
    """Turn a DType, a name (``"bfloat16"``, ``"bf16"``) or a numpy dtype into a DType."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        found = _BY_NAME.get(value) or _ALIASES.get(value)
        if found is not None:
            return found
    else:
        try:
            found = _from_numpy(np.dtype(value))  # type: ignore[call-overload]
        except TypeError:
            found = None
        if found is not None:
            return found
    names = ", ".join(d.name for d in ALL)
    raise ProgramError(f"unsupported dtype {value!r}; the chip's dtypes are: {names}")


def int_range(dtype: DType) -> tuple[int, int]:
    """Smallest and largest value of an integer dtype."""
    info = np.iinfo(dtype.storage)
    return int(info.min), int(info.max)


@dataclass(frozen=True)
class FloatInfo:
    """Limits of a float dtype, as ``numpy.finfo`` gives them: ``max`` and ``min`` the
    largest and most negative finite values, ``tiny`` the smallest positive normal,
    ``eps`` the gap between 1 and the next value."""

    dtype: DType
    bits: int
    max: float
    min: float
    tiny: float
    eps: float

    @property
    def smallest_normal(self) -> float:
        return self.tiny


# (exponent bits, mantissa bits, largest finite value) of the narrow floats numpy lacks
_NARROW_FLOATS = {"bfloat16": (8, 7, float.fromhex("0x1.fep127")), "float8_e4m3": (4, 3, 240.0),
                  "float8_e4m3fn": (4, 3, 448.0), "float8_e5m2": (5, 2, 57344.0)}


def finfo(dtype: object) -> FloatInfo:
    """Limits of the float ``dtype`` (NKI's ``nl.finfo``)."""
    dt = as_dtype(dtype)
    if dt.name in _NARROW_FLOATS:
        exponent, mantissa, largest = _NARROW_FLOATS[dt.name]
        return FloatInfo(dt, 8 * dt.itemsize, largest, -largest, 2.0 ** (2 - 2 ** (exponent - 1)), 2.0 ** -mantissa)
    if dt in (float32, float16):
        info = np.finfo(dt.storage)
        return FloatInfo(dt, int(info.bits), float(info.max), float(info.min), float(info.tiny), float(info.eps))
    raise ProgramError(f"finfo of {dt.name}: not a float dtype the engines compute with; use numpy.iinfo for integers")


def check_values(values: np.ndarray, dtype: DType, what: str) -> None:
    """Refuse ``values`` as data of ``dtype`` where they are not real numbers, or, for an
    integer dtype, not all integers in its range: the chip would saturate or round them
    (300 as int8 is 127), a change nobody asked for. Floats are rounded to a float dtype
    as HBM stores them, which is what a float dtype means."""
    if values.dtype.kind not in "biuf":
        raise ProgramError(f"{what}: cannot load an array of {values.dtype}; pass real numbers")
    if dtype.is_float or not values.size:
        return
    info = np.iinfo(dtype.storage)
    with np.errstate(invalid="ignore"):
        bad = (values < info.min) | (values > info.max)
        if values.dtype.kind == "f":
            bad |= ~np.isfinite(values) | (values != np.trunc(values))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ProgramError(f"{what}: {int(bad.sum())} of {values.size} values are not {dtype.name} values (integers "
                           f"from {info.min} to {info.max}), the first {values[where].item()!r} at {list(where)}; "
                           "convert them first, for example with np.clip and np.round, or choose a wider dtype")
