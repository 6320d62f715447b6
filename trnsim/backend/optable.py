"""The lowering table: each aten op that a kernel runs, written once, with its timing
lowering (:mod:`trnsim.backend.opkernels`: the kernel traced on placeholders of one
physical core's share) and, where instruction fidelity computes the op with that kernel,
its value lowering (:mod:`trnsim.backend.lower_values`: the same kernel on the op's
values, laid out as the timing lowering lays them out).

An entry's names are its op's overloads; an op family whose value lowering takes fewer
of them than its timing lowering lists the rest in an entry of its own with no value
lowering, so the two can never disagree by omission. :data:`KERNEL_OPS` (eager timing,
compiled graphs) and :data:`INSTRUCTION_OPS` (instruction fidelity) are views of it;
:func:`kernel_cost` times a call with it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from trnsim.backend import flextiming, lower_values as values
from trnsim.backend import opkernels as time
from trnsim.backend.lowering import BINARY, UNARY, Call
from trnsim.backend.opcost import OpCost
from trnsim.errors import TrnSimError


@dataclass(frozen=True)
class Lowering:
    """How a kernel runs one aten op: ``time`` gives its cost (a :class:`OpCost`, or None
    where the kernel does not take the call), ``values`` its kernel run on real values
    (a :class:`trnsim.backend.lower_values.Launch`, or None); None: the op's values
    always come from PyTorch's CPU kernel."""

    time: Callable[[Call], OpCost | None]
    values: Callable[[Call], Any] | None = None


def _aten(*names: str) -> list[str]:
    return [f"aten::{n}" for n in names]


def _unary_names() -> list[str]:
    return _aten(*(n for u in UNARY for n in (u, f"{u}_", f"{u}.out")))


_BINARY_OVERLOADS = ("Tensor", "Scalar", "out", "Tensor_out", "Scalar_out", "Tensor_Tensor", "Tensor_Scalar",
                     "Tensor_Tensor_out", "Tensor_Scalar_out")


def _binary_names(overloads: Iterable[str]) -> list[str]:
    names = []
    for b in BINARY:
        for ov in overloads:
            names += [f"aten::{b}.{ov}", f"aten::{b}_.{ov}"]
    return names


def _reduce_names(bases: Iterable[str], overloads: Iterable[str]) -> list[str]:
    return [f"aten::{r}{ov}" for r in bases for ov in overloads]


_REDUCE_OVERLOADS = ("", ".dim_IntList", ".default", ".dim", ".correction", ".out", ".IntList_out", ".dims")
# the reductions instruction fidelity computes, and the overloads its lowering reads
_REDUCE_VALUES = {"sum": ("", ".dim_IntList", ".IntList_out"), "mean": ("", ".dim", ".out"),
                  "amax": ("", ".out"), "amin": ("", ".out"), "max": ("",), "min": ("",)}
_REDUCE_TIME_ONLY = ("argmax", "argmin", "prod", "logsumexp", "any", "all", "var", "std", "linalg_vector_norm", "norm")


def _entries() -> list[tuple[list[str], Lowering]]:
    """The table, family by family: (names, lowering)."""
    e: list[tuple[list[str], Lowering]] = [
        (_aten("mm", "mm.out", "addmm", "addmm.out", "addmm_"), Lowering(time._mm, values._matmul)),
        (_aten("_addmm_activation"), Lowering(time._mm)),
        (_aten("bmm", "bmm.out", "baddbmm", "baddbmm_", "baddbmm.out"), Lowering(time._bmm, values._matmul)),
        (_aten("mv", "mv.out", "addmv", "addmv_", "addmv.out"), Lowering(time._mv, values._matmul)),
        (_aten("_grouped_mm"), Lowering(time._grouped_mm)),
        (_unary_names(), Lowering(time._unary, values._unary)),
        (_binary_names(_BINARY_OVERLOADS) + _aten(*BINARY), Lowering(time._binary, values._binary)),
        (_binary_names(("Self",)), Lowering(time._binary)),
        (_aten("_to_copy", "clone"), Lowering(time._cast, values._cast)),
        (_aten("copy_", "_copy_from"), Lowering(time._cast)),   # dispatch copies these itself
        ([f"aten::{r}{ov}" for r, ovs in _REDUCE_VALUES.items() for ov in ovs], Lowering(time._reduce, values._reduce)),
        ([n for r, ovs in _REDUCE_VALUES.items() for n in _reduce_names((r,), _REDUCE_OVERLOADS)
          if n.removeprefix(f"aten::{r}") not in ovs] + _reduce_names(_REDUCE_TIME_ONLY, _REDUCE_OVERLOADS),
         Lowering(time._reduce)),
        (_aten("_softmax", "_log_softmax", "_softmax.out", "_log_softmax.out"), Lowering(time._softmax, values._softmax)),
        (_aten("softmax.int", "log_softmax.int"), Lowering(time._softmax)),
        (_aten("native_layer_norm"), Lowering(time._layer_norm, values._layer_norm)),
        (_aten(*time._ACTIVATION_BACKWARD) + _aten(*(f"{n}.grad_input" for n in time._ACTIVATION_BACKWARD)),
         Lowering(time._activation_backward)),
        (_aten("_softmax_backward_data", "_softmax_backward_data.out", "_log_softmax_backward_data",
               "_log_softmax_backward_data.out"), Lowering(time._softmax_backward)),
        (_aten("native_layer_norm_backward", "native_layer_norm_backward.out"), Lowering(time._layer_norm_backward)),
        (_aten("_fused_rms_norm"), Lowering(time._rms_norm, values._rms_norm)),
        (_aten("native_group_norm"), Lowering(time._group_norm, values._group_norm)),
        (_aten("native_group_norm_backward", "native_group_norm_backward.out"), Lowering(time._group_norm_backward)),
        (_aten(*(n for n in time._BATCH_NORM if n in values._BATCH_NORM)), Lowering(time._batch_norm, values._batch_norm)),
        (_aten(*(n for n in time._BATCH_NORM if n not in values._BATCH_NORM)), Lowering(time._batch_norm)),
        (_aten("native_batch_norm_backward", "native_batch_norm_backward.out"), Lowering(time._batch_norm_backward)),
        (_aten("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
               "_scaled_dot_product_fused_attention_overrideable"), Lowering(time._attention)),
        (_aten("_scaled_dot_product_fused_attention_overrideable_backward"), Lowering(time._attention_backward)),
        # FlexAttention's higher-order ops
        (["flex_attention"], Lowering(flextiming.forward_cost)),
        (["flex_attention_backward"], Lowering(flextiming.backward_cost)),
        (_aten("embedding"), Lowering(time._embedding, values._embedding)),
        (_aten("index_select", "index_select.out"), Lowering(time._index_select, values._index_select)),
        (_aten("embedding_dense_backward", "embedding_dense_backward.out"), Lowering(time._embedding_backward)),
        (_aten("nll_loss_forward", "nll_loss_forward.output"), Lowering(time._nll_loss)),
        (_aten("nll_loss_backward", "nll_loss_backward.grad_input"), Lowering(time._nll_loss_backward)),
        (_aten("convolution_overrideable"), Lowering(time._conv, values._conv)),
        (_aten("convolution", "_convolution"), Lowering(time._conv)),
        (_aten("convolution_backward_overrideable", "convolution_backward", "convolution_backward.out"),
         Lowering(time._conv_backward)),
        (_aten("max_pool2d_with_indices", "max_pool2d_with_indices.out"), Lowering(time._max_pool)),
        (_aten("max_pool2d_with_indices_backward", "max_pool2d_with_indices_backward.grad_input"),
         Lowering(time._max_pool_backward)),
        (_aten("avg_pool2d", "avg_pool2d.out", "avg_pool2d_backward", "avg_pool2d_backward.grad_input"),
         Lowering(time._avg_pool)),
        (_aten("_adaptive_avg_pool2d", "_adaptive_avg_pool2d.out", "_adaptive_avg_pool2d_backward",
               "_adaptive_avg_pool2d_backward.out"), Lowering(time._adaptive_avg_pool)),
        (_aten("cat", "cat.out"), Lowering(time._cat, values._cat)),
        (_aten("_cat"), Lowering(time._cat)),
        (_aten("upsample_nearest2d", "upsample_nearest2d.vec", "upsample_nearest2d.out"),
         Lowering(time._upsample_nearest)),
        (_aten("clamp", "clamp_", "clamp.out", "clamp_min", "clamp_min_", "clamp_min.out", "clamp_max", "clamp_max_",
               "clamp_max.out", "hardtanh", "hardtanh_", "hardtanh.out"), Lowering(time._clamp)),
        (_aten("_fused_adamw_", "_fused_adamw_.tensor_lr", "_fused_adam_", "_fused_adam_.tensor_lr"),
         Lowering(time._adamw)),
        ([f"aten::_foreach_{op}{sep}{ov}" for op in time.FOREACH_OPS for sep in ("", "_")
          for ov in ("", ".List", ".Scalar", ".ScalarList", ".Tensor")], Lowering(time._foreach)),
        (_aten("fill_.Scalar", "fill.Scalar", "zero_", "full", "full.out"), Lowering(time._fill)),
        (_aten("isnan", "isnan.out"), Lowering(time._isnan)),
        (_aten("cumsum", "cumsum_", "cumsum.out"), Lowering(time._cumsum)),
        (_aten("constant_pad_nd", "constant_pad_nd.out"), Lowering(time._pad)),
        (_aten(*(f"{b}{ov}" for b in time.BITWISE for ov in ("", "_", ".Tensor", ".Scalar", "_.Tensor", "_.Scalar",
                                                              ".Tensor_out", ".Scalar_out", ".out"))),
         Lowering(time._bitwise)),
        (_aten(*(f"{b}{ov}" for b in (*time.COMPARE_WITH, "bitwise_not") for ov in ("", "_", ".out"))),
         Lowering(time._compare_with)),
        (_aten("full_like", "zeros_like", "ones_like", "new_full", "new_zeros", "new_ones"), Lowering(time._fill)),
        (_aten("lift_fresh_copy", "to.device", "to.dtype", "to.dtype_layout", "copy", "alias_copy"),
         Lowering(time._copy)),
        (_aten("slice_scatter", "slice_scatter.out"), Lowering(time._slice_scatter)),
        (_aten("as_strided_scatter", "as_strided_scatter.out"), Lowering(time._as_strided_scatter)),
        (_aten("where.self", "where.self_out", "where.ScalarOther", "where.ScalarSelf", "where.Scalar"),
         Lowering(time._where)),
        (_aten("uniform_", "uniform", "uniform.out", "rand", "rand.out"), Lowering(time._uniform)),
        (_aten("index.Tensor", "index.Tensor_out"), Lowering(time._index)),
        (_aten("index_put", "index_put_", "_index_put_impl_", "index_put.out", "_index_put_impl"),
         Lowering(time._index_put)),
        (_aten("select_backward", "select_backward.out", "slice_backward", "slice_backward.out"),
         Lowering(time._view_backward)),
        (_aten(*(f"{r}{ov}" for r in ("floor", "ceil", "trunc") for ov in ("", "_", ".out"))), Lowering(time._rounding)),
        (_aten("arange.start_out", "arange.out"), Lowering(time._arange)),
        (_aten("gather", "gather.out"), Lowering(time._gather)),
        (_aten("scatter.value", "scatter.src", "scatter_.value", "scatter_.src", "scatter.value_out",
               "scatter.src_out"), Lowering(time._scatter)),
        (_aten("native_dropout", "native_dropout.out"), Lowering(time._dropout)),
        (_aten("native_dropout_backward", "native_dropout_backward.out"), Lowering(time._dropout_backward)),
        (_aten("_foreach_norm.Scalar", "_foreach_norm.Scalar_out"), Lowering(time._foreach_norm)),
    ]
    return e


def _table() -> dict[str, Lowering]:
    table: dict[str, Lowering] = {}
    for names, lowering in _entries():
        for name in names:
            if name in table:
                raise AssertionError(f"the lowering table lists {name} twice")
            table[name] = lowering
    return table


#: every aten op a kernel runs, by its qualified overload name
LOWERINGS: dict[str, Lowering] = _table()
#: the timing lowerings (eager ops, compiled graphs)
KERNEL_OPS: dict[str, Callable[[Call], OpCost | None]] = {n: lw.time for n, lw in LOWERINGS.items()}
#: the value lowerings (instruction fidelity)
INSTRUCTION_OPS: dict[str, Callable[[Call], Any]] = {n: lw.values for n, lw in LOWERINGS.items()
                                                     if lw.values is not None}
# ops whose kernel applies a ReLU in the same pass, as compiled graphs fuse it: batch
# norm's forward (after it) and backward (ReLU's backward before it)
WITH_RELU: dict[str, Callable[[Call], OpCost | None]] = {
    **{name: functools.partial(KERNEL_OPS[name], relu=True) for name in KERNEL_OPS if KERNEL_OPS[name] is time._batch_norm},
    "aten::native_batch_norm_backward": functools.partial(time._batch_norm_backward, relu=True)}


def kernel_cost(call: Call, relu: bool = False) -> OpCost | None:
    """The kernel-simulated cost of ``call``, or None where no kernel applies; ``relu``:
    of its kernel with a ReLU in the same pass (the ops of :data:`WITH_RELU`).

    A kernel refuses a shape it does not take with a :class:`trnsim.errors.TrnSimError`
    (an empty tensor, an SBUF that cannot hold its tiles): the estimate times that op.
    Any other exception is a bug in the kernel or its lowering and is raised."""
    fn = (WITH_RELU if relu else KERNEL_OPS).get(call.name)
    if fn is None:
        return None
    try:
        cost = fn(call)
    except TrnSimError:
        return None
    cores = call.shares.factor
    if cost is not None and cost.run is not None and cores != 1:
        cost = dataclasses.replace(cost, cores=cores)
    return cost
