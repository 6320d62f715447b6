"""Timing fidelity: ops on shapes alone, like the meta device.

Under ``TRNSIM_FIDELITY=timing`` neuron tensors keep no host memory (their HBM is
still accounted); each op runs on meta tensors of the same shapes and strides to
learn its results' shapes, and is charged its simulated time as usual. So a model
larger than the host's memory can be timed. Reading values (``.item()``, ``.cpu()``,
printing) raises an error that says so.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_unflatten

from trnsim.backend import edge_ops, state, storage, timeline


# Ops whose result shapes depend on values (printing uses masked_select).
_NEEDS_VALUES = frozenset({"aten::masked_select", "aten::nonzero", "aten::unique", "aten::_unique2",
                           "aten::unique_consecutive", "aten::unique_dim", "aten::equal", "aten::allclose"})


# Ops whose meta kernels do not check ``dim`` against the rank (their CPU kernels do;
# index_select's meta kernel fails with a bare "list assignment index out of range"),
# found by sweeping ops that take a dim; checked here as the CPU checks it.
_UNCHECKED_DIM = frozenset({"aten::_softmax", "aten::_softmax.out", "aten::sort", "aten::sort.stable",
                            "aten::sort.values", "aten::sort.values_stable", "aten::index_select",
                            "aten::index_select.out"})


def _check_dim(op, args: tuple, kwargs: dict) -> None:
    """Raise the CPU's IndexError if the ``dim`` argument of ``op`` is out of range."""
    names = [a.name for a in op._schema.arguments]
    pos = names.index("dim")
    dim = args[pos] if pos < len(args) else kwargs.get("dim", -1)
    n = max(args[0].dim(), 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")


def _shape_of(op, host_op, args: tuple, kwargs: dict) -> Any:
    try:
        return op(*args, **kwargs)
    except NotImplementedError:
        if host_op is None:
            raise
        return host_op(*args, **kwargs)


def run(op, info, flat: list, spec, to_device: bool, host_op=None) -> Any:
    """Run ``op`` on meta stand-ins of ``flat`` (``host_op``, the plain-op version of its
    work, where ``op`` has no meta kernel); results become data-less neuron tensors."""
    metas = []
    back: dict[int, torch.Tensor] = {}
    for x in flat:
        if isinstance(x, torch.Tensor) and x.device.type in ("neuron", "cpu"):
            if x.device.type == "cpu" and x.dim() == 0:
                metas.append(x)   # a CPU scalar keeps its value
                continue
            m = storage.meta_like(x)
            back[id(m)] = x
            metas.append(m)
        elif isinstance(x, torch.device) and x.type == "neuron":
            metas.append(torch.device("meta"))
        else:
            metas.append(x)
    if info.name in _NEEDS_VALUES:
        raise state.no_data_error()
    args, kwargs = tree_unflatten(metas, spec)
    args, kwargs = edge_ops.wrap_numbers(op, args, kwargs) or (args, kwargs)
    if info.name in _UNCHECKED_DIM:
        _check_dim(op, args, kwargs)
    try:
        result = _shape_of(op, host_op, args, kwargs)
    except NotImplementedError as e:
        raise NotImplementedError(
            f"{info.name} cannot run under TRNSIM_FIDELITY=timing: it has no shape function (meta kernel) "
            f"or its result shape depends on values; use fidelity 'op' for it ({str(e).splitlines()[0]})") from None
    except RuntimeError as e:
        if "data-dependent" in str(e) or "meta" in str(e).lower() and "item" in str(e).lower():
            raise state.no_data_error() from None
        raise
    for i, name in info.mutable:
        target = flat_arg(flat, spec, i, name)
        if target is None:
            continue
        m_args, m_kwargs = args, kwargs
        m = m_args[i] if i < len(m_args) else m_kwargs.get(name)
        _sync(target, m)
    out = _back(result, back)
    o_args, o_kwargs = tree_unflatten(flat, spec)
    timeline.charge(op, info, o_args, o_kwargs, flat, out)
    return out


def flat_arg(flat: list, spec, i: int, name: str) -> Any:
    args, kwargs = tree_unflatten(flat, spec)
    return args[i] if i < len(args) else kwargs.get(name)


def _sync(target: Any, m: Any) -> None:
    if isinstance(target, (list, tuple)):
        for t, mm in zip(target, m):
            _sync(t, mm)
        return
    if not isinstance(target, torch.Tensor) or target.device.type != "neuron":
        return
    if m.shape != target.shape or m.stride() != target.stride():
        # as the CPU resizes an out= argument: its own storage grows in place (every view
        # sees it) and its offset stays
        offset = target.storage_offset()
        need = offset * target.element_size() + _bytes(m)
        st = target.untyped_storage()
        if m.numel() and need > st.nbytes():
            storage.resize_in_place(st, need)
        storage.rebind(target, st, m.shape, m.stride(), offset)


def _bytes(m: torch.Tensor) -> int:
    if m.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(m.shape, m.stride()))) * m.element_size()


def _back(result: Any, back: dict[int, torch.Tensor]) -> Any:
    if isinstance(result, torch.Tensor):
        same = back.get(id(result))
        if same is not None:
            return same
        if result.device.type != "meta":
            return result
        st = storage.timing_storage(_bytes(result))
        return storage.on_storage(st, result.dtype, result.shape, result.stride(), 0)
    if isinstance(result, (list, tuple)):
        mapped = [_back(r, back) for r in result]
        return tuple(mapped) if isinstance(result, tuple) else mapped
    return result


def copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """A copy under timing fidelity: into the device drops the values, out of it has none."""
    if dst.device.type != "neuron":
        raise state.no_data_error()
