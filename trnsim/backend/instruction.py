"""Instruction fidelity: an op's result computed by its kernel, instruction by instruction.

Under ``TRNSIM_FIDELITY=instruction`` the dispatch fallback asks :func:`run` for each op
before it runs PyTorch's CPU kernel. Where :data:`INSTRUCTION_OPS` has an adapter, the
op's kernel from :mod:`trnsim.kernels` (the one :mod:`trnsim.backend.opkernels` times the
op with) is traced on the op's real input data, laid out as the timing path lays it
out (``mm``'s left operand transposed to [K, M], leading dimensions flattened, the
reduced or softmax axis moved last), and simulated with ``fidelity="instruction"``:
bf16/fp8 inputs are rounded as HBM stores them, matmuls accumulate in fp32 PSUM,
activations follow the chip's definitions. The kernel's outputs become the aten
result: a new contiguous neuron tensor, or a copy into the ``out=`` or in-place
destination.

An adapter returns None, and the op keeps PyTorch's CPU numerics, where the kernel
does not take the op as called: dtypes the chip lacks (int64, float64, bool, complex)
or mixed ones, an ``alpha`` other than 1, broadcasts the timing path does not model,
matmuls so large that op fidelity times a slice of them, empty tensors. Ops with no
adapter at all (every op outside the table) also keep the CPU numerics.

What is not the kernel's: the bias of ``addmm``/``baddbmm``/``addmv`` and of a
convolution, and ``alpha``/``beta``, are applied to the kernel's rounded product in
fp32 and rounded to the result dtype once more (as a separate vector-engine add
would); the statistics that ``native_layer_norm``, ``native_group_norm``, batch
norm and ``_fused_rms_norm`` also return (mean, rstd, for the backward) come from the
CPU kernel, which also updates batch norm's running statistics. The op's simulated
time is op fidelity's: the kernel Program traced for the same shapes and dtypes, which is
the Program run here where a logical core is one physical core (trn1, trn3; on trn2,
LNC=2, op fidelity times each physical core's share while the data run here computes
the whole op) (a gather is the exception:
:func:`trnsim.kernels.gather.embedding_kernel` copies the right rows only when it
knows the index values, one DMA per row, so its data run is a different Program from
the timing model's).

In eager mode PyTorch hands the device casts and clones as ``copy_`` (which dispatch
handles itself, so they keep the CPU's rounding), and breaks ``layer_norm``,
``rms_norm``, ``group_norm`` and ``embedding`` into smaller ops before the fallback
sees them; the adapters for the whole ops serve callers that do pass them whole.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from trnsim.backend import state, storage
from trnsim.backend.lower_values import Launch, batch_norm_with_relu
from trnsim.backend.lowering import Call
from trnsim.backend.optable import INSTRUCTION_OPS

__all__ = ["Launch", "batch_norm_with_relu", "execute", "plan", "run"]



def run(op: Any, info: Any, host: Any, args: tuple, kwargs: dict) -> Any:
    """The result of op ``info`` on neuron tensors computed by its kernel at instruction
    fidelity (neuron tensors, or the ``out=``/in-place destination), or None where no
    kernel applies and the CPU kernel should run. ``host`` is the fallback's
    :class:`trnsim.backend.dispatch._Host` of the call: its arguments as CPU aliases."""
    if INSTRUCTION_OPS.get(info.name) is None or _shares_memory(info, host) or _refused(op, host):
        return None
    launch = plan(Call(info.name, tuple(host.args), host.kwargs, list(host.args), None))
    if launch is None:
        return None
    result, _ = execute(launch)
    return _place(result, info, args, kwargs)


def _refused(op: Any, host: Any) -> bool:
    """Whether PyTorch's own checks refuse the call (a dim out of range, shapes that do
    not broadcast): the op runs on meta tensors of the arguments' shapes, strides and
    dtypes. A refused call goes to the CPU kernel, which raises the CPU's error, so no
    adapter has to repeat PyTorch's checks. Ops without a meta kernel are not refused."""
    meta_args, meta_kwargs = tree_map(storage.meta_like, (host.args, host.kwargs))
    try:
        op(*meta_args, **meta_kwargs)
    except NotImplementedError:
        return False
    except Exception:   # noqa: BLE001 - any refusal: the CPU kernel raises its own
        return True
    return False


def _shares_memory(info: Any, host: Any) -> bool:
    """Whether an ``out=``/in-place destination of the call overlaps itself or partly
    overlaps one of the inputs (the same view read and written, as in ``a.add_(b)``, is
    fine). Conservative: a destination and an input whose byte ranges meet count."""
    if not info.mutable:
        return False
    dests, inputs = [], []
    for pos, value in [*enumerate(host.args), *host.kwargs.items()]:
        is_dest = any(pos == i or pos == name for i, name in info.mutable)
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(t, torch.Tensor) and t.numel():
                (dests if is_dest else inputs).append(t)
    return any(_self_overlapping(d) or any(_partly_overlap(d, x) for x in inputs) for d in dests)


def _self_overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (a stride of 0, say); True also
    where strides interleave in ways not worth proving safe."""
    extent = 1
    for stride, size in sorted((abs(st), sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride < extent:
            return True
        extent = stride * size
    return False


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The addresses [first, end) that ``t``'s elements lie between."""
    low = sum(st * (sz - 1) for sz, st in zip(t.shape, t.stride()) if st < 0)
    high = sum(st * (sz - 1) for sz, st in zip(t.shape, t.stride()) if st > 0)
    item = t.element_size()
    return t.data_ptr() + low * item, t.data_ptr() + (high + 1) * item


def _partly_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` occupy intersecting byte ranges without being the same view."""
    if a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype:
        return False
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1


def plan(call: Call) -> Launch | None:
    """The kernel run that computes ``call`` (on CPU tensors), or None."""
    adapter = INSTRUCTION_OPS.get(call.name)
    if adapter is None:
        return None
    if any(isinstance(x, torch.Tensor) and x.numel() == 0 for x in call.args):
        return None   # an empty input (an empty out= tensor is fine: it is resized)
    return adapter(call)


def execute(launch: Launch) -> tuple[Any, Any]:
    """Trace and simulate ``launch`` at instruction fidelity on the device's chip: the op's
    result (CPU tensors) and the simulator's RunResult (its ``total_ps`` is the Program's
    time)."""
    from trnsim.errors import TrnSimError
    from trnsim.nki.launch import run_traced

    try:
        traced = launch.kernel.trace(*launch.args, chip=state.chip(), **launch.kwargs)
    except TrnSimError:
        return None, None   # a shape the kernel does not take
    launched = run_traced(traced, numerics=True)
    return launch.finish(launched.outputs), launched.run


def _place(result: Any, info: Any, args: tuple, kwargs: dict) -> Any:
    """New results adopted as neuron tensors; an ``out=``/in-place result copied into its
    destination, which is resized when empty (None when its dtype differs or it is a
    non-empty tensor of another shape: the CPU kernel then warns, resizes or raises, as
    PyTorch does)."""
    if result is None:
        return None
    if not info.mutable:
        if isinstance(result, tuple):
            return tuple(storage.adopt(r) for r in result)
        return storage.adopt(result)
    if len(info.mutable) != 1 or not isinstance(result, torch.Tensor):
        return None
    i, name = info.mutable[0]
    dest = args[i] if i < len(args) else kwargs.get(name)
    if not isinstance(dest, torch.Tensor) or dest.device.type != "neuron" or dest.dtype != result.dtype:
        return None
    if dest.shape != result.shape:
        if dest.numel():
            return None
        dest.resize_(result.shape)   # an empty out= tensor, as PyTorch's functional ops pass
    storage.host_alias(dest).copy_(result)
    return dest
