"""The value lowerings of instruction fidelity: for an aten op, the kernel run that
computes it (:class:`Launch`: the kernel, its arguments as CPU tensors in the kernel's
layout, and ``finish``, which turns the kernel's outputs into the op's result), or None
where the kernel does not take the op as called (then PyTorch's CPU kernel computes it).

Each lowering lays its operands out as the op's timing lowering in
:mod:`trnsim.backend.opkernels` does (``mm``'s left operand transposed to [K, M], leading
dimensions flattened, the reduced or softmax axis moved last); the table that pairs them,
op by op, is :mod:`trnsim.backend.optable`. :mod:`trnsim.backend.instruction` runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from trnsim.backend.lowering import BINARY, MAX_MULTIPLIES, UNARY, Call, chip_dtype, op_base, row_major

CHIP_FLOATS = frozenset({torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2})
_CHIP_INTS = frozenset({torch.int32, torch.int16, torch.int8, torch.uint8})


@dataclass(frozen=True)
class Launch:
    """One kernel run that computes an op: the kernel, its arguments (CPU tensors in the
    kernel's layout, or numbers) and ``finish``, which turns the kernel's outputs (numpy
    arrays of values) into the op's result as CPU tensors."""

    kernel: Any
    args: tuple
    kwargs: dict
    finish: Callable[[list[np.ndarray]], Any]


# -- helpers -------------------------------------------------------------------

def _tensor(values: np.ndarray, shape: Any, dtype: torch.dtype) -> torch.Tensor:
    """Kernel output values (float32 for float dtypes) as a CPU tensor of ``shape`` and
    ``dtype`` (exact: the values are already rounded to ``dtype``)."""
    t = torch.from_numpy(np.ascontiguousarray(values)).reshape(tuple(shape))
    return t != 0 if dtype == torch.bool else t.to(dtype)


def _float(*ts: Any) -> bool:
    """All of ``ts`` are tensors of one chip float dtype."""
    return all(isinstance(t, torch.Tensor) for t in ts) and ts[0].dtype in CHIP_FLOATS and \
        all(t.dtype == ts[0].dtype for t in ts)


def _number(x: Any) -> float | None:
    """A Python number or a 0-dim tensor as a float (None for anything else)."""
    if isinstance(x, torch.Tensor):
        return float(x.item()) if x.dim() == 0 and not x.is_complex() else None
    if isinstance(x, (bool, int, float)):
        return float(x)
    return None


def _epilogue(out: torch.Tensor, bias: torch.Tensor | None, beta: Any, alpha: Any) -> torch.Tensor:
    """``beta * bias + alpha * out`` in fp32, rounded to ``out``'s dtype (``out`` when
    there is nothing to add)."""
    if (bias is None or beta == 0) and alpha == 1:
        return out
    acc = out.float() * alpha
    if bias is not None and beta != 0:
        acc = acc + bias.float() * beta
    return acc.to(out.dtype)


def _wrap_dim(dim: int, ndim: int) -> int | None:
    """``dim`` in ``range(ndim)`` (negative counts from the end), or None where it is out
    of range: PyTorch refuses such a dim, and the CPU kernel then raises its error."""
    return dim % ndim if -ndim <= dim < ndim else None


def _dims(x: torch.Tensor, dim: Any) -> list[int] | None:
    """Reduced dimensions, normalized and sorted (all of them for None or []); None for
    a dim out of range or given twice."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.dim()))
    dims = sorted(_wrap_dim(d, x.dim()) for d in ([dim] if isinstance(dim, int) else dim))
    return dims if None not in dims and len(set(dims)) == len(dims) else None


# -- matmul family -----------------------------------------------------------

# base name -> positions of (bias, left operand, right operand) and the left's rank
_MATMULS = {"mm": (None, 0, 1, 2), "bmm": (None, 0, 1, 3), "mv": (None, 0, 1, 2),
            "addmm": (0, 1, 2, 2), "baddbmm": (0, 1, 2, 3), "addmv": (0, 1, 2, 2)}


def _matmul(call: Call) -> Launch | None:
    """``matmul_rows(a [M, K], b [K, N])`` for a row-major ``a``, else
    ``matmul_general(a^T [K, M], b [K, N])`` (the kernel the op's time comes from),
    batched for bmm; the bias after it."""
    from trnsim.kernels.gemm import matmul_general, matmul_rows

    bias_at, a_at, b_at, rank = _MATMULS[op_base(call.name)]
    a, b = call.args[a_at], call.args[b_at]
    bias = call.args[bias_at] if bias_at is not None else None
    vector = b.dim() == 1
    if not _float(a, b) or a.dim() != rank or b.dim() != (1 if op_base(call.name).endswith("mv") else rank):
        return None
    rhs = b.unsqueeze(-1) if vector else b
    batch = a.shape[0] if rank == 3 else 1
    m, k = a.shape[-2:]
    n = rhs.shape[-1]
    if rhs.shape[-2] != k or (rank == 3 and rhs.shape[0] != batch):
        return None
    if batch * math.ceil(m / 128) * math.ceil(n / 512) * math.ceil(k / 128) > MAX_MULTIPLIES:
        return None   # op fidelity times a slice of it
    out_shape = (m,) if vector else (batch, m, n) if rank == 3 else (m, n)
    if bias is not None and (not _float(bias, a) or torch.broadcast_shapes(bias.shape, out_shape) != out_shape):
        return None
    rows = row_major(a)
    lhs = a if rows else a.transpose(-2, -1)
    if rank == 3 and batch == 1:   # the timing path traces a batch of one as 2-D
        lhs, rhs = lhs[0], rhs[0]
    beta, alpha = call.kwargs.get("beta", 1), call.kwargs.get("alpha", 1)

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        return _epilogue(_tensor(outs[0], out_shape, a.dtype), bias, beta, alpha)

    return Launch(matmul_rows if rows else matmul_general, (lhs, rhs), {"dtype": chip_dtype(a.dtype)}, finish)


# -- elementwise -------------------------------------------------------------

def _unary(call: Call) -> Launch | None:
    """``unary_kernel(x, op)`` on ``x`` flattened (negation is identity scaled by -1)."""
    from trnsim.kernels.elementwise import unary_kernel

    x = call.args[0]
    base = op_base(call.name)
    func = UNARY[base]
    if not _float(x):
        return None
    if base == "gelu" and call.kwargs.get("approximate", "none") == "tanh":
        func = "gelu_apprx_tanh"
    if base == "softplus" and (call.arg(1, "beta", 1) != 1 or call.arg(2, "threshold", 20) != 20):
        return None

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        return _tensor(outs[0], x.shape, x.dtype)

    return Launch(unary_kernel, (x.contiguous(),), {"op": func, "scale": -1.0 if func == "identity" else 1.0},
                  finish)


_COMPARISONS = frozenset({"equal", "not_equal", "greater", "greater_equal", "less", "less_equal"})
# an op with its operands swapped (for the ops that have one)
_COMMUTED = {"add": "add", "multiply": "multiply", "maximum": "maximum", "minimum": "minimum", "equal": "equal",
             "not_equal": "not_equal", "greater": "less", "less": "greater", "greater_equal": "less_equal",
             "less_equal": "greater_equal"}


def _binary(call: Call) -> Launch | None:
    """``scalar_kernel`` for a tensor and a number, ``binary_kernel`` for two tensors: same
    shapes, a row [D] or a column [N, 1] broadcast over the other one as [N, D], or
    anything else expanded to the broadcast shape (the layouts the timing path uses)."""
    from trnsim.kernels.elementwise import binary_kernel, scalar_kernel

    base = op_base(call.name)
    op = BINARY[base]
    first = call.arg(0, "self")
    second = call.arg(1, "other", call.kwargs.get("exponent"))
    if call.arg(2, "alpha", 1) != 1 or call.kwargs.get("rounding_mode") is not None:
        return None
    if base == "rsub":
        first, second = second, first
    try:
        dtype = torch.result_type(first, second)
    except (TypeError, RuntimeError):
        return None
    big = [t for t in (first, second) if isinstance(t, torch.Tensor) and t.dim() > 0]
    if len(big) <= 1:
        tensor = big[0] if big else next(t for t in (first, second) if isinstance(t, torch.Tensor))
        value = _number(second if tensor is first else first)
        if value is None or not _float(tensor) or dtype != tensor.dtype:
            return None
        shape = tensor.shape

        def finish_scalar(outs: list[np.ndarray]) -> torch.Tensor:
            return _tensor(outs[0], shape, torch.bool if op in _COMPARISONS else dtype)

        return Launch(scalar_kernel, (tensor.contiguous(),), {"op": op, "value": value, "reverse": tensor is second},
                      finish_scalar)
    a, b = first, second
    if not _float(a, b) or dtype != a.dtype:
        return None
    shape = torch.broadcast_shapes(a.shape, b.shape)
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    d = shape[-1]
    if tuple(a.shape) == tuple(b.shape):
        x, y = a.contiguous(), b.contiguous()
    else:
        small = b if b.numel() <= a.numel() else a
        full = (a if small is b else b).expand(shape).reshape(rows, d)
        if small.numel() == d and small.shape[-1] == d:          # a row broadcast over the rows
            x, y = full, small.reshape(d)
        elif small.numel() == rows and small.shape[-1] == 1:     # a column broadcast along the rows
            x, y = full, small.reshape(rows, 1)
        else:
            x, y = a.expand(shape).contiguous(), b.expand(shape).contiguous()
            small = b
        if small is a:   # the kernel puts the full operand first
            if op not in _COMMUTED:
                return None
            op = _COMMUTED[op]

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        return _tensor(outs[0], shape, torch.bool if op in _COMPARISONS else dtype)

    return Launch(binary_kernel, (x, y), {"op": op}, finish)


def _cast(call: Call) -> Launch | None:
    """``cast_kernel(x, dtype)`` for a neuron-to-neuron ``_to_copy`` or ``clone`` of a
    contiguous tensor (a new tensor keeps the input's strides, so others are left to the
    CPU kernel)."""
    from trnsim.kernels.elementwise import cast_kernel

    x = call.args[0]
    device = call.kwargs.get("device")
    if device is not None and torch.device(device).type != "neuron":
        return None
    dtype = call.kwargs.get("dtype") or x.dtype
    fmt = call.kwargs.get("memory_format")
    if x.dtype not in CHIP_FLOATS or dtype not in CHIP_FLOATS or not x.is_contiguous() or \
            fmt not in (None, torch.preserve_format, torch.contiguous_format):
        return None

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        return _tensor(outs[0], x.shape, dtype)

    return Launch(cast_kernel, (x,), {"dtype": chip_dtype(dtype)}, finish)


# -- reductions, softmax, norms --------------------------------------------

_REDUCE_OPS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "max": "max", "min": "min"}


def _reduce(call: Call) -> Launch | None:
    """``reduce_kernel`` on ``x`` as [rows, D], the reduced dimensions moved last."""
    from trnsim.kernels.reduce import reduce_kernel

    x = call.args[0]
    base = op_base(call.name)
    if not _float(x) or x.dim() == 0 or call.kwargs.get("dtype") not in (None, x.dtype):
        return None
    dims = _dims(x, call.arg(1, "dim") if base not in ("max", "min") else None)
    if dims is None:
        return None
    keepdim = bool(call.arg(2, "keepdim", False))
    kept = [i for i in range(x.dim()) if i not in dims]
    d = math.prod(x.shape[i] for i in dims)
    rows = x.numel() // d
    x2 = x.permute(*kept, *dims).reshape(rows, d)
    shape = [1 if i in dims else n for i, n in enumerate(x.shape)] if keepdim else [x.shape[i] for i in kept]

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        return _tensor(outs[0], shape, x.dtype)

    return Launch(reduce_kernel, (x2,), {"op": _REDUCE_OPS[base]}, finish)


def _softmax(call: Call) -> Launch | None:
    """``softmax_kernel`` / ``log_softmax_kernel`` on ``x`` as [rows, D], ``dim`` moved last."""
    from trnsim.kernels.reduce import log_softmax_kernel
    from trnsim.kernels.softmax import softmax_kernel

    x = call.args[0]
    third = call.arg(2, "half_to_float", call.kwargs.get("dtype"))
    if not _float(x) or x.dim() == 0 or third not in (None, False, x.dtype):
        return None
    dim = _wrap_dim(call.arg(1, "dim"), x.dim())
    if dim is None:
        return None
    moved = x.movedim(dim, -1)
    d = moved.shape[-1]
    kernel = log_softmax_kernel if "log" in call.name else softmax_kernel

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        return _tensor(outs[0], moved.shape, x.dtype).movedim(-1, dim).contiguous()

    return Launch(kernel, (moved.reshape(x.numel() // d, d),), {}, finish)


def _params(x: torch.Tensor, n: int, *given: torch.Tensor | None) -> list[torch.Tensor] | None:
    """Per-feature parameters [n] in ``x``'s dtype: ones for a missing weight, zeros for a
    missing bias (exact: the kernel then multiplies by 1 and adds 0); None if one has
    another dtype."""
    out = []
    for i, p in enumerate(given):
        if p is None:
            out.append((torch.ones if i == 0 else torch.zeros)(n, dtype=x.dtype))
        elif p.dtype != x.dtype:
            return None
        else:
            out.append(p.reshape(n))
    return out


def _layer_norm(call: Call) -> Launch | None:
    """``layernorm_kernel`` on ``x`` as [rows, D]; mean and rstd from the CPU kernel."""
    from trnsim.kernels.norms import layernorm_kernel

    x, normalized, weight, bias, eps = call.args[:5]
    d = math.prod(normalized)
    params = _params(x, d, weight, bias)
    if not _float(x) or params is None:
        return None

    def finish(outs: list[np.ndarray]) -> tuple:
        _, mean, rstd = torch.ops.aten.native_layer_norm.default(*call.args[:5])
        return _tensor(outs[0], x.shape, x.dtype), mean, rstd

    return Launch(layernorm_kernel, (x.reshape(x.numel() // d, d), *params), {"eps": float(eps)}, finish)


def _rms_norm(call: Call) -> Launch | None:
    """``rmsnorm_kernel`` on ``x`` as [rows, D]; rstd from the CPU kernel."""
    from trnsim.kernels.norms import rmsnorm_kernel

    x, normalized = call.args[:2]
    weight, eps = call.arg(2, "weight"), call.arg(3, "eps")
    d = math.prod(normalized)
    params = _params(x, d, weight)
    if not _float(x) or params is None:
        return None
    eps = torch.finfo(x.dtype).eps if eps is None else eps

    def finish(outs: list[np.ndarray]) -> tuple:
        _, rstd = torch.ops.aten._fused_rms_norm.default(x, normalized, weight, call.arg(3, "eps"))
        return _tensor(outs[0], x.shape, x.dtype), rstd

    return Launch(rmsnorm_kernel, (x.reshape(x.numel() // d, d), *params), {"eps": float(eps)}, finish)


def _group_norm(call: Call) -> Launch | None:
    """``groupnorm_kernel`` on ``x`` [N, C, ...]; mean and rstd from the CPU kernel."""
    from trnsim.kernels.norms import groupnorm_kernel

    x, weight, bias = call.args[:3]
    groups, eps = call.args[6], call.args[7]
    if not _float(x) or x.dim() < 2 or groups > 128:
        return None
    params = _params(x, x.shape[1], weight, bias)
    if params is None:
        return None

    def finish(outs: list[np.ndarray]) -> tuple:
        _, mean, rstd = torch.ops.aten.native_group_norm.default(*call.args[:8])
        return _tensor(outs[0], x.shape, x.dtype), mean, rstd

    return Launch(groupnorm_kernel, (x.contiguous(), *params), {"groups": groups, "eps": float(eps)}, finish)


# batch norm forward ops -> (index of their training argument, None for eval only; whether they take running statistics)
_BATCH_NORM = {"native_batch_norm": (5, True), "_native_batch_norm_legit_functional": (5, True),
               "_native_batch_norm_legit_no_training": (None, True), "_native_batch_norm_legit.no_stats": (3, False)}


def _batch_norm(call: Call, relu: bool = False) -> Launch | None:
    """``batchnorm_kernel`` on ``x`` [N, C, ...]; the saved statistics (and the running
    statistics' update) from the CPU kernel. ``relu``: the kernel applies ReLU to what
    it writes (a compiled graph's fusion), so the first result is ReLU's output."""
    from trnsim.kernels.norms import batchnorm_kernel

    x, weight, bias = call.args[:3]
    at, stats = _BATCH_NORM[call.name.removeprefix("aten::")]
    training = at is not None and bool(call.args[at])
    running = tuple(call.args[3:5]) if stats else (None, None)
    eps = call.args[-1]
    if not _float(x) or x.dim() < 2 or (not training and None in running):
        return None
    params = _params(x, x.shape[1], weight, bias)
    if params is None:
        return None

    def finish(outs: list[np.ndarray]) -> tuple:
        cpu = getattr(torch.ops.aten, call.name.removeprefix("aten::").split(".")[0])
        cpu = getattr(cpu, call.name.split(".")[1] if "." in call.name else "default")
        rest = cpu(*call.args)[1:]
        return (_tensor(outs[0], x.shape, x.dtype), *rest)

    kwargs = {"training": training, "eps": float(eps), "relu": relu}
    extra = () if training else running
    return Launch(batchnorm_kernel, (x.contiguous(), *params, *extra), kwargs, finish)


def batch_norm_with_relu(call: Call) -> Launch | None:
    """The kernel run of batch norm's forward ``call`` with ReLU after it in the same pass
    (its first result ReLU's output), or None where the kernel does not take the call."""
    return _batch_norm(call, relu=True) if call.name.removeprefix("aten::") in _BATCH_NORM else None


# -- gather, conv, movement ------------------------------------------------

def _gather(table: torch.Tensor, index: torch.Tensor, out_shape: Any,
            finish_view: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> Launch | None:
    """``embedding_kernel(table [V, D], index)`` with the index values, so it copies the
    rows asked for."""
    from trnsim.kernels.gather import embedding_kernel

    if (table.dtype not in CHIP_FLOATS and table.dtype not in _CHIP_INTS) or \
            index.dtype not in (torch.int64, torch.int32):
        return None
    flat = index.reshape(-1)

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        return finish_view(_tensor(outs[0], out_shape, table.dtype))

    return Launch(embedding_kernel, (table, flat.to(torch.int32)), {"index_values": flat.tolist()}, finish)


def _embedding(call: Call) -> Launch | None:
    table, index = call.args[:2]
    if table.dim() != 2:
        return None
    return _gather(table, index, (*index.shape, table.shape[1]))


def _index_select(call: Call) -> Launch | None:
    x, index = call.arg(0, "self"), call.arg(2, "index")
    dim = _wrap_dim(call.arg(1, "dim"), x.dim())
    if dim is None or index.dim() > 1:
        return None
    moved = x.movedim(dim, 0)
    rows = moved.shape[0]
    return _gather(moved.reshape(rows, moved.numel() // rows), index, (index.numel(), *moved.shape[1:]),
                   lambda t: t.movedim(0, dim).contiguous())


def _conv(call: Call) -> Launch | None:
    """``conv2d_kernel(x, w, stride, padding)``; the bias after it."""
    from trnsim.kernels.conv import conv2d_kernel

    x, w, bias, stride, padding, dilation, transposed = call.args[:7]
    groups = call.args[8]
    if x.dim() != 4 or w.dim() != 4 or groups != 1 or transposed or any(dd != 1 for dd in dilation) or \
            not _float(x, w) or (bias is not None and not _float(bias, x)):
        return None

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        out = torch.from_numpy(np.ascontiguousarray(outs[0])).to(x.dtype)
        return _epilogue(out, None if bias is None else bias.reshape(-1, 1, 1), 1, 1)

    return Launch(conv2d_kernel, (x.contiguous(), w.contiguous()),
                  {"stride": tuple(stride), "padding": tuple(padding)}, finish)


def _cat(call: Call) -> Launch | None:
    """``concat_kernel(*xs, axis)`` of the non-empty inputs."""
    from trnsim.kernels.movement import concat_kernel

    tensors = call.arg(0, "tensors")
    xs = [t for t in tensors if t.numel()]
    if not xs or not all(t.dim() == xs[0].dim() and t.dtype == xs[0].dtype for t in tensors) or \
            (xs[0].dtype not in CHIP_FLOATS and xs[0].dtype not in _CHIP_INTS):
        return None
    axis = _wrap_dim(call.arg(1, "dim", 0), xs[0].dim())
    if axis is None:
        return None

    def finish(outs: list[np.ndarray]) -> torch.Tensor:
        return _tensor(outs[0], outs[0].shape, xs[0].dtype)

    return Launch(concat_kernel, tuple(t.contiguous() for t in xs), {"axis": axis}, finish)
