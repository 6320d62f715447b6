"""Simulated device time of aten ops.

Ops that dominate real models have a kernel: a Program from :mod:`trnsim.kernels`
traced for the op's shapes and dtypes and simulated on the chip (see
:mod:`trnsim.backend.opkernels`). Every other op gets a bandwidth-bound estimate:
one DMA's fixed cost plus the bytes it reads and writes over the core's HBM
bandwidth. :func:`coverage` lists which is which.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from trnsim.backend import optable
from trnsim.backend.lowering import Call
from trnsim.backend.opcost import OpCost, estimate, moved_bytes

# Ops that make, free or re-describe memory without device work.
NO_DEVICE_WORK = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::resize_", "aten::set_.source_Storage",
    "aten::set_.source_Storage_storage_offset", "aten::set_.source_Tensor", "aten::set_", "aten::is_pinned",
    "aten::is_set_to", "aten::record_stream", "aten::_has_same_storage_numel", "aten::sym_size",
    "aten::new_empty_strided", "aten::new_empty", "aten::empty_like",
})


def op_cost(name: str, args: tuple, kwargs: dict, flat: list, out: Any,
            cost_of: Callable[..., OpCost] | None = None) -> OpCost:
    """Simulated cost of op ``name`` (arguments ``args``/``kwargs``, flattened ``flat``;
    results ``out``). ``cost_of`` costs another op, for ops made of others (the
    caller's memoized costing)."""
    if name in NO_DEVICE_WORK:
        return OpCost(ps=0, source="none")
    results = [o for o in (out if isinstance(out, (list, tuple)) else (out,)) if isinstance(o, torch.Tensor)]
    if results and not any(o.numel() for o in results):   # it writes nothing
        return OpCost(ps=0, source="none")
    cost = optable.kernel_cost(Call(name, args, kwargs, flat, out, cost_of))
    if cost is not None:
        return cost
    nbytes = moved_bytes(flat, out)
    if not nbytes:   # every tensor it reads and writes is empty (or there is none): nothing to do
        return OpCost(ps=0, source="none")
    return estimate(nbytes)


def coverage() -> dict[str, list[str]]:
    """Which aten ops have a kernel and which a bandwidth estimate.

    Returns ``{"kernel": [...], "estimate": [...], "none": [...]}``: op names with a
    kernel from trnsim.kernels, ops the device runs with an estimated time (every
    other aten op with a CPU kernel), and ops that do no device work.
    """
    every = [q for q in torch._C._dispatch_get_all_op_names() if q.startswith("aten::")]
    # the kernel table names overload families; list the overloads PyTorch has
    kernel = sorted(q for q in every if q in optable.KERNEL_OPS)
    none = sorted(q for q in every if q in NO_DEVICE_WORK)
    skip = set(kernel) | set(none)
    est = sorted(q for q in every if q not in skip and (
        torch._C._dispatch_has_kernel_for_dispatch_key(q, "CPU")
        or torch._C._dispatch_has_kernel_for_dispatch_key(q, "CompositeExplicitAutograd")))
    return {"kernel": kernel, "estimate": est, "none": none}
