"""The timing lowerings: aten ops timed by kernels from :mod:`trnsim.kernels`.

Each lowering here (paired with its op's names in :mod:`trnsim.backend.optable`) turns
an op's arguments into a kernel call on placeholder arrays of the same shapes and dtypes (``np.broadcast_to`` of one zero:
no memory), traces it into a Program and simulates its timing. Layout changes the
chip would need (a transpose for ``mm``'s stationary operand, flattening leading
dimensions) are free here: the kernel sees the operands in its own layout.

On a chip whose logical NeuronCore spans several physical cores (trn2's LNC=2), each
entry traces one physical core's share of the op (see :mod:`trnsim.backend.lowering`).

Very large ops are traced on a slice and scaled: a matmul whose Program would pass
:data:`MAX_MULTIPLIES` multiplies is timed on a slab of its batch, rows or columns and
repeated (``OpCost.scale``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from trnsim.backend import state
from trnsim.backend.lowering import (BINARY, MAX_MULTIPLIES, UNARY, Call, chip_dtype, lnc, op_base, placeholder,
                                     row_major, run_kernel)
from trnsim.backend.opcost import OpCost, estimate, tensor_bytes
from trnsim.errors import TrnSimError

def _tensors(flat: list) -> list[torch.Tensor]:
    return [x for x in flat if isinstance(x, torch.Tensor)]


# -- matmul family -----------------------------------------------------------

def _matmul(call: Call, b: int, m: int, k: int, n: int, dtype: torch.dtype, rows: bool = False) -> OpCost:
    """``matmul_general`` on the left operand transposed ([K, M] in memory), or with
    ``rows`` ``matmul_rows`` on it in rows ([M, K]: each piece transposed on chip)."""
    from trnsim.kernels.gemm import matmul_general, matmul_rows

    b, m, n, scale = call.shares.matmul(b, m, k, n)
    k = max(k, 1)
    rhs = (b, k, n) if b > 1 else (k, n)
    out_dtype = chip_dtype(dtype) if dtype.is_floating_point else "float32"
    if rows:
        return run_kernel(matmul_rows, "matmul_rows", placeholder((b, m, k) if b > 1 else (m, k), dtype),
                          placeholder(rhs, dtype), dtype=out_dtype, repeat=scale)
    return run_kernel(matmul_general, "matmul_general", placeholder((b, k, m) if b > 1 else (k, m), dtype),
                      placeholder(rhs, dtype), dtype=out_dtype, repeat=scale)


def _mm(call: Call) -> OpCost:
    a, b = _tensors(list(call.args))[-2:]   # positional: an out= tensor is keyword-only
    return _matmul(call, 1, a.shape[0], a.shape[1], b.shape[1], a.dtype, row_major(a))


def _bmm(call: Call) -> OpCost:
    a, b = _tensors(list(call.args))[-2:]
    return _matmul(call, a.shape[0], a.shape[1], a.shape[2], b.shape[2], a.dtype, row_major(a))


def _mv(call: Call) -> OpCost:
    a, v = _tensors(list(call.args))[-2:]
    return _matmul(call, 1, a.shape[0], a.shape[1], 1, a.dtype, row_major(a))


def _grouped_mm(call: Call) -> OpCost | None:
    """``_grouped_mm``: a batch of matmuls ([B, M, K] x [B, K, N]) as ``bmm``; tokens
    sorted by expert ([M, K] x [G, K, N] with ``offs``, the end row of each group) as one
    :func:`trnsim.kernels.grouped.grouped_matmul`, with each group's row count read from
    ``offs`` (an even split in timing fidelity, where the device holds no values)."""
    from trnsim.kernels.grouped import grouped_matmul

    a, b = call.arg(0, "self"), call.arg(1, "mat2")
    offs = call.arg(2, "offs")
    if a.dim() == 3 and b.dim() == 3:
        return _matmul(call, a.shape[0], a.shape[1], a.shape[2], b.shape[2], a.dtype, row_major(a))
    if a.dim() != 2 or b.dim() != 3 or offs is None:
        return None   # offsets that group K (a weight gradient): the estimate times it
    (m, k), (groups, n) = a.shape, (b.shape[0], b.shape[2])
    ends = _group_ends(offs, m, groups)
    rows = tuple(e - s for s, e in zip((0,) + ends[:-1], ends))
    if lnc() > 1:
        n = call.shares.split(n)   # the physical cores take half the columns of every group each
    mults = sum(math.ceil(r / 128) for r in rows) * math.ceil(n / 512) * math.ceil(k / 128)
    scale = 1
    if mults > MAX_MULTIPLIES and n > 512:
        keep = max(512, (n * MAX_MULTIPLIES // mults) // 512 * 512)
        scale, n = math.ceil(n / keep), keep
    dtype = call.arg(4, "out_dtype") or a.dtype
    return run_kernel(grouped_matmul, "grouped_matmul", placeholder((k, m), a.dtype), placeholder((groups, k, n), b.dtype),
                rows=rows, dtype=chip_dtype(dtype), repeat=scale)


def _group_ends(offs: torch.Tensor, m: int, groups: int) -> tuple[int, ...]:
    """Each group's end row from ``offs``; an even split of ``m`` rows where the values
    are not on the host (timing fidelity)."""
    from trnsim.backend import storage

    if offs.device.type == "neuron" and (state.fidelity() == "timing" or storage.block_of(offs).host is None):
        return tuple(min(m, math.ceil(m * (g + 1) / groups)) for g in range(groups))
    values = storage.host_alias(offs) if offs.device.type == "neuron" else offs
    return tuple(min(m, max(0, int(v))) for v in values.tolist())


# -- elementwise -------------------------------------------------------------

def _unary(call: Call) -> OpCost:
    flat = call.flat
    from trnsim.kernels.elementwise import unary_kernel

    x = _tensors(flat)[0]
    func = UNARY[op_base(call.name)]
    return run_kernel(unary_kernel, f"unary_kernel[{func}]", placeholder(call.shares.per_core(x.shape), x.dtype), op=func,
                scale=1.0 if func != "identity" else -1.0)


def _binary(call: Call) -> OpCost:
    from trnsim.kernels.elementwise import binary_kernel, scalar_kernel

    ts = _tensors(list(call.args))   # not an out= tensor
    op = BINARY[op_base(call.name)]
    x = ts[0]
    big = [t for t in ts if t.dim() > 0]
    if len(ts) == 1 or len(big) <= 1:
        y = big[0] if big else x
        return run_kernel(scalar_kernel, f"scalar_kernel[{op}]", placeholder(call.shares.per_core(y.shape), y.dtype),
                    op=op, value=1.0)
    a, b = big[0], big[1]
    shape = torch.broadcast_shapes(a.shape, b.shape)
    if tuple(a.shape) == tuple(b.shape):
        part = call.shares.per_core(shape)
        return run_kernel(binary_kernel, f"binary_kernel[{op}]", placeholder(part, a.dtype), placeholder(part, b.dtype), op=op)
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    d = shape[-1] if shape else 1
    small = b if b.numel() <= a.numel() else a
    part = call.shares.split(rows)
    if small.numel() == d and small.shape[-1] == d:       # a row broadcast over the rows
        return run_kernel(binary_kernel, f"binary_kernel[{op}]", placeholder((part, d), a.dtype), placeholder((d,), small.dtype),
                    op=op)
    if small.numel() == rows and small.shape[-1] == 1:  # a column broadcast along the rows
        return run_kernel(binary_kernel, f"binary_kernel[{op}]", placeholder((part, d), a.dtype),
                    placeholder((part, 1), small.dtype), op=op)
    part = call.shares.per_core(shape)
    return run_kernel(binary_kernel, f"binary_kernel[{op}]", placeholder(part, a.dtype), placeholder(part, a.dtype), op=op)




def _cast(call: Call) -> OpCost:
    flat, out = call.flat, call.out
    from trnsim.kernels.elementwise import cast_kernel

    if not isinstance(out, torch.Tensor):
        return None
    src = next((t for t in _tensors(flat) if t is not out), _tensors(flat)[0])
    if src.device.type != "neuron" or out.device.type != "neuron":
        return None
    return run_kernel(cast_kernel, "cast_kernel", placeholder(call.shares.per_core(out.shape), src.dtype),
                dtype=chip_dtype(out.dtype))


# -- reductions, softmax, norms --------------------------------------------

def _rows_cols(x: torch.Tensor, dims: Any) -> tuple[int, int]:
    """The op's reduction as [rows, D]: D is the product of the reduced dimensions."""
    if dims is None or dims == [] or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return 1, max(x.numel(), 1)
    dims = [dims] if isinstance(dims, int) else list(dims)
    d = math.prod(x.shape[i] for i in dims) if x.dim() else 1
    return max(x.numel() // max(d, 1), 1), max(d, 1)


def _reduce(call: Call) -> OpCost:
    flat = call.flat
    from trnsim.kernels.reduce import reduce_kernel

    x = _tensors(flat)[0]
    base = op_base(call.name)
    op = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "max": "max", "min": "min",
          "argmax": "max", "argmin": "min", "norm": "sum", "linalg_vector_norm": "sum", "var": "mean",
          "std": "mean", "prod": "sum", "logsumexp": "sum", "any": "max", "all": "min"}[base]
    dims = call.arg(2, "dim") if base in ("norm", "linalg_vector_norm") else call.arg(1, "dim")   # after ord/p
    if isinstance(dims, bool) or not isinstance(dims, (int, list, tuple, type(None))):
        dims = None
    rows, d = _rows_cols(x, dims)
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    return run_kernel(reduce_kernel, f"reduce_kernel[{op}]", placeholder((call.shares.split(rows), d), dtype), op=op)


def _softmax(call: Call) -> OpCost:
    flat = call.flat
    from trnsim.kernels.reduce import log_softmax_kernel
    from trnsim.kernels.softmax import softmax_kernel

    x = _tensors(flat)[0]
    dim = call.arg(1, "dim", -1)
    rows, d = _rows_cols(x, dim % max(x.dim(), 1) if x.dim() else None)
    kernel = log_softmax_kernel if "log" in call.name else softmax_kernel
    return run_kernel(kernel, kernel.__name__, placeholder((call.shares.split(rows), d), x.dtype))


def _layer_norm(call: Call) -> OpCost:
    flat = call.flat
    from trnsim.kernels.norms import layernorm_kernel

    x = _tensors(flat)[0]
    d = math.prod(call.arg(1, "normalized_shape"))
    return run_kernel(layernorm_kernel, "layernorm_kernel", placeholder((call.shares.split(x.numel() // max(d, 1)), d), x.dtype),
                placeholder((d,), x.dtype), placeholder((d,), x.dtype))


def _rms_norm(call: Call) -> OpCost:
    flat = call.flat
    from trnsim.kernels.norms import rmsnorm_kernel

    x = _tensors(flat)[0]
    d = math.prod(call.arg(1, "normalized_shape"))
    return run_kernel(rmsnorm_kernel, "rmsnorm_kernel", placeholder((call.shares.split(x.numel() // max(d, 1)), d), x.dtype),
                placeholder((d,), x.dtype))


def _group_norm(call: Call) -> OpCost:
    flat = call.flat
    from trnsim.kernels.norms import groupnorm_kernel

    x = _tensors(flat)[0]
    groups = call.arg(6, "group", 1)
    if groups > 128 or x.dim() < 2:
        return None
    c = x.shape[1]
    xs = (call.shares.split(x.shape[0]),) + tuple(x.shape[1:])   # a share of the batch on each physical core
    return run_kernel(groupnorm_kernel, "groupnorm_kernel", placeholder(xs, x.dtype), placeholder((c,), x.dtype),
                placeholder((c,), x.dtype), groups=groups)


# batch norm forward ops -> (index of their training argument, None for eval only; whether they take running statistics)
_BATCH_NORM = {"native_batch_norm": (5, True), "native_batch_norm.out": (5, True),
               "_native_batch_norm_legit": (5, True), "_native_batch_norm_legit.out": (5, True),
               "_native_batch_norm_legit_functional": (5, True), "_native_batch_norm_legit.no_stats": (3, False),
               "_native_batch_norm_legit.no_stats_out": (3, False), "_native_batch_norm_legit_no_training": (None, True),
               "_native_batch_norm_legit_no_training.out": (None, True)}


def _batch_norm(call: Call, relu: bool = False) -> OpCost | None:
    """Batch norm's forward ops, training or eval (``input, weight, bias, running_mean,
    running_var, training, momentum, eps``; ``no_stats`` without the running statistics,
    ``no_training`` without ``training``): ``batchnorm_kernel`` on a share of the images
    per physical core (adding the cores' per-channel sums is left out); ``relu``: with
    the ReLU after it in the same pass."""
    from trnsim.kernels.norms import batchnorm_kernel

    x, weight, bias = call.arg(0, "input"), call.arg(1, "weight"), call.arg(2, "bias")
    at, stats = _BATCH_NORM[call.name.removeprefix("aten::")]
    running = (call.arg(3, "running_mean"), call.arg(4, "running_var")) if stats else (None, None)
    training = at is not None and bool(call.arg(at, "training"))
    if x.dim() < 2 or (not training and None in running):
        return None
    vectors = [placeholder((x.shape[1],), t.dtype) if t is not None else None for t in (weight, bias, *running)]
    return run_kernel(batchnorm_kernel, "batchnorm_kernel[relu]" if relu else "batchnorm_kernel",
                placeholder(call.shares.images(x.shape), x.dtype), *vectors, training=training, relu=relu)


def _batch_norm_backward(call: Call, relu: bool = False) -> OpCost | None:
    """``native_batch_norm_backward(grad_out, input, weight, running_mean, running_var,
    save_mean, save_invstd, train, eps, output_mask)``: ``batchnorm_backward_kernel`` on
    a share of the images per physical core; ``relu``: with ReLU's backward before it
    in the same pass (the gradient masked by the forward's ReLU output, of the input's
    dtype, as it is read)."""
    from trnsim.kernels.backward import batchnorm_backward_kernel

    grad, x, weight = call.arg(0, "grad_out"), call.arg(1, "input"), call.arg(2, "weight")
    train = bool(call.arg(7, "train"))
    mean, invstd = (call.arg(5, "save_mean"), call.arg(6, "save_invstd")) if train else \
        (call.arg(3, "running_mean"), call.arg(4, "running_var"))
    mask = list(call.arg(9, "output_mask", (True, True, True)))
    if x.dim() < 2 or mean is None or invstd is None or not any(mask):
        return None
    c = x.shape[1]
    share = call.shares.images(x.shape)
    return run_kernel(batchnorm_backward_kernel, "batchnorm_backward_kernel[relu]" if relu else "batchnorm_backward_kernel",
                placeholder(share, grad.dtype), placeholder(share, x.dtype),
                placeholder((c,), weight.dtype) if weight is not None else None,
                placeholder((c,), mean.dtype), placeholder((c,), invstd.dtype), training=train, need_input=bool(mask[0]),
                need_weight=bool(mask[1]), need_bias=bool(mask[2]), relu_out=placeholder(share, x.dtype) if relu else None)


def _group_norm_backward(call: Call) -> OpCost | None:
    """``native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
    output_mask)``: ``groupnorm_backward_kernel`` on a share of the images per physical core."""
    from trnsim.kernels.backward import groupnorm_backward_kernel

    grad, x, mean, weight = call.arg(0, "grad_out"), call.arg(1, "input"), call.arg(2, "mean"), call.arg(4, "weight")
    groups = int(call.arg(8, "group"))
    mask = list(call.arg(9, "output_mask", (True, True, True)))
    if x.dim() < 2 or groups > 128 or not any(mask):
        return None
    share = call.shares.images(x.shape)
    c = x.shape[1]
    return run_kernel(groupnorm_backward_kernel, "groupnorm_backward_kernel", placeholder(share, grad.dtype),
                placeholder(share, x.dtype),
                placeholder((share[0], groups), mean.dtype), placeholder((share[0], groups), mean.dtype),
                placeholder((c,), weight.dtype) if weight is not None else None, groups, need_input=bool(mask[0]),
                need_weight=bool(mask[1]), need_bias=bool(mask[2]))


# -- backward of activations, softmax and norms ------------------------------

# aten backward op -> (activation_backward_kernel op, where it takes its threshold)
_ACTIVATION_BACKWARD = {"threshold_backward": "threshold", "gelu_backward": "gelu", "silu_backward": "silu",
                        "sigmoid_backward": "sigmoid", "tanh_backward": "tanh"}


def _activation_backward(call: Call) -> OpCost:
    """``<activation>_backward(grad_output, self_or_output, ...)``: both operands are
    positional (the grad_input out= tensor is keyword-only)."""
    from trnsim.kernels.backward import activation_backward_kernel

    grad, saved = call.arg(0, "grad_output"), call.arg(1, "self")
    op = _ACTIVATION_BACKWARD[op_base(call.name)]
    kwargs: dict[str, Any] = {}
    if op == "threshold":
        kwargs["threshold"] = float(call.arg(2, "threshold", 0.0))
    elif op == "gelu" and call.kwargs.get("approximate", "none") == "tanh":
        op = "gelu_tanh"
    shape = torch.broadcast_shapes(grad.shape, saved.shape)
    part = call.shares.per_core(shape)
    return run_kernel(activation_backward_kernel, f"activation_backward_kernel[{op}]", placeholder(part, grad.dtype),
                placeholder(part, saved.dtype), op=op, **kwargs)


def _softmax_backward(call: Call) -> OpCost:
    """``_softmax_backward_data(grad_output, output, dim, input_dtype)`` and its log form,
    the softmax axis taken as the rows' free axis as in the forwards."""
    from trnsim.kernels.backward import softmax_backward_kernel

    grad, y = call.arg(0, "grad_output"), call.arg(1, "output")
    dim = call.arg(2, "dim", -1)
    rows, d = _rows_cols(grad, dim % max(grad.dim(), 1) if grad.dim() else None)
    rows = call.shares.split(rows)
    return run_kernel(softmax_backward_kernel, "softmax_backward_kernel", placeholder((rows, d), grad.dtype),
                placeholder((rows, d), y.dtype), log="log" in call.name)


def _layer_norm_backward(call: Call) -> OpCost:
    """``native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight,
    bias, output_mask)``."""
    from trnsim.kernels.backward import layernorm_backward_kernel

    grad, x = call.arg(0, "grad_out"), call.arg(1, "input")
    mean, rstd, weight = call.arg(3, "mean"), call.arg(4, "rstd"), call.arg(5, "weight")
    mask = list(call.arg(7, "output_mask", (True, True, True)))
    d = math.prod(call.arg(2, "normalized_shape"))
    n = call.shares.split(x.numel() // max(d, 1))
    if not any(mask):
        return None
    gamma = placeholder((d,), weight.dtype) if weight is not None else None
    return run_kernel(layernorm_backward_kernel, "layernorm_backward_kernel", placeholder((n, d), grad.dtype),
                placeholder((n, d), x.dtype),
                placeholder((n,), mean.dtype), placeholder((n,), rstd.dtype), gamma, need_input=bool(mask[0]),
                need_weight=bool(mask[1]), need_bias=bool(mask[2]))


# Where each attention op takes is_causal and its mask: (index, name) of each.
_ATTENTION_ARGS = {
    # attn_mask is keyword-only here: an index past every positional argument
    "aten::_scaled_dot_product_flash_attention_for_cpu": ((4, "is_causal"), (99, "attn_mask")),
    "aten::_scaled_dot_product_attention_math": ((5, "is_causal"), (3, "attn_mask")),
    "aten::_scaled_dot_product_fused_attention_overrideable": ((5, "is_causal"), (3, "attn_bias")),
}


def _attention_shape(call: Call, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int] | None:
    """(one physical core's share of the (batch, head) pairs, Sq and Sk padded to the
    kernels' 128-row tile, D) of attention over q [..., Sq, D], k and v [..., Sk, D];
    None where the kernels do not apply."""
    d = q.shape[-1]
    if q.dim() < 2 or k.shape[-1] != d or v.shape[-1] != d or k.shape[-2] != v.shape[-2]:
        return None
    sq, sk = (-(-n // 128) * 128 for n in (q.shape[-2], k.shape[-2]))
    return call.shares.split(math.prod(q.shape[:-2])), sq, sk, d


def _with_mask(cost: OpCost, mask: torch.Tensor | None) -> OpCost:
    """``cost`` plus a mask's bytes over HBM bandwidth (the flash kernels read none)."""
    if mask is None:
        return cost
    return OpCost(ps=cost.ps + estimate(tensor_bytes(mask)).ps, source="kernel", kernel=f"{cost.kernel} + mask",
                  run=cost.run, scale=cost.scale, hbm_bytes=(cost.hbm_moved() or 0) + tensor_bytes(mask),
                  call=cost.call)


def _two_heads(kernel: Any) -> Any:
    """A kernel running ``kernel`` twice on the same operands, in one Program: two heads."""
    from trnsim import nki

    def two_heads(*args: Any, **kwargs: Any) -> Any:
        kernel(*args, **kwargs)
        return kernel(*args, **kwargs)
    two_heads.__name__ = f"{kernel.__name__}_two_heads"
    return nki.jit(two_heads)


_two: dict[int, Any] = {}


def per_head(kernel: Any, name: str, heads: int, *args: Any, **kwargs: Any) -> OpCost:
    """``kernel`` (one head) for ``heads`` independent heads. The chip overlaps one head's
    loads, stores and engine latencies with the next head's work, so the heads do not
    cost ``heads`` times one: one head and two heads are traced (the second head in the
    same Program as the first), and every head after the first costs what the second
    added, ``T(1) + (heads - 1) * (T(2) - T(1))``. The op's bytes and FLOPs are one head's
    times ``heads``."""
    one = run_kernel(kernel, name, *args, **kwargs)
    if heads <= 1:
        return one
    two = _two.get(id(kernel))
    if two is None:
        two = _two[id(kernel)] = _two_heads(kernel)
    second = run_kernel(two, name, *args, **kwargs).ps - one.ps
    return OpCost(ps=one.ps + (heads - 1) * min(max(second, 0), one.ps), source="kernel", kernel=name, run=one.run,
                  scale=heads, call=one.call)


def _attention(call: Call) -> OpCost:
    """Attention [..., Sq, D] x [..., Sk, D]: ``flash_attention_fwd`` for every (batch,
    head), the heads overlapping (:func:`per_head`); where the heads of q, k and v lie
    side by side in each row ([B, H, S, D] viewed from a projection's [B, S, H * D], as
    a model makes them) and their rows fit, ``flash_attention_heads`` over each batch
    entry's heads at once, which loads every row once. Sequences are timed padded to a
    multiple of 128 (the kernel's tile); a mask adds its bytes over HBM bandwidth (the
    kernel reads none)."""
    from trnsim.kernels.attention import flash_attention_fwd

    q, k, v = call.arg(0, "query"), call.arg(1, "key"), call.arg(2, "value")
    (ci, cname), (mi, mname) = _ATTENTION_ARGS[call.name]
    shape = _attention_shape(call, q, k, v)
    if shape is None:
        return None
    heads, sq, sk, d = shape
    causal = bool(call.arg(ci, cname, False))
    cost = _side_by_side(q, k, v, heads, sq, sk, causal)
    if cost is None:
        cost = per_head(flash_attention_fwd, "flash_attention_fwd", heads, placeholder((sq, d), q.dtype),
                        placeholder((sk, d), k.dtype), placeholder((sk, d), v.dtype), causal=causal)
    return _with_mask(cost, call.arg(mi, mname))


def _interleaved(t: torch.Tensor) -> bool:
    """Whether ``t`` [B, H, S, D] keeps its heads side by side in each row (strides
    [., D, R, 1] with R >= H * D: a [B, S, H * D] projection viewed per head, or its
    slice of a fused q/k/v projection's wider rows); each row's H * D elements are then
    one DMA descriptor."""
    if t.dim() != 4:
        return False
    _, h, _, d = t.shape
    return t.stride(3) == 1 and t.stride(1) == d and t.stride(2) >= h * d


def _side_by_side(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pairs: int, sq: int, sk: int,
                  causal: bool) -> OpCost | None:
    """``flash_attention_heads`` over one physical core's ``pairs`` (batch, head) pairs,
    a batch entry's heads (or the core's share of them) per call; None where the heads
    do not lie side by side (:func:`_interleaved`), k and v have other head counts (grouped
    queries), or the rows do not fit the kernel's SBUF budget."""
    from trnsim.kernels.attention import HEADS_ROW_BYTES, flash_attention_heads, heads_row_bytes

    if not all(_interleaved(t) for t in (q, k, v)) or not q.shape[1] == k.shape[1] == v.shape[1]:
        return None
    # calls of h heads each, h dividing the core's pairs (3 batch entries of 4 heads over
    # two cores: 6 pairs, two calls of 3 heads) and at most a batch entry's heads
    h, d = max(n for n in range(1, min(q.shape[1], pairs) + 1) if pairs % n == 0), q.shape[-1]
    if heads_row_bytes(sq, sk, h * d, q.element_size()) > HEADS_ROW_BYTES:
        return None
    try:
        return run_kernel(flash_attention_heads, "flash_attention_heads", placeholder((sq, h * d), q.dtype),
                          placeholder((sk, h * d), k.dtype), placeholder((sk, h * d), v.dtype), heads=h,
                          causal=causal, repeat=pairs // h)
    except TrnSimError:
        return None   # the heads one at a time, then


def _attention_backward(call: Call) -> OpCost:
    """The fused attention backward, ``_scaled_dot_product_fused_attention_overrideable_backward``:
    ``flash_attention_bwd`` for every (batch, head), the heads overlapping
    (:func:`per_head`), with sequences padded to a multiple of 128 as in the forward; a
    mask adds its bytes over HBM bandwidth. Head dimensions over 128 (which the kernel
    refuses) take the estimate."""
    from trnsim.kernels.attention import flash_attention_bwd

    q, k, v, bias = (call.arg(i, n) for i, n in enumerate(("query", "key", "value", "attn_bias"), start=1))
    shape = _attention_shape(call, q, k, v)
    if shape is None:
        return None
    heads, sq, sk, d = shape
    cost = per_head(flash_attention_bwd, "flash_attention_bwd", heads, placeholder((sq, d), q.dtype),
                    placeholder((sk, d), k.dtype), placeholder((sk, d), v.dtype), placeholder((sq, d), q.dtype),
                    placeholder((sq, d), q.dtype), placeholder((sq,), torch.float32),
                    scale=call.arg(99, "scale"), causal=bool(call.arg(13, "is_causal", False)))
    return _with_mask(cost, bias)


# -- gather and scatter, losses, conv, movement, optimizers -----------------

def _embedding(call: Call) -> OpCost:
    flat = call.flat
    from trnsim.kernels.gather import embedding_kernel

    ts = _tensors(flat)
    table, idx = ts[0], ts[1]
    if table.dim() != 2:
        return None
    return run_kernel(embedding_kernel, "embedding_kernel", placeholder(table.shape, table.dtype),
                placeholder((call.shares.split(idx.numel()),), torch.int32))


def _index_select(call: Call) -> OpCost:
    from trnsim.kernels.gather import embedding_kernel

    ts = _tensors(list(call.args))
    x, idx = ts[0], ts[-1]
    dim = call.arg(1, "dim", 0)
    if x.dim() == 0:
        return None
    rows = x.shape[dim]
    d = max(x.numel() // max(rows, 1), 1)
    return run_kernel(embedding_kernel, "embedding_kernel", placeholder((max(rows, 1), d), x.dtype),
                placeholder((call.shares.split(idx.numel()),), torch.int32))


def _embedding_backward(call: Call) -> OpCost:
    """``embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
    scale_grad_by_freq)``: ``embedding_backward_kernel``, the physical cores each owning
    half the table's rows (half the memset) and taking, on average, half the scatter.
    ``scale_grad_by_freq`` (counting each index first) takes the estimate."""
    from trnsim.kernels.gather import embedding_backward_kernel

    grad, idx = call.arg(0, "grad_output"), call.arg(1, "indices")
    num_weights, padding_idx = int(call.arg(2, "num_weights")), int(call.arg(3, "padding_idx", -1))
    if call.arg(4, "scale_grad_by_freq", False) or grad.dim() == 0:
        return None
    d = grad.shape[-1]
    n = call.shares.split(idx.numel())
    table_rows = max(1, math.ceil(num_weights / lnc()))
    return run_kernel(embedding_backward_kernel, "embedding_backward_kernel", placeholder((n, d), grad.dtype),
                placeholder((n,), torch.int32), table_rows, padding_idx=padding_idx)


_REDUCTIONS = ("none", "mean", "sum")   # at::Reduction's order


def _nll_rows(x: torch.Tensor) -> tuple[int, int] | None:
    """``nll_loss``'s input [N, C] (or one row [C]) as (N, C); None for other shapes."""
    if x.dim() == 1:
        return 1, x.shape[0]
    return (x.shape[0], x.shape[1]) if x.dim() == 2 else None


def _nll_loss(call: Call) -> OpCost:
    """``nll_loss_forward(self, target, weight, reduction, ignore_index)``: ``nll_loss_kernel``
    on a share of the rows per physical core (adding the two cores' sums is left out)."""
    from trnsim.kernels.loss import nll_loss_kernel

    x, weight = call.arg(0, "self"), call.arg(2, "weight")
    shape = _nll_rows(x)
    if shape is None:
        return None
    n, c = call.shares.split(shape[0]), shape[1]
    reduction = _REDUCTIONS[int(call.arg(3, "reduction", 1))]
    return run_kernel(nll_loss_kernel, "nll_loss_kernel", placeholder((n, c), x.dtype), placeholder((n,), torch.int32),
                placeholder((c,), weight.dtype) if weight is not None else None, reduction=reduction,
                ignore_index=int(call.arg(4, "ignore_index", -100)))


def _nll_loss_backward(call: Call) -> OpCost:
    """``nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
    total_weight)``: ``nll_loss_backward_kernel`` on a share of the rows per physical core."""
    from trnsim.kernels.loss import nll_loss_backward_kernel

    grad, x, weight = call.arg(0, "grad_output"), call.arg(1, "self"), call.arg(3, "weight")
    shape = _nll_rows(x)
    if shape is None:
        return None
    n, c = call.shares.split(shape[0]), shape[1]
    reduction = _REDUCTIONS[int(call.arg(4, "reduction", 1))]
    return run_kernel(nll_loss_backward_kernel, "nll_loss_backward_kernel",
                placeholder((n,) if reduction == "none" else (), grad.dtype), placeholder((n, c), x.dtype),
                placeholder((n,), torch.int32),
                placeholder((c,), weight.dtype) if weight is not None else None,
                reduction=reduction, ignore_index=int(call.arg(5, "ignore_index", -100)),
                total_weight=placeholder((), x.dtype))


def _depthwise(x: torch.Tensor, w: torch.Tensor, groups: int) -> bool:
    """Whether a convolution of ``x`` by ``w`` in ``groups`` groups is depthwise: one
    input channel per group (each output channel reads one input channel)."""
    return groups == x.shape[1] and w.shape[1] == 1


def _depthwise_shares(call: Call, xs: tuple, ws: tuple) -> tuple[tuple, tuple]:
    """A depthwise convolution's shapes on one physical core: a share of the images, or
    with fewer images than cores a share of the channels (and of their filters)."""
    if xs[0] >= lnc():
        return (call.shares.split(xs[0]),) + xs[1:], ws
    c = call.shares.split(xs[1])
    return (xs[0], c) + xs[2:], (c * (ws[0] // xs[1]),) + ws[1:]


def _conv(call: Call) -> OpCost | None:
    """``convolution(input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups)``: ``conv2d_kernel`` (dilation 1); a depthwise convolution
    (one input channel per group) ``depthwise_conv2d_kernel``; another grouped one
    ``conv2d_kernel`` on one group's channels, once per group."""
    flat = call.flat
    from trnsim.kernels.conv import conv2d_kernel
    from trnsim.kernels.conv_depthwise import depthwise_conv2d_kernel

    ts = _tensors(flat)
    x, w = ts[0], ts[1]
    stride, padding, dilation = call.arg(3, "stride"), call.arg(4, "padding"), call.arg(5, "dilation")
    transposed, groups = call.arg(6, "transposed"), call.arg(8, "groups")
    if x.dim() != 4 or w.dim() != 4 or transposed:
        return None
    xs, ws = tuple(x.shape), tuple(w.shape)
    if groups != 1 and _depthwise(x, w, groups):
        xs, ws = _depthwise_shares(call, xs, ws)
        return run_kernel(depthwise_conv2d_kernel, "depthwise_conv2d_kernel", placeholder(xs, x.dtype),
                          placeholder(ws, w.dtype), stride=tuple(stride), padding=tuple(padding),
                          dilation=tuple(dilation))
    if any(dd != 1 for dd in dilation):
        return None
    xs, ws = (xs[0], xs[1] // groups) + xs[2:], (ws[0] // groups,) + ws[1:]   # one group's
    if xs[0] >= lnc():              # the physical cores take a share of the images each,
        xs = (call.shares.split(xs[0]),) + xs[1:]
    else:                            # or of the output channels
        ws = (call.shares.split(ws[0]),) + ws[1:]
    return run_kernel(conv2d_kernel, "conv2d_kernel", placeholder(xs, x.dtype), placeholder(ws, w.dtype),
                      stride=tuple(stride), padding=tuple(padding), repeat=groups)


def _conv_backward(call: Call) -> OpCost | None:
    """``convolution_backward(grad, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask)`` and the device's
    ``convolution_backward_overrideable`` (the same without ``bias_sizes``):
    ``conv2d_backward_kernel``, the physical cores each taking a share of the images
    (adding their weight gradients is left out); a batch of one runs on one core. A
    depthwise convolution takes ``depthwise_conv2d_backward_kernel`` (a share of the
    images, or of the channels with fewer images than cores); another grouped one
    ``conv2d_backward_kernel`` on one group's channels, once per group."""
    from trnsim.kernels.conv_backward import conv2d_backward_kernel
    from trnsim.kernels.conv_depthwise import depthwise_conv2d_backward_kernel

    skip = 0 if call.name.startswith("aten::convolution_backward_overrideable") else 1
    grad, x, w = call.arg(0, "grad_output"), call.arg(1, "input"), call.arg(2, "weight")
    stride, padding, dilation = (call.arg(i + skip, n) for i, n in ((3, "stride"), (4, "padding"), (5, "dilation")))
    transposed, groups = call.arg(6 + skip, "transposed"), call.arg(8 + skip, "groups")
    mask = list(call.arg(9 + skip, "output_mask"))
    if x.dim() != 4 or w.dim() != 4 or transposed or not any(mask):
        return None
    xs, gs, ws = tuple(x.shape), tuple(grad.shape), tuple(w.shape)
    needs = {"need_input": bool(mask[0]), "need_weight": bool(mask[1]), "need_bias": bool(mask[2])}
    if groups != 1 and _depthwise(x, w, groups):
        xs2, ws2 = _depthwise_shares(call, xs, ws)
        gs = (xs2[0], ws2[0]) + gs[2:]
        return run_kernel(depthwise_conv2d_backward_kernel, "depthwise_conv2d_backward_kernel",
                          placeholder(gs, grad.dtype), placeholder(xs2, x.dtype), placeholder(ws2, w.dtype),
                          stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation), **needs)
    if any(d != 1 for d in dilation):
        return None
    xs, gs, ws = (xs[0], xs[1] // groups) + xs[2:], (gs[0], gs[1] // groups) + gs[2:], (ws[0] // groups,) + ws[1:]
    if xs[0] >= lnc():
        xs, gs = call.shares.images(xs), call.shares.images(gs)
    return run_kernel(conv2d_backward_kernel, "conv2d_backward_kernel", placeholder(gs, grad.dtype),
                      placeholder(xs, x.dtype), placeholder(ws, w.dtype), stride=tuple(stride), padding=tuple(padding),
                      repeat=groups, **needs)


def _pool_args(call: Call, x: torch.Tensor, kernel: Any, stride: Any, padding: Any) -> tuple | None:
    """(the images share of ``x``'s shape, kernel, stride, padding) of a 2-D pooling of an
    NCHW ``x`` as the pooling kernels take them; None for other inputs."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.numel():
        return None
    return call.shares.images(x.shape), tuple(kernel), tuple(stride) if stride else None, tuple(padding)


def _max_pool(call: Call) -> OpCost | None:
    """``max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)``:
    ``maxpool2d_kernel`` on a share of the images per physical core; a dilation takes
    the estimate."""
    from trnsim.kernels.pool import maxpool2d_kernel

    x = call.arg(0, "self")
    if any(d != 1 for d in call.arg(4, "dilation", (1,))):
        return None
    pool = _pool_args(call, x, call.arg(1, "kernel_size"), call.arg(2, "stride", ()), call.arg(3, "padding", (0,)))
    if pool is None:
        return None
    shape, kernel, stride, padding = pool
    return run_kernel(maxpool2d_kernel, "maxpool2d_kernel", placeholder(shape, x.dtype), kernel, stride, padding,
                bool(call.arg(5, "ceil_mode", False)))


def _max_pool_backward(call: Call) -> OpCost | None:
    """``max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding,
    dilation, ceil_mode, indices)``: ``maxpool2d_backward_kernel`` on a share of the
    images per physical core."""
    from trnsim.kernels.pool import maxpool2d_backward_kernel

    grad, x = call.arg(0, "grad_output"), call.arg(1, "self")
    if any(d != 1 for d in call.arg(5, "dilation", (1,))):
        return None
    pool = _pool_args(call, x, call.arg(2, "kernel_size"), call.arg(3, "stride", ()), call.arg(4, "padding", (0,)))
    if pool is None:
        return None
    shape, kernel, stride, padding = pool
    g = call.shares.images(grad.shape)
    return run_kernel(maxpool2d_backward_kernel, "maxpool2d_backward_kernel", placeholder(g, grad.dtype),
                placeholder(g, torch.int32),
                placeholder(shape, x.dtype), kernel, stride, padding, bool(call.arg(6, "ceil_mode", False)))


def _one_window_clipped(shape: tuple, kernel: tuple, stride: tuple | None, padding: tuple,
                        ceil_mode: bool) -> tuple:
    """The pooling window for timing: along an axis with one output, a window longer than
    the padded input (HF EfficientNet's ``AvgPool2d(hidden_dim, ceil_mode=True)`` over a
    few pixels) reads what a window of the padded input's size reads, so it is timed as
    that one (whose tiles fit SBUF)."""
    from trnsim.kernels.pool import _out_size
    from trnsim.kernels.preconditions import int_pair

    name = "avg_pool2d"
    ks, ss = int_pair(kernel, "kernel_size", name), int_pair(stride if stride else kernel, "stride", name)
    ps = int_pair(padding, "padding", name)
    out = []
    for size, k, st, p in zip(shape[2:], ks, ss, ps):
        whole = size + 2 * p
        out.append(whole if k > whole and _out_size(size, k, st, p, ceil_mode) == 1 else k)
    return tuple(out)


def _avg_pool(call: Call) -> OpCost | None:
    """``avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
    divisor_override)`` and its backward (``grad_output`` first): ``avgpool2d_kernel``
    or ``avgpool2d_backward_kernel`` on a share of the images per physical core."""
    from trnsim.kernels.pool import avgpool2d_backward_kernel, avgpool2d_kernel

    back = op_base(call.name) == "avg_pool2d_backward"
    at = 1 if back else 0
    x = call.arg(at, "self")
    pool = _pool_args(call, x, call.arg(at + 1, "kernel_size"), call.arg(at + 2, "stride", ()),
                      call.arg(at + 3, "padding", (0,)))
    if pool is None:
        return None
    shape, kernel, stride, padding = pool
    ceil_mode = bool(call.arg(at + 4, "ceil_mode", False))
    kernel = _one_window_clipped(shape, kernel, stride, padding, ceil_mode)
    options = {"ceil_mode": ceil_mode,
               "count_include_pad": bool(call.arg(at + 5, "count_include_pad", True)),
               "divisor_override": call.arg(at + 6, "divisor_override")}
    if back:
        grad = call.arg(0, "grad_output")
        return run_kernel(avgpool2d_backward_kernel, "avgpool2d_backward_kernel",
                    placeholder(call.shares.images(grad.shape), grad.dtype),
                    placeholder(shape, x.dtype), kernel, stride, padding, **options)
    return run_kernel(avgpool2d_kernel, "avgpool2d_kernel", placeholder(shape, x.dtype), kernel, stride, padding, **options)


def _adaptive_avg_pool(call: Call) -> OpCost | None:
    """``_adaptive_avg_pool2d(self, output_size)`` and its backward ``(grad_output,
    self)``: where each output size divides the input's, the windows are an average
    pooling's (kernel and stride the ratio), timed by the average pooling kernels;
    windows of uneven sizes take the estimate."""
    from trnsim.kernels.pool import avgpool2d_backward_kernel, avgpool2d_kernel

    back = op_base(call.name) == "_adaptive_avg_pool2d_backward"
    x = call.arg(1 if back else 0, "self")
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.numel():
        return None
    out = tuple(call.arg(0, "grad_output").shape[2:]) if back else tuple(call.arg(1, "output_size"))
    (h, w), (oh, ow) = x.shape[2:], out
    if not oh or not ow or h % oh or w % ow:
        return None
    kernel = (h // oh, w // ow)
    shape = call.shares.images(x.shape)
    if back:
        grad = call.arg(0, "grad_output")
        return run_kernel(avgpool2d_backward_kernel, "avgpool2d_backward_kernel", placeholder(shape[:2] + (oh, ow), grad.dtype),
                    placeholder(shape, x.dtype), kernel)
    return run_kernel(avgpool2d_kernel, "avgpool2d_kernel", placeholder(shape, x.dtype), kernel)


def _cat(call: Call) -> OpCost:
    flat, out = call.flat, call.out
    from trnsim.kernels.movement import concat_kernel

    ts = [t for t in _tensors(flat) if t is not out and t.numel()]
    if not ts or not isinstance(out, torch.Tensor):
        return None
    dim = call.arg(1, "dim", 0) % out.dim()
    return run_kernel(concat_kernel, "concat_kernel", *[placeholder(t.shape, t.dtype) for t in ts], axis=dim)


def _upsample_nearest(call: Call) -> OpCost | None:
    """``upsample_nearest2d`` by whole factors (the VAE's and UNet's ``Upsample2D``)."""
    from trnsim.kernels.movement import upsample_nearest2d_kernel

    x, out = _tensors(call.flat)[0], call.out
    if x.dim() != 4 or not isinstance(out, torch.Tensor) or out.dim() != 4 or not x.numel():
        return None
    (h, w), (oh, ow) = x.shape[2:], out.shape[2:]
    if oh % h or ow % w:
        return None   # a fractional scale picks rows unevenly: the estimate times it
    images = call.shares.split(x.shape[0] * x.shape[1])   # the physical cores take a share of the images x channels
    return run_kernel(upsample_nearest2d_kernel, "upsample_nearest2d_kernel", placeholder((1, images, h, w), x.dtype),
                scale_h=oh // h, scale_w=ow // w)


def _clamp(call: Call) -> OpCost | None:
    """``clamp`` (``clamp_min``, ``clamp_max``, ``hardtanh``) with number bounds."""
    from trnsim.kernels.elementwise import clamp_kernel

    x = _tensors(call.flat)[0]
    base = op_base(call.name)
    if base == "clamp_min":
        lo, hi = call.arg(1, "min"), None
    elif base == "clamp_max":
        lo, hi = None, call.arg(1, "max")
    elif base == "hardtanh":
        lo, hi = call.arg(1, "min_val", -1.0), call.arg(2, "max_val", 1.0)
    else:
        lo, hi = call.arg(1, "min"), call.arg(2, "max")
    if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor) or (lo is None and hi is None):
        return None   # tensor bounds are a binary maximum and minimum: the estimate times them
    return run_kernel(clamp_kernel, "clamp_kernel", placeholder(call.shares.per_core(x.shape), x.dtype), lo=lo, hi=hi)


def _adamw(call: Call) -> OpCost:
    flat = call.flat
    from trnsim.kernels.elementwise import fused_adamw_kernel

    lists = [a for a in flat if isinstance(a, torch.Tensor)]
    params = [t for t in lists if t.is_floating_point() and t.dim() > 0]
    n = len(params) // 4 if len(params) >= 4 else 0
    if not n:
        return None
    ps = total = hbm = 0
    for p in params[:n]:
        c = _cost_cached(call, fused_adamw_kernel, "fused_adamw_kernel", p)
        ps += c.ps
        hbm += (c.hbm_moved() or 0) * p.numel() // max(1, math.prod(call.shares.per_core(p.shape)))  # c is one core's share
        total += 1
    return OpCost(ps=ps, source="kernel", kernel=f"fused_adamw_kernel x{total}", hbm_bytes=hbm)


_adam_memo: dict = {}


def _cost_cached(call: Call, kernel: Any, name: str, p: torch.Tensor) -> OpCost:
    key = (name, tuple(p.shape), p.dtype, state.chip().name)
    c = _adam_memo.get(key)
    if c is None:
        f = torch.float32
        part = call.shares.per_core(p.shape)
        c = _adam_memo[key] = run_kernel(kernel, name, placeholder(part, f), placeholder(part, f), placeholder(part, f),
                    placeholder(part, f))
    return c


# the ``_foreach_*`` ops timed as one elementwise kernel per tensor
FOREACH_OPS = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "exp", "sqrt", "neg", "reciprocal", "abs",
               "sigmoid", "tanh", "log")


def _foreach(call: Call) -> OpCost:
    """A ``_foreach_*`` op: one elementwise kernel per tensor of the first list."""
    cost_of = call.cost_of
    base = op_base(call.name).removeprefix("_foreach_").removesuffix("_")   # in-place forms too
    first = call.args[0] if call.args and isinstance(call.args[0], (list, tuple)) else []
    if not first:
        return None
    if base not in BINARY and base not in UNARY:
        return None
    name = f"aten::{base}.Tensor" if base in BINARY else f"aten::{base}"
    second = call.args[1] if len(call.args) > 1 else None
    others = second if isinstance(second, (list, tuple)) and second and isinstance(second[0], torch.Tensor) \
        else [1.0] * len(first)   # a list of tensors, or numbers: the scalar form
    ps = hbm = 0
    for t, o in zip(first, others):
        c = cost_of(name, (t, o) if base in BINARY else (t,), {}, t)
        ps += c.ps
        hbm += c.hbm_moved() or 0
    return OpCost(ps=ps, source="kernel", kernel=f"{base} x{len(first)}", hbm_bytes=hbm)


def _fill(call: Call) -> OpCost | None:
    """``fill_``, ``zero_``, ``full``: a memset tile stored over the result."""
    from trnsim.kernels.elementwise import fill_kernel

    out = call.out
    if not isinstance(out, torch.Tensor) or out.device.type != "neuron":
        return None
    return run_kernel(fill_kernel, "fill_kernel", call.shares.per_core(out.shape), value=0.0, dtype=chip_dtype(out.dtype))


def _isnan(call: Call) -> OpCost:
    """``isnan(x)`` is ``x != x``: one vector comparison per tile."""
    from trnsim.kernels.elementwise import binary_kernel

    x = call.args[0]
    part = call.shares.per_core(x.shape)
    return run_kernel(binary_kernel, "binary_kernel[not_equal]", placeholder(part, x.dtype), placeholder(part, x.dtype),
                op="not_equal")


def _cumsum(call: Call) -> OpCost | None:
    """``cumsum`` along the last axis (other axes take the estimate)."""
    from trnsim.kernels.elementwise import cumsum_kernel

    x = call.args[0]
    if x.dim() == 0 or call.arg(1, "dim") % x.dim() != x.dim() - 1:
        return None
    d = x.shape[-1]
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    return run_kernel(cumsum_kernel, "cumsum_kernel", placeholder((call.shares.split(max(x.numel() // max(d, 1), 1)), d), dtype))


def _foreach_norm(call: Call) -> OpCost | None:
    """``_foreach_norm``: one whole-tensor norm (a reduction) per tensor."""
    cost_of = call.cost_of
    tensors = call.args[0] if call.args and isinstance(call.args[0], (list, tuple)) else []
    if not tensors:
        return None
    ps = sum(cost_of("aten::linalg_vector_norm", (t,), {}, None).ps for t in tensors)
    return OpCost(ps=ps, source="kernel", kernel=f"reduce_kernel[sum] x{len(tensors)}")


def _pad(call: Call) -> OpCost | None:
    """``constant_pad_nd(self, pad, value)``: ``pad_kernel`` (a negative pad crops), the
    physical cores each taking a share of the leading axis where it is not padded."""
    from trnsim.kernels.movement import pad_kernel

    x, pads = call.arg(0, "self"), [int(p) for p in call.arg(1, "pad")]
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or len(pads) > 2 * x.dim() or not x.numel():
        return None
    shape = tuple(x.shape)
    if len(pads) < 2 * x.dim():   # the leading axis is not padded: the cores share it
        shape = call.shares.images(shape)
    return run_kernel(pad_kernel, "pad_kernel", placeholder(shape, x.dtype), tuple(pads),
                      value=float(call.arg(2, "value", 0.0) or 0.0))


def _dropout(call: Call) -> OpCost | None:
    """``native_dropout(input, p, train)`` when training: ``dropout_kernel`` on a share per
    physical core (not training, it is a copy: the estimate)."""
    from trnsim.kernels.elementwise import dropout_kernel

    x, p, train = call.arg(0, "input"), float(call.arg(1, "p")), call.arg(2, "train")
    if train is False or not 0.0 <= p < 1.0 or not x.numel():
        return None
    return run_kernel(dropout_kernel, "dropout_kernel", placeholder(call.shares.per_core(x.shape), x.dtype), p=p)


def _dropout_backward(call: Call) -> OpCost | None:
    """``native_dropout_backward(grad_output, mask, scale)``: ``dropout_backward_kernel``
    on a share per physical core."""
    from trnsim.kernels.elementwise import dropout_backward_kernel

    grad, mask = call.arg(0, "grad_output"), call.arg(1, "mask")
    if not grad.numel():
        return None
    part = call.shares.per_core(grad.shape)
    return run_kernel(dropout_backward_kernel, "dropout_backward_kernel", placeholder(part, grad.dtype),
                      placeholder(part, mask.dtype), scale=float(call.arg(2, "scale")))


#: bitwise and logical ops of two tensors: the vector engine's ALU op each runs as (on
#: bools, 0/1 bytes, the logical ops are the bitwise ones)
BITWISE = {"bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor",
           "logical_and": "bitwise_and", "logical_or": "bitwise_or", "logical_xor": "bitwise_xor"}
#: ops of one tensor that are one comparison with a number: (ALU op, the number)
COMPARE_WITH = {"logical_not": ("equal", 0.0), "isneginf": ("equal", -math.inf), "isposinf": ("equal", math.inf)}


def _bitwise(call: Call) -> OpCost | None:
    """A bitwise or logical op of two tensors (a number or a 0-d tensor as the second:
    ``tensor_scalar``): ``binary_kernel`` with the vector engine's bitwise ALU op, on a
    share per physical core; broadcasts as :func:`_binary` takes them."""
    from trnsim.kernels.elementwise import binary_kernel, scalar_kernel

    op = BITWISE[op_base(call.name)]
    ts = [t for t in _tensors(list(call.args)) if t.numel()]
    big = [t for t in ts if t.dim() > 0]
    if not big:
        return None
    if len(big) == 1:
        return run_kernel(scalar_kernel, f"scalar_kernel[{op}]", placeholder(call.shares.per_core(big[0].shape),
                                                                               big[0].dtype), op=op, value=1.0)
    a, b = big[0], big[1]
    if tuple(a.shape) != tuple(b.shape):
        return None
    part = call.shares.per_core(a.shape)
    return run_kernel(binary_kernel, f"binary_kernel[{op}]", placeholder(part, a.dtype), placeholder(part, b.dtype),
                      op=op)


def _compare_with(call: Call) -> OpCost | None:
    """``logical_not`` (``x == 0``), ``isneginf``/``isposinf`` (``x == -inf``/``inf``) and
    ``bitwise_not`` of bools (``logical_not``): one vector comparison per tile
    (``scalar_kernel``); ``bitwise_not`` of integers is an xor with -1."""
    from trnsim.kernels.elementwise import scalar_kernel

    x = call.arg(0, "self")
    if not isinstance(x, torch.Tensor) or not x.numel():
        return None
    base = op_base(call.name)
    if base == "bitwise_not":
        op, value = ("equal", 0.0) if x.dtype == torch.bool else ("bitwise_xor", -1.0)
    else:
        op, value = COMPARE_WITH[base]
    return run_kernel(scalar_kernel, f"scalar_kernel[{op}]", placeholder(call.shares.per_core(x.shape), x.dtype),
                      op=op, value=value, dtype="uint8" if x.dtype == torch.bool or base != "bitwise_not" else None)


def _copy(call: Call) -> OpCost | None:
    """A copy into a new tensor on the device (``lift_fresh_copy``, ``to`` within the
    device, ``copy(self, src)``, ``alias_copy``): ``cast_kernel`` from the source's dtype to
    the result's; a ``to`` that returns its input unchanged does nothing."""
    from trnsim.kernels.elementwise import cast_kernel

    out = call.out
    if any(out is a for a in call.args if isinstance(a, torch.Tensor)):
        return OpCost(ps=0, source="none")
    if op_base(call.name) != "copy":
        return _cast(call)
    src = call.arg(1, "src")
    if not isinstance(out, torch.Tensor) or not isinstance(src, torch.Tensor) or src.device.type != "neuron":
        return None
    return run_kernel(cast_kernel, "cast_kernel", placeholder(call.shares.per_core(out.shape), src.dtype),
                      dtype=chip_dtype(out.dtype))


def _slice_scatter(call: Call) -> OpCost | None:
    """``slice_scatter(self, src, dim, start, end, step)``: ``slice_scatter_kernel``, the
    base copied and the slice written by DMA (an empty slice: the copy alone)."""
    from trnsim.kernels.elementwise import cast_kernel
    from trnsim.kernels.movement import slice_scatter_kernel

    base, src = call.arg(0, "self"), call.arg(1, "src")
    if not base.numel():
        return None
    if not src.numel():   # an empty slice: the copy of the base alone
        return run_kernel(cast_kernel, "cast_kernel", placeholder(call.shares.per_core(base.shape), base.dtype),
                          dtype=chip_dtype(base.dtype))
    dim = int(call.arg(2, "dim", 0)) % base.dim()
    step = int(call.arg(5, "step", 1) or 1)
    size = base.shape[dim]
    start, end = (None if v is None else int(v) + size if int(v) < 0 else int(v)
                  for v in (call.arg(3, "start", None), call.arg(4, "end", None)))
    start = 0 if start is None else max(0, min(start, size))
    end = size if end is None else max(start, min(end, size))
    bs, ss = tuple(base.shape), tuple(src.shape)
    if dim != 0 and bs[0] == ss[0]:   # the physical cores share the leading axis
        share = call.shares.split(bs[0])
        bs, ss = (share,) + bs[1:], (share,) + ss[1:]
    return run_kernel(slice_scatter_kernel, "slice_scatter_kernel", placeholder(bs, base.dtype),
                      placeholder(ss, src.dtype), dim=dim, start=start, end=end, step=step)


def _where(call: Call) -> OpCost | None:
    """``where(condition, self, other)``: ``where_kernel`` over the result's shape (a
    broadcast operand timed at the result's size), a share per physical core."""
    from trnsim.kernels.elementwise import where_kernel

    out = call.out
    if not isinstance(out, torch.Tensor) or not out.numel():
        return None
    part = call.shares.per_core(out.shape)
    others = [call.arg(1, "self"), call.arg(2, "other")]
    dtypes = [t.dtype if isinstance(t, torch.Tensor) else out.dtype for t in others]
    return run_kernel(where_kernel, "where_kernel", placeholder(part, torch.bool), placeholder(part, dtypes[0]),
                      placeholder(part, dtypes[1]))


def _uniform(call: Call) -> OpCost | None:
    """``uniform_(self, from, to)`` and ``rand(size)``: ``uniform_kernel`` over the result,
    a share per physical core."""
    from trnsim.kernels.elementwise import uniform_kernel

    out = call.out if isinstance(call.out, torch.Tensor) else call.arg(0, "self")
    if not isinstance(out, torch.Tensor) or not out.numel() or not out.dtype.is_floating_point:
        return None
    low, high = (0.0, 1.0) if op_base(call.name) == "rand" else (float(call.arg(1, "from", 0.0)),
                                                                  float(call.arg(2, "to", 1.0)))
    return run_kernel(uniform_kernel, "uniform_kernel", call.shares.per_core(out.shape), low=low, high=high,
                      dtype=chip_dtype(out.dtype))


def _first_axis_index(call: Call) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """(self, the index, the values a row of ``self`` holds) of an advanced indexing
    ``self[index]`` by one nonempty integer tensor on the first axis (``index(self,
    [index])``, ``index_put(self, [index], values)``); None for any other indexing."""
    x, indices = call.arg(0, "self"), call.arg(1, "indices")
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or not isinstance(indices, (list, tuple)):
        return None
    if len(indices) != 1 or not isinstance(indices[0], torch.Tensor) or indices[0].dtype in (torch.bool, torch.uint8):
        return None
    if not indices[0].numel():
        return None
    return x, indices[0], max(x.numel() // max(x.shape[0], 1), 1)


def _index(call: Call) -> OpCost | None:
    """``index(self, [index])`` on the first axis by an integer tensor: a row gather
    (``embedding_kernel``), as ``index_select``; other indexing takes the estimate."""
    from trnsim.kernels.gather import embedding_kernel

    found = _first_axis_index(call)
    if found is None:
        return None
    x, idx, d = found
    return run_kernel(embedding_kernel, "embedding_kernel", placeholder((max(x.shape[0], 1), d), x.dtype),
                      placeholder((call.shares.split(idx.numel()),), torch.int32))


def _in_place(call: Call) -> bool:
    """Whether ``call`` is an in-place op (``index_put_``, ``scatter_``, ...): its name's
    base ends in an underscore, or it is ``_index_put_impl_``."""
    return call.name.removeprefix("aten::").split(".")[0].endswith("_")


def _scatter_rows(call: Call, x: torch.Tensor, rows: int, d: int, n: int) -> OpCost:
    """Writing ``n`` rows of ``d`` values into ``x`` (``rows`` rows) by index: the rows
    gathered, added to and scattered back (``embedding_backward_kernel`` over a table of
    the ``n`` rows alone: its memset is that small); out of place, ``x`` is copied first
    (``cast_kernel``), the two costs one after the other."""
    from trnsim.kernels.elementwise import cast_kernel
    from trnsim.kernels.gather import embedding_backward_kernel

    share = call.shares.split(n)
    scatter = run_kernel(embedding_backward_kernel, "embedding_backward_kernel", placeholder((share, d), x.dtype),
                         placeholder((share,), torch.int32), share)
    if _in_place(call):
        return scatter
    copy = run_kernel(cast_kernel, "cast_kernel", placeholder((max(1, math.ceil(rows / lnc())), d), x.dtype),
                      dtype=chip_dtype(x.dtype))
    return OpCost(ps=copy.ps + scatter.ps, source="kernel", kernel="cast_kernel + embedding_backward_kernel",
                  run=scatter.run, scale=scatter.scale, hbm_bytes=(copy.hbm_moved() or 0) + (scatter.hbm_moved() or 0),
                  call=scatter.call)


def _index_put(call: Call) -> OpCost | None:
    """``index_put(self, [index], values, accumulate)`` on the first axis by an integer
    tensor: the rows written (added, with ``accumulate``) by index; out of place after a
    copy of ``self`` (:func:`_scatter_rows`)."""
    found = _first_axis_index(call)
    if found is None:
        return None
    x, idx, d = found
    return _scatter_rows(call, x, x.shape[0], d, idx.numel())


def _view_backward(call: Call) -> OpCost | None:
    """``select_backward(grad, input_sizes, dim, index)`` and ``slice_backward(grad,
    input_sizes, dim, start, end, step)`` with step 1: zeros of the input's size around
    the gradient, ``pad_kernel`` along ``dim``."""
    from trnsim.kernels.movement import pad_kernel

    grad, sizes = call.arg(0, "grad_output"), [int(s) for s in call.arg(1, "input_sizes")]
    dim = int(call.arg(2, "dim")) % len(sizes)
    if op_base(call.name) == "select_backward":
        start = int(call.arg(3, "index")) % sizes[dim]
        end = start + 1
    else:
        if int(call.arg(5, "step", 1)) != 1:
            return None
        size = sizes[dim]
        start, end = (int(v) + size if int(v) < 0 else int(v) for v in (call.arg(3, "start"), call.arg(4, "end")))
        start, end = max(0, min(start, size)), max(0, min(end, size))
    inner = sizes[:dim] + [end - start] + sizes[dim + 1:]
    if not all(inner) or not grad.numel():
        return None
    if dim != 0:   # the physical cores share the leading axis
        inner[0] = call.shares.split(inner[0])
    pads = [0, 0] * (len(sizes) - 1 - dim) + [start, sizes[dim] - end]
    return run_kernel(pad_kernel, "pad_kernel", placeholder(inner, grad.dtype), tuple(pads), value=0.0)


def _rounding(call: Call) -> OpCost | None:
    """``floor``, ``ceil``, ``trunc`` of a float tensor: ``rounding_kernel``, a share per
    physical core (of integers they are copies: the estimate)."""
    from trnsim.kernels.elementwise import rounding_kernel

    x = call.arg(0, "self")
    if not isinstance(x, torch.Tensor) or not x.numel() or not x.dtype.is_floating_point:
        return None
    return run_kernel(rounding_kernel, f"rounding_kernel[{op_base(call.name)}]",
                      placeholder(call.shares.per_core(x.shape), x.dtype), op=op_base(call.name))


def _arange(call: Call) -> OpCost | None:
    """``arange`` into a device tensor of integers: ``arange_kernel`` (GpSimd iota)."""
    from trnsim.kernels.elementwise import arange_kernel

    out = call.out
    if not isinstance(out, torch.Tensor) or out.device.type != "neuron" or not out.numel() or out.dim() != 1:
        return None
    return run_kernel(arange_kernel, "arange_kernel", out.numel(), dtype=chip_dtype(out.dtype))


def _last_axis_rows(call: Call) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(self, index) of a ``gather``/``scatter`` along the last axis whose index picks
    values within each row of ``self`` (its shape but the last axis); None otherwise."""
    x, dim, idx = call.arg(0, "self"), call.arg(1, "dim"), call.arg(2, "index")
    if not isinstance(x, torch.Tensor) or not isinstance(idx, torch.Tensor) or x.dim() == 0 or not idx.numel():
        return None
    if int(dim) % x.dim() != x.dim() - 1 or tuple(idx.shape[:-1]) != tuple(x.shape[:-1]):
        return None
    return x, idx


def _gather(call: Call) -> OpCost | None:
    """``gather(self, -1, index)`` (a loss picking each row's target): one indirect DMA of
    the picked values, ``embedding_kernel`` over ``self`` seen as rows of one element."""
    from trnsim.kernels.gather import embedding_kernel

    found = _last_axis_rows(call)
    if found is None:
        return None
    x, idx = found
    return run_kernel(embedding_kernel, "embedding_kernel", placeholder((x.numel(), 1), x.dtype),
                      placeholder((call.shares.split(idx.numel()),), torch.int32))


def _scatter(call: Call) -> OpCost | None:
    """``scatter(self, -1, index, value or src)``: the picked values written by index
    into ``self`` seen as rows of one element; out of place after a copy of ``self``
    (:func:`_scatter_rows`)."""
    found = _last_axis_rows(call)
    if found is None:
        return None
    x, idx = found
    return _scatter_rows(call, x, x.numel(), 1, idx.numel())


def _as_strided_scatter(call: Call) -> OpCost | None:
    """``as_strided_scatter(self, src, size, stride, storage_offset)``: the copy of
    ``self`` and a DMA of ``src``'s elements into it (``slice_scatter_kernel`` on both
    seen flat: the write timed as one contiguous run, however the view strides)."""
    from trnsim.kernels.movement import slice_scatter_kernel

    base, src = call.arg(0, "self"), call.arg(1, "src")
    if not base.numel() or not src.numel() or src.numel() > base.numel():
        return None
    share = call.shares.split(base.numel())   # each physical core a share of both, flat
    part = max(1, math.ceil(src.numel() * share / base.numel()))
    return run_kernel(slice_scatter_kernel, "slice_scatter_kernel", placeholder((share,), base.dtype),
                      placeholder((part,), src.dtype), dim=0, start=0, end=part, step=1)
