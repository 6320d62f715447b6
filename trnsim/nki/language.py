"""``nki.language`` (``nl``): tiles, memory movement, math and loops, with NKI's names.

Value-returning calls (``t = nl.exp(x)``) make a fresh SBUF tile for the result;
``nl.matmul`` gives a PSUM result that ``+=`` accumulates (``acc += nl.matmul(a, b,
transpose_x=True)``). Kernels in the destination-passing style use
``nl.ndarray`` with :mod:`trnsim.nki.isa`.

This module is the namespace: the functions live in modules by concept
(:mod:`~trnsim.nki.memory`, :mod:`~trnsim.nki.compute`, :mod:`~trnsim.nki.reductions`,
:mod:`~trnsim.nki.loops`, :mod:`~trnsim.nki.composed`, :mod:`~trnsim.nki.kernel_random`), and a
kernel tensor's operators (``a + b``) call the functions found here.
"""

from __future__ import annotations

import sys
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import AluOp
from trnsim.nki import emit as _e, operators
from trnsim.nki.composed import (
    abs_max, abs_min, arctan, ceil, erf_dx, floor, fmod, gelu_apprx_sigmoid, gelu_apprx_sigmoid_dx, logical_and,
    logical_not, logical_or, logical_xor, loop_reduce, mish, mod, prod, shared_identity_matrix, tan, trunc,
)
from trnsim.nki.compute import (
    add, broadcast_to, cos, divide, equal, erf, exp, gelu, gelu_apprx_tanh, gelu_dx, greater, greater_equal, less,
    less_equal, log, matmul, maximum, minimum, multiply, negative, not_equal, power, reciprocal, relu, rsqrt, sigmoid,
    sign, silu, silu_dx, sin, softplus, sqrt, square, subtract, tanh, transpose, where,
)
from trnsim.nki.emit import MatmulResult
from trnsim.nki.loops import (
    affine_range, arange, device_print, dynamic_range, fori_loop, nc, no_reorder, num_programs, par_dim,
    program_id, program_ndim, sequential_range, spmd_dim, static_range, while_loop,
)
from trnsim.nki.memory import (
    copy, empty_like, expand_dims, full, hbm, is_hbm, is_on_chip, is_psum, is_sbuf, load, load_transpose2d, ndarray,
    ones, private_hbm, psum, sbuf, shared_constant, shared_hbm, static_cast, store, zeros, zeros_like,
)
from trnsim.nki.objects import NKIObject
from trnsim.nki.reductions import mean, rms_norm, softmax, var
from trnsim.nki.refused import Refused
from trnsim.nki.kernel_random import dropout, rand, random_seed
from trnsim.nki.tiles import NkiTensor, ds, mgrid, tile_size

# NKI's names that shadow builtins: nl.abs, nl.all, nl.max, nl.min, nl.sum
from trnsim.nki.composed import all  # noqa: A004
from trnsim.nki.compute import abs  # noqa: A004
from trnsim.nki.reductions import max, min, sum  # noqa: A004

# names outside __all__ that nki.language has held (``from nki.language import *`` leaves them out)
from trnsim.isa import (ActivationFunc as ActivationFunc, Engine as Engine, Memory as Memory, Memset as Memset,
                        ReduceOp as ReduceOp, Select as Select, View as View)
from trnsim.dtypes import DType
from trnsim.nki.composed import gather_flattened as gather_flattened
from trnsim.nki.compute import (
    bitwise_and as bitwise_and, bitwise_or as bitwise_or, bitwise_xor as bitwise_xor, invert as invert,
    left_shift as left_shift, prelu as prelu, right_shift as right_shift,
)
from trnsim.nki.memory import copy_into as copy_into
from trnsim.nki.tiles import Affine as Affine, BlockedTile as BlockedTile, Mask as Mask, ParDim as ParDim

dtype = DType   # the class of nl.bfloat16 and the other data types (kernels annotate with it)

__all__ = [
    "ndarray", "zeros", "ones", "full", "zeros_like", "empty_like", "load", "store", "copy", "matmul", "transpose",
    "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "gelu_apprx_tanh", "silu", "square", "abs",
    "sin", "cos", "erf", "sign", "reciprocal", "softplus", "gelu_dx", "silu_dx", "negative",
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal", "not_equal", "greater",
    "greater_equal", "less", "less_equal",
    "sum", "max", "min", "mean", "var", "softmax", "rms_norm", "where", "broadcast_to",
    "affine_range", "sequential_range", "static_range", "arange", "ds", "program_id", "num_programs", "program_ndim",
    "sbuf", "psum", "hbm", "shared_hbm", "private_hbm", "tile_size",
    "float32", "bfloat16", "float16", "float8_e4m3", "float8_e5m2", "int8", "uint8", "int16", "int32", "uint32",
    "tfloat32", "MatmulResult",
    "uint16", "bool_", "float8_e4m3fn", "float8_e8m0fnu", "float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4",
    "float32r", "fp32", "finfo", "NkiTensor", "NKIObject", "mgrid", "par_dim", "nc", "spmd_dim", "static_cast", "device_print",
    "no_reorder", "fori_loop", "while_loop", "dynamic_range", "is_hbm", "is_sbuf", "is_psum", "is_on_chip",
    "bypass", "logical_and", "logical_or", "logical_xor", "logical_not", "abs_max", "abs_min", "tan",
    "mish", "gelu_apprx_sigmoid", "all", "floor", "ceil", "trunc", "mod", "fmod",
    "erf_dx", "gelu_apprx_sigmoid_dx", "arctan", "prod", "loop_reduce", "rand", "random_seed", "dropout", "expand_dims",
    "load_transpose2d", "shared_identity_matrix", "shared_constant",
]


# Dtypes.
float32 = _dt.float32
tfloat32 = _dt.float32
bfloat16 = _dt.bfloat16
float16 = _dt.float16
float8_e4m3 = _dt.float8_e4m3
float8_e5m2 = _dt.float8_e5m2
int8 = _dt.int8
uint8 = _dt.uint8
int16 = _dt.int16
int32 = _dt.int32
uint32 = _dt.uint32


uint16 = _dt.uint16
bool_ = _dt.bool_
float8_e4m3fn = _dt.float8_e4m3fn
float8_e8m0fnu = _dt.float8_e8m0fnu
float8_e5m2_x4 = _dt.float8_e5m2_x4
float8_e4m3fn_x4 = _dt.float8_e4m3fn_x4
float4_e2m1fn_x4 = _dt.float4_e2m1fn_x4
#: fp32 matmul operands read in one pass (NKI's "fp32 replicated" performance mode).
float32r = _dt.float32


#: Limits of a float dtype (legacy ``nl.finfo(nl.bfloat16).min``), as ``numpy.finfo`` gives them.
finfo = _dt.finfo


class fp32:
    """FP32 constants (legacy ``nl.fp32``): ``min`` is the most negative finite fp32."""

    min = -3.4028234663852886e38
    max = 3.4028234663852886e38



# -- ALU operators used as ``op=`` of nki.isa calls ---------------------------

bypass = AluOp.BYPASS


# -- documented names trnsim refuses ------------------------------------------

def _refuse(name: str, reason: str) -> Any:
    return Refused(f"nki.language.{name}", reason)


atomic_rmw = _refuse("atomic_rmw", "atomic HBM updates with indirect indices are not modelled yet")
all_reduce = _refuse("all_reduce", "a trnsim kernel runs on one simulated NeuronCore; there are no other ranks")


_COMPOSED = "built from {} simulated instructions, so it costs more than NKI's single instruction"
_PACKED = "held and moved as bit patterns (numpy sees {}); no simulated engine computes with it yet"

#: Documented names that trnsim implements with a difference (read by ``trnsim.nki.apitable``).
DIFFERENCES: dict[str, str] = {
    "device_print": "prints the tile's name, shape, dtype and memory at trace time, not its values",
    "fori_loop": "the bounds must be known when the kernel is traced (no register-valued bounds)",
    "while_loop": "the condition must be known when the kernel is traced (no register-valued conditions)",
    "dynamic_range": "traced as nl.sequential_range: the bounds must be known when the kernel is traced",
    "hbm": "shared by the instances of a launch, as nl.shared_hbm (nl.private_hbm is each core's own)",
    "private_hbm": "each core of a launch over a logical NeuronCore (kernel[2] on trn2/trn3) has its own; the "
                   "instances of a grid that runs on one core share it",
    "NkiTensor": "indexing and the view methods work; ``t.view(dtype)`` and ``t.ap(..., dtype=)`` read the whole "
                 "tensor's bytes as another dtype (``t.view`` without a call is trnsim's access pattern); an "
                 "HBM tensor indexed by a tile or .ap(vector_offset=/scalar_offset=) "
                 "works in nl.load, nl.store and nisa.dma_copy (indirect DMA); select with a tile, "
                 "vector_select, indirect (on-chip tensor indirection) and rearrange are refused with the reason",
    "tfloat32": "computed as float32",
    "float32r": "computed as float32",
    "float8_e8m0fnu": _PACKED.format("uint8"),
    "float8_e5m2_x4": _PACKED.format("uint32"),
    "float8_e4m3fn_x4": _PACKED.format("uint32"),
    "float4_e2m1fn_x4": _PACKED.format("uint16"),
    "logical_and": _COMPOSED.format(3), "logical_or": _COMPOSED.format(3), "logical_xor": _COMPOSED.format(3),
    "logical_not": _COMPOSED.format(1), "abs_max": _COMPOSED.format(3), "abs_min": _COMPOSED.format(3),
    "tan": _COMPOSED.format(3), "mish": _COMPOSED.format(3), "gelu_apprx_sigmoid": _COMPOSED.format(3),
    "all": _COMPOSED.format(2), "erf_dx": _COMPOSED.format(4), "gelu_apprx_sigmoid_dx": _COMPOSED.format(7),
    "arctan": _COMPOSED.format(30) + "; a series accurate to about 1e-6",
    "prod": _COMPOSED.format("about 15") + "; exp(sum(log|x|)), so about 1e-6 relative error",
    **{n: _COMPOSED.format("3 to 10") + "; exact for |x| below 2**31 (rounding goes through int32)"
       for n in ("floor", "ceil", "trunc", "mod", "fmod")},
    "rand": "values from numpy's generator drawn at trace time, loaded with one DMA; not the chip's generator; "
            "dtype defaults to float32 (the legacy signature)",
    "random_seed": "a number seeds numpy's generator; a seed tile (its value unknown while tracing) restarts it "
                   "from one fixed state",
    "dropout": "its random values come from nl.rand (numpy's generator, drawn at trace time)",
    "loop_reduce": "the running result is kept per call line and per iteration of the enclosing loops it does not "
                   "reduce over, and restarts from zeros when every loop index it names is 0; once assigned to a "
                   "tile (acc[i] = nl.loop_reduce(...)) it accumulates in that tile",
    "static_cast": "a tile is copied on the vector engine; a number or array is converted on the host",
    "prelu": "nisa.activation's op (with relu_param=) and a function prelu(x, alpha): three vector-engine "
             "instructions (after the scalar engine's scale and bias), so it costs more than NKI's one",
    "gather_flattened": "axis=0 and no mask only; one GpSimd gather (nisa.nc_n_gather)",
}

# ``mask=True`` / ``mask=False`` (a condition on loop counters alone) on every call
_e.take_bool_masks(globals(), [n for n in list(globals()) if not n.startswith("_")])

# a kernel tensor's operators (``a + b``, ``t.astype``) call this namespace's functions
operators.install(sys.modules[__name__])
