"""What aten ops mean to the partitioner: which are free, which are steps of a fusion.

The tables map aten ops to :class:`trnsim.kernels.fused.Step` ops; :func:`elementwise`,
:func:`reduction` and :func:`composite` read a node as steps (softmax, log-softmax and
LayerNorm as several); :func:`constant` reads a tensor filled
with one number as that number; :func:`repeated_heads` finds the key/value head copies
of grouped-query attention; :func:`relu_after_norm` and :func:`relu_mask_before_norm`
find the ReLU that batch norm's kernels apply in the same pass.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten
prims = torch.ops.prims

UNARY = {aten.exp.default: "exp", aten.log.default: "log", aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt",
         aten.reciprocal.default: "reciprocal", aten.tanh.default: "tanh", aten.sigmoid.default: "sigmoid",
         aten.relu.default: "relu", aten.abs.default: "abs", aten.neg.default: "neg", aten.sin.default: "sin",
         aten.cos.default: "cos", aten.erf.default: "erf", aten.sign.default: "sign", aten.silu.default: "silu",
         aten.clone.default: "copy", aten._to_copy.default: "copy", prims.convert_element_type.default: "copy"}
BINARY = {aten.add.Tensor: "add", aten.add.Scalar: "add", aten.sub.Tensor: "subtract", aten.sub.Scalar: "subtract",
          aten.mul.Tensor: "multiply", aten.mul.Scalar: "multiply", aten.div.Tensor: "divide",
          aten.div.Scalar: "divide", aten.maximum.default: "maximum", aten.minimum.default: "minimum",
          aten.pow.Tensor_Scalar: "power", aten.pow.Tensor_Tensor: "power", aten.rsub.Scalar: "rsub"}
# comparisons give bool (1 where true, 0 where not): a fused kernel keeps them as 0/1 bytes
COMPARE = {getattr(getattr(aten, name), ov): op
           for name, op in (("le", "less_equal"), ("lt", "less"), ("ge", "greater_equal"), ("gt", "greater"),
                            ("eq", "equal"), ("ne", "not_equal")) for ov in ("Scalar", "Tensor")}
REDUCE = {aten.sum.dim_IntList: "sum", aten.amax.default: "max", aten.amin.default: "min", aten.mean.dim: "mean"}
MATMULS = (aten.mm.default, aten.addmm.default, aten.bmm.default)
# views, metadata and allocations: no device work (eager charges them nothing either)
FREE = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
                  aten.transpose.int, aten.t.default, aten.expand.default, aten.unsqueeze.default,
                  aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.slice.Tensor, aten.select.int,
                  aten.detach.default, aten.alias.default, aten.as_strided.default, aten.split.Tensor,
                  aten.split_with_sizes.default, aten.unbind.int, aten.empty.memory_format,
                  aten.empty_strided.default, aten.sym_size.int, operator.getitem})
# views that keep the [N, D] layout of a contiguous value: inside a fusion they are the same value
RESHAPES = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.alias.default,
                      aten.unsqueeze.default, aten.squeeze.dim, aten.detach.default})
CHIP_FLOATS = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
# what a fused step or operand may hold: the chip floats, and bool as 0/1 bytes
STEP_DTYPES = CHIP_FLOATS | {torch.bool: "uint8"}
ATTENTION = aten._scaled_dot_product_fused_attention_overrideable.default
# batch norm's forward ops (training, functional, eval), whose kernel can apply ReLU to what it writes
BATCH_NORMS = frozenset({aten._native_batch_norm_legit_functional.default, aten.native_batch_norm.default,
                         aten._native_batch_norm_legit_no_training.default, aten._native_batch_norm_legit.default,
                         aten._native_batch_norm_legit.no_stats})


def tensor_of(vals: dict[fx.Node, Any], x: Any) -> torch.Tensor | None:
    """The example tensor of node ``x`` (None for a number, a tuple, a non-node)."""
    v = vals.get(x) if isinstance(x, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def substituted(x: Any, vals: dict[fx.Node, Any]) -> Any:
    """``x`` (a node's argument: a node, a list, tuple or dict of them, or a constant) with
    every node replaced by its value in ``vals`` (None where it has none)."""
    if isinstance(x, fx.Node):
        return vals.get(x)
    if isinstance(x, (list, tuple)):
        return type(x)(substituted(y, vals) for y in x)
    if isinstance(x, dict):
        return {k: substituted(v, vals) for k, v in x.items()}
    return x


def chip_float(t: torch.Tensor | None) -> bool:
    """A non-empty device tensor of a chip float dtype and concrete shape."""
    return (t is not None and t.dtype in CHIP_FLOATS and t.numel() > 0 and t.device.type != "cpu"
            and all(isinstance(s, int) for s in t.shape))


def fusable_value(t: torch.Tensor | None) -> bool:
    """A device tensor a fused step may compute or read: a chip float, or a bool."""
    return chip_float(t) or (t is not None and t.dtype == torch.bool and t.numel() > 0 and t.device.type != "cpu"
                             and all(isinstance(s, int) for s in t.shape))


def tensors_in(x: Any) -> list[torch.Tensor]:
    """The tensors in ``x``: a tensor, or lists and tuples of them (and of other values)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in tensors_in(y)]
    return []


def collective(node: fx.Node) -> bool:
    """Whether ``node`` is a functional collective or its wait (``_c10d_functional``), or
    DTensor's shard-to-shard all-to-all: DTensor and tensor parallel put them in compiled
    graphs. The process group times them on the collectives queue when the graph runs,
    so no compute kernel is charged."""
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and (t.namespace == "_c10d_functional"
                                                     or t.name() == "_dtensor::shard_dim_alltoall")


def on_host(node: fx.Node, vals: dict[fx.Node, Any]) -> bool:
    """Whether ``node`` only reads and makes CPU tensors (work the host does, not the chip)."""
    made = tensors_in(vals.get(node))
    read = [t for a in node.all_input_nodes for t in tensors_in(vals.get(a))]
    return bool(made) and all(t.device.type == "cpu" for t in made + read)


def mutates(node: fx.Node) -> bool:
    """Whether ``node`` writes to one of its arguments (``copy_``, ``index_put_``, ...)."""
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable


def op_name(node: fx.Node) -> str:
    """``aten::add.Tensor`` style name of a node's target."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.name()
    return getattr(target, "__name__", str(target))


def rows_of(shape: Any) -> tuple[int, int]:
    """``shape`` as [N, D]: the product of the leading dimensions and the last one."""
    shape = tuple(int(s) for s in shape)
    return (math.prod(shape[:-1]), shape[-1]) if shape else (1, 1)


def elementwise(node: fx.Node) -> tuple[str, list[Any]] | None:
    """(step op, step arguments) of an elementwise aten node, or None."""
    t = node.target
    a = list(node.args)
    if t == aten.gelu.default:
        return ("gelu_tanh" if node.kwargs.get("approximate", "none") == "tanh" else "gelu"), a[:1]
    if t in UNARY:
        if t == aten._to_copy.default and set(node.kwargs) - {"dtype"}:
            return None   # a device or layout change, not a cast
        return UNARY[t], a[:1]
    if t in BINARY:
        if node.kwargs.get("alpha", 1) != 1:
            return None
        if BINARY[t] == "power" and isinstance(a[1], (int, float)) and a[1] == 2:
            return "square", a[:1]
        return BINARY[t], a[:2]
    if t == aten.where.self:
        return "where", a[:3]
    if t in COMPARE:
        return COMPARE[t], a[:2]
    return None


# ops that make a tensor from their arguments' numbers alone
MAKERS = frozenset({aten.full.default, aten.scalar_tensor.default, aten.arange.default, aten.arange.start,
                    aten.arange.start_step, aten.zeros.default, aten.ones.default})


def folded(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes whose values are known when compiling: tensors made from numbers
    (``full``, ``arange``, ...) and what views, elementwise ops and comparisons make of
    them alone. The compiler computes them once and keeps them with the program, so
    they cost no device time; kernels read them as operands (or as numbers, see
    :func:`constant`)."""
    known: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or mutates(node):
            continue
        if node.target in MAKERS and not any(isinstance(a, fx.Node) for a in node.all_input_nodes):
            known.add(node)
        elif node.all_input_nodes and all(a in known for a in node.all_input_nodes) and (
                node.target in FREE or elementwise(node) is not None):
            known.add(node)
    return known


def constant(node: fx.Node, vals: dict[fx.Node, Any]) -> float | None:
    """The number a ``full`` or ``scalar_tensor`` node fills its chip-float tensor with
    (a fused kernel takes it as a constant), else None."""
    if node.target not in (aten.full.default, aten.scalar_tensor.default) or not chip_float(tensor_of(vals, node)):
        return None
    value = node.args[1] if node.target == aten.full.default else node.args[0]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def reduction(node: fx.Node, vals: dict[fx.Node, Any]) -> tuple[str, tuple[int, ...]] | None:
    """(step op, the axes it reduces, sorted) of a reduction over some of its input's
    axes (keeping them or not), or None."""
    if node.target not in REDUCE or node.kwargs.get("dtype") is not None:
        return None
    x, out = tensor_of(vals, node.args[0]), tensor_of(vals, node)
    if not chip_float(x) or not chip_float(out) or x.dim() == 0:
        return None
    dims = node.args[1] if len(node.args) > 1 else None
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if not isinstance(dims, (list, tuple)) or not dims or not all(isinstance(i, int) for i in dims) \
            or not isinstance(keep, bool):
        return None
    axes = tuple(sorted({i % x.dim() for i in dims}))
    return (REDUCE[node.target], axes) if len(axes) == len(dims) else None


def composite(node: fx.Node, vals: dict[fx.Node, Any]) -> tuple[list, list[int] | None, tuple[int, ...]] | None:
    """The steps of softmax, log-softmax or LayerNorm over the last axis:
    ``(spec, parts, axes)``, each spec entry ``(op, args, per_row, dtype)`` whose args
    are node arguments, numbers or ``("local", i)`` (entry i); ``parts`` the entries a
    tuple result is made of (None: the last entry is the value); ``axes`` those the
    steps reduce. None for other nodes."""
    x = tensor_of(vals, node.args[0]) if node.args else None
    if not chip_float(x) or x.dim() == 0:
        return None
    f32, last = torch.float32, x.dim() - 1
    L = lambda i: ("local", i)   # noqa: E731
    if node.target in (aten._softmax.default, aten._log_softmax.default):
        out = tensor_of(vals, node)
        if node.args[1] % x.dim() != last or not chip_float(out):
            return None
        spec = [("max", [node.args[0]], True, f32), ("subtract", [node.args[0], L(0)], False, f32),
                ("exp", [L(1)], False, f32), ("sum", [L(2)], True, f32)]
        if node.target == aten._softmax.default:
            spec.append(("divide", [L(2), L(3)], False, out.dtype))
        else:
            spec += [("log", [L(3)], True, f32), ("subtract", [L(1), L(4)], False, out.dtype)]
        return spec, None, (last,)
    if node.target == aten.native_layer_norm.default:
        shape, weight, bias, eps = node.args[1], node.args[2], node.args[3], node.args[4]
        outs = vals.get(node)
        if list(shape) != [x.shape[-1]] or not isinstance(outs, (tuple, list)) or \
                not all(chip_float(t) for t in outs):
            return None
        spec = [("mean", [node.args[0]], True, f32), ("subtract", [node.args[0], L(0)], False, f32),
                ("square", [L(1)], False, f32), ("mean", [L(2)], True, f32), ("add", [L(3), float(eps)], True, f32),
                ("rsqrt", [L(4)], True, f32), ("multiply", [L(1), L(5)], False, f32)]
        if weight is not None:
            spec.append(("multiply", [L(len(spec) - 1), weight], False, f32))
        if bias is not None:
            spec.append(("add", [L(len(spec) - 1), bias], False, f32))
        # the three results: the normalized rows, the mean and the reciprocal deviation, in their dtypes
        spec[-1] = spec[-1][:3] + (outs[0].dtype,)
        spec[0] = spec[0][:3] + (outs[1].dtype,)
        spec[5] = spec[5][:3] + (outs[2].dtype,)
        return spec, [len(spec) - 1, 0, 5], (last,)
    return None


def repeated_heads(attention: fx.Node, kv: Any, vals: dict[fx.Node, Any]) -> tuple[fx.Node, int] | None:
    """(the copy, the repeat count) where ``kv``, an attention key or value, is its heads
    repeated for grouped-query attention, ``view(clone(expand(unsqueeze(x, 2))))`` as
    ``repeat_kv`` and ``repeat_interleave`` write it, used by nothing else; else None."""
    if not isinstance(kv, fx.Node) or kv.target not in (aten.view.default, aten._unsafe_view.default,
                                                        aten.reshape.default):
        return None
    copy = kv.args[0]
    if not isinstance(copy, fx.Node) or copy.target != aten.clone.default or set(copy.users) != {kv} \
            or set(kv.users) != {attention}:
        return None
    expand = copy.args[0]
    if not isinstance(expand, fx.Node) or expand.target != aten.expand.default:
        return None
    source, shape = vals.get(expand.args[0]), vals.get(expand)
    if not isinstance(source, torch.Tensor) or not isinstance(shape, torch.Tensor) or source.dim() != 5 \
            or source.shape[2] != 1 or shape.shape[2] <= 1:
        return None
    return copy, int(shape.shape[2])


def relu_after_norm(node: fx.Node, vals: dict[fx.Node, Any]) -> tuple[fx.Node, fx.Node] | None:
    """``(y, relu)`` where ``node`` is batch norm's forward (:data:`BATCH_NORMS`) whose
    normalized result ``y`` (its first item) is read by one ReLU and nothing else: the
    batch-norm kernel applies the ReLU as it writes ``y``, which is never stored. Else None."""
    if node.target not in BATCH_NORMS:
        return None
    firsts = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
    if len(firsts) != 1 or len(firsts[0].users) != 1:
        return None
    relu = next(iter(firsts[0].users))
    x = tensor_of(vals, node.args[0])
    if relu.target != aten.relu.default or not chip_float(x) or x.dim() < 2:
        return None
    return firsts[0], relu


def relu_mask_before_norm(node: fx.Node, vals: dict[fx.Node, Any]) -> tuple[list[fx.Node], fx.Node, Any] | None:
    """``(nodes, relu_out, grad)`` where ``node`` is ``native_batch_norm_backward`` whose
    gradient is ReLU's backward, read by nothing else: ``threshold_backward(grad,
    relu_out, 0)`` or its decomposition ``where(le(relu_out, 0), 0, grad)`` (``nodes``).
    The backward kernel masks ``grad`` by ``relu_out > 0`` as it reads it, so the masked
    gradient is never stored. Else None."""
    if node.target != aten.native_batch_norm_backward.default or not node.args:
        return None
    masked = node.args[0]
    if not isinstance(masked, fx.Node) or set(masked.users) != {node}:
        return None
    if masked.target == aten.threshold_backward.default and masked.args[2] == 0:
        nodes, grad, relu_out = [masked], masked.args[0], masked.args[1]
    elif masked.target == aten.where.self:
        cond, zero, grad = masked.args
        if not (isinstance(cond, fx.Node) and cond.target == aten.le.Scalar and cond.args[1] == 0
                and set(cond.users) == {masked}):
            return None
        if not (zero == 0 if isinstance(zero, (int, float)) else constant(zero, vals) == 0.0):
            return None
        nodes, relu_out = [cond, masked], cond.args[0]
    else:
        return None
    x, r, g = (tensor_of(vals, a) for a in (node.args[1], relu_out, grad))
    if not (chip_float(x) and chip_float(r) and chip_float(g) and x.dim() >= 2
            and tuple(r.shape) == tuple(g.shape) == tuple(x.shape)):
        return None
    return nodes, relu_out, grad
