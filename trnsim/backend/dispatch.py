"""The one fallback that runs every aten op on the ``neuron`` device.

Each op is sorted once by its schema:

- views (``view``, ``transpose``, ``detach``, ``split``, ...) redispatch to the CPU
  kernel, which makes a tensor on the same StorageImpl with the input's device, so
  aliasing is exact and costs no device time;
- every other op runs PyTorch's own CPU kernel on zero-copy CPU aliases of its neuron
  arguments: mutated arguments are written in place (re-pointed if the kernel resized
  them), new results adopt the CPU result's memory as neuron tensors, ``device=``
  arguments are rewritten to the CPU;

then the op is charged its simulated time on the eager timeline. A few ops need their
own handling (allocation, cross-device copies, ``resize_``, ``.item()``); they are
in ``_SPECIAL``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from trnsim.backend import edge_ops, rng, sparse, state, storage, timeline

_CPU_KS = storage._CPU
_CPU = torch.device("cpu")
_aten = torch.ops.aten

# Ops whose tensor arguments may sit on the CPU beside neuron tensors, as on CUDA.
_MIXED_OK = {"aten::index.Tensor", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_",
             "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize", "aten::set_.source_Tensor",
             # their out= and hacked_twin overloads, and the unsafe index ops, which take CPU indices too
             "aten::index.Tensor_out", "aten::index.Tensor_hacked_twin", "aten::index_put.out",
             "aten::index_put.hacked_twin", "aten::index_put_.hacked_twin", "aten::_index_put_impl.out",
             "aten::_index_put_impl_.hacked_twin", "aten::_unsafe_index.Tensor",
             "aten::_unsafe_index.Tensor_hacked_twin", "aten::_unsafe_index_put", "aten::_unsafe_index_put.hacked_twin",
             "aten::_unsafe_masked_index", "aten::_unsafe_masked_index_put_accumulate", "aten::copy.out",
             "aten::_copy_from.out", "aten::_copy_from_and_resize.out"}


class _OpInfo:
    """What the fallback needs to know about one op overload, worked out once."""

    __slots__ = ("name", "kind", "mutable", "has_device", "random")

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        self.mutable = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                             if a.alias_info is not None and a.alias_info.is_write)
        self.has_device = any(a.name == "device" for a in schema.arguments)
        self.kind = "view" if op.is_view and not self.mutable else "compute"
        self.random = torch.Tag.nondeterministic_seeded in op.tags


_infos: dict[Any, _OpInfo] = {}


def _info(op) -> _OpInfo:
    info = _infos.get(op)
    if info is None:
        info = _infos[op] = _OpInfo(op)
    return info


def _is_neuron(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "neuron"


def fallback(op, *args, **kwargs):
    info = _infos.get(op) or _info(op)
    special = _SPECIAL.get(info.name)
    if special is not None:
        return special(op, info, args, kwargs)
    if info.kind == "view":
        return op.redispatch(_CPU_KS, *args, **kwargs)
    return _compute(op, info, args, kwargs)


def _to_host(flat: list, info: _OpInfo) -> tuple[list, dict[int, Any], torch.Tensor | None]:
    """Replace neuron tensors in ``flat`` by CPU aliases; also return which host storage
    pointer belongs to which neuron storage, and one neuron tensor seen (None if none)."""
    owners: dict[int, Any] = {}
    seen = None
    cpu_dense = None
    out = flat[:]
    for i, x in enumerate(flat):
        if isinstance(x, torch.Tensor):
            if x.device.type == "neuron":
                seen = x
                a = storage.host_alias(x)
                out[i] = a
                st = x.untyped_storage()
                if st.nbytes():
                    owners[a.untyped_storage().data_ptr()] = st
            elif x.device.type == "cpu" and x.dim() > 0 and not x.is_sparse:
                cpu_dense = x
            elif x.device.type == "meta":
                raise NotImplementedError(f"{info.name}: cannot mix neuron and meta tensors")
        elif isinstance(x, torch.device) and x.type == "neuron":
            out[i] = _CPU
    if seen is not None and cpu_dense is not None and info.name not in _MIXED_OK:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, neuron:0 and cpu! "
            f"(when calling {info.name}); move the CPU tensor with .to('neuron')")
    return out, owners, seen


def _compute(op, info: _OpInfo, args: tuple, kwargs: dict, host_op=None):
    """Run ``op`` (or ``host_op``, the CPU op that does its work) on host aliases."""
    flat, spec = tree_flatten((args, kwargs))
    to_device = info.has_device and _wants_neuron(kwargs)
    if state.fidelity() == "timing":
        from trnsim.backend import nodata

        return nodata.run(op, info, flat, spec, to_device)
    host_flat, owners, seen = _to_host(flat, info)
    h_args, h_kwargs = tree_unflatten(host_flat, spec)
    try:
        run = host_op if host_op is not None else op
        if info.random and (seen is not None or to_device):
            with rng.swapped_default():
                result = run(*h_args, **h_kwargs)
        else:
            result = run(*h_args, **h_kwargs)
    except Exception as e:
        h_args, h_kwargs, result = _retry_with_wrapped_numbers(e, op, run, info, h_args, h_kwargs,
                                                               info.random and (seen is not None or to_device))
    for i, name in info.mutable:
        if i < len(args):
            _sync_mutated(args[i], h_args[i])
        elif name in kwargs:
            _sync_mutated(kwargs[name], h_kwargs[name])
    if seen is None and not to_device and not (info.has_device and kwargs.get("device") is None):
        # no neuron tensor in and none asked for: a CPU op reached us through a neuron
        # device argument that is not called ``device`` (rare); leave results on the CPU
        return result
    host_ids = {id(h): n for h, n in zip(host_flat, flat) if h is not n}
    keep_cpu = info.has_device and not to_device and kwargs.get("device") is not None
    out = _from_host(result, host_ids, owners, keep_cpu)
    timeline.charge(op, info, args, kwargs, flat, out)
    return out


def _wants_neuron(kwargs: dict) -> bool:
    d = kwargs.get("device")
    if d is None:
        return False
    return (d.type if isinstance(d, torch.device) else str(d).split(":")[0]) == "neuron"


def _from_host(result: Any, host_ids: dict[int, Any], owners: dict[int, Any], keep_cpu: bool) -> Any:
    """Map CPU results back: aliases to their neuron tensors, new tensors adopted."""
    if isinstance(result, torch.Tensor):
        return _one_from_host(result, host_ids, owners, keep_cpu)
    if isinstance(result, (tuple, list)):
        mapped = [_from_host(r, host_ids, owners, keep_cpu) for r in result]
        return type(result)(mapped) if isinstance(result, tuple) else mapped
    return result


def _one_from_host(t: torch.Tensor, host_ids: dict[int, Any], owners: dict[int, Any], keep_cpu: bool):
    same = host_ids.get(id(t))
    if same is not None:
        return same
    if keep_cpu or t.device.type != "cpu":
        return t
    if t.layout != torch.strided:
        return sparse.from_host(t, owners)
    st = t.untyped_storage()
    owner = owners.get(st.data_ptr()) if st.nbytes() else None
    if owner is not None:
        return storage.on_storage(owner, t.dtype, t.shape, t.stride(), t.storage_offset())
    return storage.adopt(t)


def _sync_mutated(neuron: Any, host: Any) -> None:
    """After a CPU kernel wrote ``host`` (the alias of ``neuron``), carry over any change of
    geometry or storage it made (``out=`` tensors get resized)."""
    if isinstance(neuron, (list, tuple)):
        for n, h in zip(neuron, host):
            _sync_mutated(n, h)
        return
    if not _is_neuron(neuron) or not isinstance(host, torch.Tensor):
        return
    hs = host.untyped_storage()
    if hs.data_ptr() != neuron.untyped_storage().data_ptr() or hs.nbytes() != neuron.untyped_storage().nbytes():
        storage.rebind(neuron, storage.neuron_storage(hs), host.shape, host.stride(), host.storage_offset())
    elif host.shape != neuron.shape or host.stride() != neuron.stride() or host.storage_offset() != neuron.storage_offset():
        storage.rebind(neuron, neuron.untyped_storage(), host.shape, host.stride(), host.storage_offset())


def _retry_with_wrapped_numbers(e: Exception, op, run, info: _OpInfo, h_args: tuple, h_kwargs: dict, swap_rng: bool):
    """After the CPU call failed: run it again if PyTorch handed Python numbers for Tensor
    arguments (wrapped numbers, see :func:`edge_ops.wrap_numbers`), else re-raise.
    Returns the arguments of the call and its result."""
    wrapped = edge_ops.wrap_numbers(op, h_args, h_kwargs)
    if wrapped is None:
        _reraise(e, info)
    h_args, h_kwargs = wrapped
    try:
        if swap_rng:
            with rng.swapped_default():
                return h_args, h_kwargs, run(*h_args, **h_kwargs)
        return h_args, h_kwargs, run(*h_args, **h_kwargs)
    except Exception as e2:
        _reraise(e2, info)


def _reraise(e: Exception, info: _OpInfo):
    """Errors of the CPU kernel, reworded where they would mention the CPU."""
    msg = str(e)
    if "cpu" in msg.lower() and "device" in msg.lower():
        raise type(e)(msg.replace("cpu", "neuron")) from None
    raise e


# -- ops with their own handling ---------------------------------------------

def _empty(op, info: _OpInfo, args: tuple, kwargs: dict):
    """``empty.memory_format`` / ``empty_strided``: the one place memory is made from nothing."""
    size = args[0]
    stride = args[1] if info.name == "aten::empty_strided" else None
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    if stride is None:
        meta = torch.empty(size, dtype=dtype, device="meta", memory_format=kwargs.get("memory_format")
                           or torch.contiguous_format)
        size, stride = meta.shape, meta.stride()
    nbytes = _storage_bytes(size, stride, dtype)
    state.memory.check(nbytes)  # before touching host memory
    if state.fidelity() == "timing":
        st = storage.timing_storage(nbytes)
    else:
        st = storage.neuron_storage(torch.empty(nbytes, dtype=torch.uint8).untyped_storage())
    return storage.on_storage(st, dtype, size, stride, 0)


def _storage_bytes(size, stride, dtype: torch.dtype) -> int:
    if any(s == 0 for s in size):
        return 0
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride))
    return span * dtype.itemsize


def _copy(op, info: _OpInfo, args: tuple, kwargs: dict):
    """``copy_`` between neuron tensors, or ``_copy_from(src, dst)``, which PyTorch's
    ``copy_`` calls when one side is on another device. A copy to the CPU waits for
    the device."""
    if info.name == "aten::copy_":
        dst, src = args[0], args[1]
    else:
        src, dst = args[0], args[1]
    if dst.device.type != "neuron":
        timeline.sync("copy to cpu")
    flat = [dst, src]
    if state.fidelity() == "timing":
        from trnsim.backend import nodata

        nodata.copy(dst, src)
    else:
        h_dst = storage.host_alias(dst) if dst.device.type == "neuron" else dst
        h_src = storage.host_alias(src) if src.device.type == "neuron" else src
        h_dst.copy_(h_src)
    timeline.charge(op, info, (dst, src), {}, flat, dst)
    return dst


def _copy_from_and_resize(op, info: _OpInfo, args: tuple, kwargs: dict):
    src, dst = args[0], args[1]
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return _copy(op, _info(_aten._copy_from.default), (src, dst), {})


def _to_copy(op, info: _OpInfo, args: tuple, kwargs: dict):
    """``.to()``: a neuron kernel (see :data:`_OVERRIDES`); a copy to the CPU waits for
    the device, and has no values to read in timing fidelity."""
    if not _wants_neuron(kwargs) and kwargs.get("device") is not None:
        timeline.sync("to cpu")
        if state.fidelity() == "timing" and args[0].untyped_storage().nbytes() and storage.block_of(args[0]).host is None:
            raise state.no_data_error()
    return _compute(op, info, args, kwargs)


def _item(op, info: _OpInfo, args: tuple, kwargs: dict):
    timeline.sync(".item()")
    if state.fidelity() == "timing" and storage.block_of(args[0]).host is None:
        raise state.no_data_error()
    return op(storage.host_alias(args[0]))


def _resize(op, info: _OpInfo, args: tuple, kwargs: dict):
    """``resize_``: grows into a new HBM allocation that keeps the old bytes."""
    t, size = args[0], args[1]
    fmt = kwargs.get("memory_format") or (args[2] if len(args) > 2 else None)
    meta = torch.empty(size, dtype=t.dtype, device="meta",
                       memory_format=fmt if fmt is not None else torch.contiguous_format)
    need = t.storage_offset() * t.element_size() + _storage_bytes(meta.shape, meta.stride(), t.dtype)
    old = t.untyped_storage()
    if need > old.nbytes():
        if storage.block_of(t).host is None:
            new = storage.timing_storage(need)
        else:
            host = torch.empty(need, dtype=torch.uint8)
            host[:old.nbytes()] = torch.empty(0, dtype=torch.uint8).set_(storage.block_of(t).host)
            new = storage.neuron_storage(host.untyped_storage())
        storage.rebind(t, new, t.shape, t.stride(), t.storage_offset())
    storage.rebind(t, t.untyped_storage(), meta.shape, meta.stride(), t.storage_offset())
    return t


def _set_storage(op, info: _OpInfo, args: tuple, kwargs: dict):
    """``set_`` onto another storage: a CPU storage is copied into neuron memory."""
    src = args[1] if len(args) > 1 else kwargs.get("source")
    if isinstance(src, torch.Tensor) and src.device.type == "cpu":
        raise RuntimeError(f"{info.name}: cannot set a neuron tensor onto a CPU tensor's storage; "
                           "copy it with .to('neuron') first")
    if isinstance(src, (torch.UntypedStorage, torch.TypedStorage)) and src.device.type == "cpu":
        raise RuntimeError(f"{info.name}: cannot set a neuron tensor onto a CPU storage; "
                           "move the data with .to('neuron') first")
    return op.redispatch(_CPU_KS, *args, **kwargs)


def _no_time(op, info: _OpInfo, args: tuple, kwargs: dict):
    """Ops that only read metadata: run on the host alias, no device time."""
    host_flat, _, _ = _to_host(tree_flatten((args, kwargs))[0], info)
    h_args, h_kwargs = tree_unflatten(host_flat, tree_flatten((args, kwargs))[1])
    return op(*h_args, **h_kwargs)


def _conv(op, info: _OpInfo, args: tuple, kwargs: dict):
    """PyTorch routes a device's convolutions to ``convolution_overrideable``; the CPU's
    ``convolution`` does the work."""
    return _compute(op, info, args, kwargs, host_op=_aten.convolution.default)


def _conv_backward(op, info: _OpInfo, args: tuple, kwargs: dict):
    grad, x, w, stride, padding, dilation, transposed, output_padding, groups, mask = args

    def host(grad, x, w, stride, padding, dilation, transposed, output_padding, groups, mask):
        bias_sizes = [w.shape[1] * groups if transposed else w.shape[0]]
        return _aten.convolution_backward.default(grad, x, w, bias_sizes, stride, padding, dilation, transposed,
                                                  output_padding, groups, mask)

    return _compute(op, info, args, kwargs, host_op=host)


def _record_stream(op, info: _OpInfo, args: tuple, kwargs: dict):
    return None


_SPECIAL: dict[str, Callable] = {
    "aten::empty.memory_format": _empty,
    "aten::empty_strided": _empty,
    "aten::copy_": _copy,
    "aten::_copy_from": _copy,
    "aten::_copy_from_and_resize": _copy_from_and_resize,
    "aten::_to_copy": _to_copy,
    "aten::_local_scalar_dense": _item,
    "aten::resize_": _resize,
    "aten::set_.source_Storage": _set_storage,
    "aten::set_.source_Storage_storage_offset": _set_storage,
    "aten::set_.source_Tensor": _set_storage,
    "aten::set_": _set_storage,
    "aten::record_stream": _record_stream,
    "aten::convolution_overrideable": _conv,
    "aten::convolution_backward_overrideable": _conv_backward,
    "aten::is_pinned": _no_time,
    "aten::is_set_to": _no_time,
    "aten::_efficientzerotensor": edge_ops.efficient_zeros,
    "aten::_to_sparse": sparse.to_sparse,
    "aten::_to_sparse.sparse_dim": sparse.to_sparse,
}


# Ops with a CompositeExplicitAutograd kernel that would win over the fallback ("name" or
# "name.overload").
_OVERRIDES = ("convolution_overrideable", "convolution_backward_overrideable",
              # the CPU has a fused kernel; the composite one decomposes into ops that each
              # round to the tensor's dtype, so bf16 results differ from the CPU's
              "native_layer_norm", "native_group_norm", "addr", "addr.out", "linalg__powsum",
              # the composite one would ask the device for pinned memory for non_blocking copies to the CPU
              "_to_copy")


def register_overrides(lib: torch.library.Library) -> None:
    """Register the fallback itself as the neuron kernel of :data:`_OVERRIDES`."""
    for name in _OVERRIDES:
        base, _, overload = name.partition(".")
        op = getattr(getattr(_aten, base), overload or "default")

        def kernel(*args, _op=op, **kwargs):
            return fallback(_op, *args, **kwargs)

        lib.impl(name, kernel, "PrivateUse1")
