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

import threading
import warnings
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from trnsim import settings
from trnsim.backend import edge_ops, hostshims, rng, sparse, state, storage, timeline

_CPU_KS = storage._CPU
_CPU = torch.device("cpu")
_STRIDED = torch.strided
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


# In-place ops that write every element of ``self`` without reading it.
_OVERWRITING = frozenset(f"aten::{n}" for n in (
    "fill_", "zero_", "uniform_", "normal_", "random_", "bernoulli_", "exponential_", "geometric_",
    "log_normal_", "cauchy_"))


class _OpInfo:
    """What the fallback needs to know about one op overload, worked out once."""

    __slots__ = ("name", "kind", "mutable", "mutable_pos", "mutable_names", "has_device", "random", "generator",
                 "special", "fresh_results", "out_names", "overwrites")

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        self.mutable = tuple((i, a.name) for i, a in enumerate(schema.arguments)
                             if a.alias_info is not None and a.alias_info.is_write)
        self.mutable_pos = frozenset(i for i, _ in self.mutable)
        self.mutable_names = frozenset(n for _, n in self.mutable)
        self.has_device = any(a.name == "device" for a in schema.arguments)
        self.kind = "view" if op.is_view and not self.mutable else "compute"
        self.random = torch.Tag.nondeterministic_seeded in op.tags
        # where the device generator goes (random ops without the argument draw nothing
        # on this path, or have their own host op: native_dropout)
        self.generator = rng.generator_slot(op) if self.random else None
        self.special = _SPECIAL.get(self.name)
        # results with no alias annotation are new memory: no need to look for an input
        # storage they might share
        self.fresh_results = not op.is_view and all(r.alias_info is None for r in schema.returns)
        # out= arguments: written keyword-only arguments (``out``, ``values``, ``indices``, ...),
        # which kernels resize; in-place ones keep their size
        self.out_names = frozenset(a.name for a in schema.arguments
                                   if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)
        # it writes every element of its written arguments without reading them: out=
        # arguments, fills and random fills (memory nothing wrote then needs no NaN fill first)
        self.overwrites = bool(self.mutable) and (
            all(n in self.out_names for _, n in self.mutable) or schema.name in _OVERWRITING)


_infos: dict[Any, _OpInfo] = {}


def _info(op) -> _OpInfo:
    info = _infos.get(op)
    if info is None:
        info = _infos[op] = _OpInfo(op)
    return info


def _is_neuron(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "neuron"


def fallback(op, *args, **kwargs):
    if _direct_lib is None:   # the first op on the device
        bad = settings.problem()
        if bad is not None:   # raised here, so a script's traceback ends at its own line and this one
            raise bad
        hostshims.install_pinned_factories()
        _register_direct()
    if any(type(a) in _UNINITIALIZED for a in args):
        args = _initialized_view(args)
    info = _infos.get(op) or _info(op)
    if info.special is not None:
        result = info.special(op, info, args, kwargs)
        if isinstance(result, edge_ops.OnHost):
            return _compute(op, info, args, kwargs, host_op=result.host_op)
        return result
    if info.kind == "view":
        return op.redispatch(_CPU_KS, *args, **kwargs)
    return _compute(op, info, args, kwargs)


# A LazyModule's parameters and buffers before their first forward: their Python class
# refuses ``.shape`` and most methods, which a C++ kernel never asks of it.
_UNINITIALIZED = frozenset({torch.nn.parameter.UninitializedParameter, torch.nn.parameter.UninitializedBuffer})


def _initialized_view(args: tuple) -> tuple:
    """``args`` with each uninitialized parameter or buffer as a plain tensor on its memory."""
    with torch._C.DisableTorchFunctionSubclass():
        return tuple(a.as_subclass(torch.Tensor) if type(a) in _UNINITIALIZED else a for a in args)


class _Host:
    """An op's arguments with every neuron tensor replaced by a zero-copy CPU alias.

    ``flat`` lists the original arguments' leaves (tensors, scalars, list items) in
    order; ``back`` maps each alias's id to its neuron tensor, ``owners`` each host
    storage pointer to its neuron storage; ``seen`` is one neuron tensor met (or None).
    Aten schemas nest at most one level (``Tensor[]``, ``Tensor?[]``), so no pytree.
    """

    __slots__ = ("args", "kwargs", "flat", "back", "seen", "cpu_dense", "written", "overwritten", "growable",
                 "_owners")

    def __init__(self, info: _OpInfo, args: tuple, kwargs: dict, growable: bool = False) -> None:
        self.flat: list = []
        self.back: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._owners: dict[int, Any] | None = None
        self.seen = None
        self.cpu_dense = None
        self.growable = growable
        # one fresh alias per written neuron tensor, also where it is read (``add(x, y, out=x)``):
        # the CPU kernel must see one tensor, as it would on the CPU, not a reader beside a writer
        self.written: dict[int, torch.Tensor] = {}
        # written arguments whose unwritten fill was skipped: marked written once the op succeeds
        self.overwritten: list[torch.Tensor] = []
        for i, name in info.mutable:
            x = args[i] if i < len(args) else kwargs.get(name)
            for t in (x if isinstance(x, (list, tuple)) else (x,)):
                if isinstance(t, torch.Tensor) and t.device.type == "neuron" and id(t) not in self.written:
                    overwrite = _overwrites(info, t, args, kwargs)
                    if overwrite:
                        self.overwritten.append(t)
                    self.written[id(t)] = storage.host_alias(t, fresh=True, growable=growable, overwrite=overwrite)
        mpos = info.mutable_pos
        self.args = [self._leaf(x, i in mpos, info) for i, x in enumerate(args)]
        if kwargs:
            mnames = info.mutable_names
            self.kwargs = {k: self._leaf(v, k in mnames, info) for k, v in kwargs.items()}
        else:
            self.kwargs = kwargs
        if self.seen is not None and self.cpu_dense is not None and info.name not in _MIXED_OK:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, neuron:0 and cpu! "
                f"(when calling {info.name}); move the CPU tensor with .to('neuron')")

    def _leaf(self, x: Any, mutable: bool, info: _OpInfo) -> Any:
        if isinstance(x, torch.Tensor):
            return self._tensor(x, mutable, info)
        if isinstance(x, (list, tuple)):
            return type(x)(self._leaf_item(y, mutable, info) for y in x)
        self.flat.append(x)
        if isinstance(x, torch.device) and x.type == "neuron":
            return _CPU
        return x

    def _leaf_item(self, x: Any, mutable: bool, info: _OpInfo) -> Any:
        if isinstance(x, torch.Tensor):
            return self._tensor(x, mutable, info)
        self.flat.append(x)
        return x

    def _tensor(self, x: torch.Tensor, mutable: bool, info: _OpInfo) -> torch.Tensor:
        self.flat.append(x)
        if x.is_cpu:
            if x.dim() > 0 and not x.is_sparse:
                self.cpu_dense = x
            return x
        if x.device.type == "neuron":
            self.seen = x
            a = self.written.get(id(x)) if self.written else None
            if a is None:
                a = storage.host_alias(x, fresh=mutable, growable=self.growable)
            self.back[id(a)] = (x, a)
            return a
        if x.device.type == "meta":
            raise NotImplementedError(f"{info.name}: cannot mix neuron and meta tensors")
        return x

    def owners(self) -> dict[int, Any]:
        """Each host storage pointer of an argument, to the neuron storage it stands for
        (worked out when a result might share an argument's memory)."""
        if self._owners is None:
            self._owners = {}
            for x, a in self.back.values():
                st = x.untyped_storage()
                if st.nbytes():
                    self._owners[a.untyped_storage().data_ptr()] = st
        return self._owners


def _overwrites(info: _OpInfo, t: torch.Tensor, args: tuple, kwargs: dict) -> bool:
    """Whether ``op`` writes all of ``t`` without reading it: it is an overwriting op and
    no argument it reads shares ``t``'s storage (``add(x, 1, out=x)`` reads ``x``).
    Asked only of memory nothing wrote yet."""
    if not info.overwrites or storage.block_of(t).unwritten is None:
        return False
    ptr = t.untyped_storage().data_ptr()
    read = [a for i, a in enumerate(args) if i not in info.mutable_pos]
    read += [v for k, v in kwargs.items() if k not in info.mutable_names]
    for x in read:
        for y in (x if isinstance(x, (list, tuple)) else (x,)):
            if _is_neuron(y) and y.untyped_storage().data_ptr() == ptr:
                return False
    return True


def _compute(op, info: _OpInfo, args: tuple, kwargs: dict, host_op=None, growable: bool = False):
    """Run ``op`` (or ``host_op``, the CPU op that does its work) on host aliases.

    Written arguments get aliases whose host storage the kernel cannot resize, so an
    ``out=`` argument that is too small makes the kernel fail before it allocates; it is
    then grown in place with HBM checked first (:func:`_grow_outputs`) and the op runs
    again. ``growable`` (where the op's meta kernel cannot say the sizes) lets the kernel
    resize the host memory itself, accounted after (:func:`storage.follow_host`)."""
    to_device = info.has_device and _wants_neuron(kwargs)
    if state.fidelity() == "timing":
        from trnsim.backend import nodata

        flat, spec = tree_flatten((args, kwargs))
        return nodata.run(op, info, flat, spec, to_device, host_op)
    host = _Host(info, args, kwargs, growable)
    h_args, h_kwargs = host.args, host.kwargs
    if state.fidelity() == "instruction" and host.seen is not None:
        from trnsim.backend import instruction

        with timeline.simulating:   # runs the op's kernel on the simulator, which is one per process
            result = instruction.run(op, info, host, args, kwargs)
        if result is not None:
            for t in host.overwritten:
                storage.mark_written(t)
            timeline.charge(op, info, args, kwargs, host.flat, result)
            return result
    run = host_op if host_op is not None else op
    draws = info.random and (host.seen is not None or to_device)
    if draws and info.generator is not None:
        h_args, h_kwargs = _with_device_generator(info.generator, h_args, h_kwargs)
    try:
        result = _call(run, h_args, h_kwargs, draws, info)
    except Exception as e:   # noqa: BLE001 - whatever the CPU kernel raised: retried below, or re-raised as the op's error
        if info.mutable and not growable and _NOT_RESIZABLE in str(e):
            return _compute(op, info, args, kwargs, host_op, growable=not _grow_outputs(op, info, args, kwargs))
        h_args, h_kwargs, result = _retry_with_wrapped_numbers(e, op, run, info, h_args, h_kwargs, draws)
    for t in host.overwritten:
        storage.mark_written(t)
    sync_mutated_args(info, args, kwargs, h_args, h_kwargs)
    if host.seen is None and not to_device and not (info.has_device and kwargs.get("device") is None):
        # no neuron tensor in and none asked for: a CPU op reached us through a neuron
        # device argument that is not called ``device`` (rare); leave results on the CPU
        return result
    keep_cpu = info.has_device and not to_device and kwargs.get("device") is not None
    out = _from_host(result, host, info.fresh_results, keep_cpu)
    timeline.charge(op, info, args, kwargs, host.flat, out)
    return out


def _with_device_generator(slot: tuple[int, str], h_args: list, h_kwargs: dict) -> tuple[list, dict]:
    """The host call's arguments with the generator argument set to the device's generator
    (the user's neuron generator, or the default one); a CPU generator is refused."""
    pos, name = slot
    if pos < len(h_args):
        h_args = list(h_args)
        h_args[pos] = rng.device_generator(h_args[pos])
    else:
        h_kwargs = {**h_kwargs, name: rng.device_generator(h_kwargs.get(name))}
    return h_args, h_kwargs


_NOT_RESIZABLE = "Trying to resize storage that is not resizable"


def _grow_outputs(op, info: _OpInfo, args: tuple, kwargs: dict) -> bool:
    """Grow the storage of each written argument of ``op`` to what the op will resize it
    to, found by running the op on meta tensors; HBM is checked before host memory is
    touched (:func:`storage.resize_in_place`). False if the meta kernel cannot say."""
    m_args = [_map_leaves(storage.meta_like, a) for a in args]
    m_kwargs = {k: _map_leaves(storage.meta_like, v) for k, v in kwargs.items()}
    try:
        with warnings.catch_warnings():   # the CPU kernel gives the user its own warnings
            warnings.simplefilter("ignore")
            op(*m_args, **m_kwargs)
    except Exception:   # noqa: BLE001 - no meta kernel (or it disagrees): the kernel resizes the host itself
        return False
    grew = False
    for i, name in info.mutable:
        pairs = (args[i], m_args[i]) if i < len(args) else (kwargs.get(name), m_kwargs.get(name))
        for t, m in zip(*(p if isinstance(p, (list, tuple)) else (p,) for p in pairs)):
            if not (_is_neuron(t) and isinstance(m, torch.Tensor)) or m.numel() == 0:
                continue
            need = t.storage_offset() * t.element_size() + _storage_bytes(m.shape, m.stride(), m.dtype)
            st = t.untyped_storage()
            if need > st.nbytes():
                storage.resize_in_place(st, need, None)   # the kernel writes every element
                grew = True
    return grew


def _map_leaves(fn: Callable, x: Any) -> Any:
    """``fn`` over ``x`` or the items of list or tuple ``x`` (aten nests one level)."""
    if isinstance(x, (list, tuple)):
        return type(x)(fn(y) for y in x)
    return fn(x)


def _wants_neuron(kwargs: dict) -> bool:
    """Whether the op's ``device=`` argument is a neuron device; an index this process
    does not have is refused here, the one place every ``device=`` passes."""
    d = kwargs.get("device")
    if d is None:
        return False
    if not isinstance(d, torch.device):
        d = torch.device(d)
    if d.type != "neuron":
        return False
    if d.index:
        state.check_device_index(d.index)
    return True


def _from_host(result: Any, host: _Host, fresh: bool, keep_cpu: bool) -> Any:
    """Map CPU results back: aliases to their neuron tensors, new tensors adopted (or, where
    they view an argument's memory, made over its neuron storage; ``fresh`` says the
    schema promises new memory, so strided results need no such check)."""
    if isinstance(result, torch.Tensor):
        return _one_from_host(result, host, fresh, keep_cpu)
    if isinstance(result, (tuple, list)):
        mapped = [_from_host(r, host, fresh, keep_cpu) for r in result]
        return type(result)(mapped) if isinstance(result, tuple) else mapped
    return result


def _one_from_host(t: torch.Tensor, host: _Host, fresh: bool, keep_cpu: bool):
    same = host.back.get(id(t))
    if same is not None:
        return same[0]
    if keep_cpu or not t.is_cpu:
        return t
    if t.layout is not _STRIDED:
        return sparse.from_host(t, host.owners())   # compressed results may share index tensors
    if fresh or not host.back:
        return storage.adopt(t)
    st = t.untyped_storage()
    owner = host.owners().get(st.data_ptr()) if st.nbytes() else None
    if owner is not None:
        return storage.on_storage(owner, t.dtype, t.shape, t.stride(), t.storage_offset())
    return storage.adopt(t)


def sync_mutated_args(info: _OpInfo, args: tuple, kwargs: dict, h_args, h_kwargs: dict) -> None:
    """Carry what the CPU kernel did to the host aliases of the op's written arguments
    over to their neuron tensors (see :func:`_sync_mutated`)."""
    for i, name in info.mutable:
        if i < len(args):
            _sync_mutated(args[i], h_args[i])
        elif name in kwargs:
            _sync_mutated(kwargs[name], h_kwargs[name])


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
    ns = neuron.untyped_storage()
    if hs.data_ptr() != ns.data_ptr() or hs.nbytes() != ns.nbytes():
        block = storage.block_of(neuron)
        if block.host is not None and hs._cdata == block.host._cdata:
            storage.follow_host(ns)   # the kernel resized the host storage in place
            new = ns
        else:
            new = storage.neuron_storage(hs)
        storage.rebind(neuron, new, host.shape, host.stride(), host.storage_offset())
    elif host.shape != neuron.shape or host.stride() != neuron.stride() or host.storage_offset() != neuron.storage_offset():
        storage.rebind(neuron, neuron.untyped_storage(), host.shape, host.stride(), host.storage_offset())


def _retry_with_wrapped_numbers(e: Exception, op, run, info: _OpInfo, h_args: tuple, h_kwargs: dict, draws: bool):
    """After the CPU call failed: run it again if PyTorch handed Python numbers for Tensor
    arguments (wrapped numbers, see :func:`edge_ops.wrap_numbers`), else re-raise.
    Returns the arguments of the call and its result."""
    wrapped = edge_ops.wrap_numbers(op, h_args, h_kwargs)
    if wrapped is None:
        _reraise(e, info)
    h_args, h_kwargs = wrapped
    try:
        return h_args, h_kwargs, _call(run, h_args, h_kwargs, draws, info)
    except Exception as e2:   # noqa: BLE001 - whatever the CPU kernel raised, re-raised as the op's error
        _reraise(e2, info)


def _call(run, h_args, h_kwargs: dict, draws: bool, info: _OpInfo) -> Any:
    """``run`` on host arguments; a random op's CPU kernel may take the neuron generator,
    and inside a sharded draw it draws the whole tensor (:class:`rng.sharded_draw`)."""
    if draws:
        with rng.device_draw():
            region = rng.sharded_region()
            if region is not None:
                return region.run(run, info.mutable_pos, list(h_args), h_kwargs)
            return run(*h_args, **h_kwargs)
    return run(*h_args, **h_kwargs)


def _reraise(e: Exception, info: _OpInfo):
    """Errors of the CPU kernel, reworded where they would mention the CPU."""
    msg = str(e)
    if "cpu" in msg.lower() and "device" in msg.lower():
        raise type(e)(msg.replace("cpu", "neuron")) from None
    raise e


# -- ops with their own handling ---------------------------------------------

def _empty(op, info: _OpInfo, args: tuple, kwargs: dict):
    """``empty.memory_format`` / ``empty_strided``: the one place memory is made from nothing.
    Floats and complex numbers nothing wrote read as NaN (see :func:`storage.unwritten_byte`)."""
    size = args[0]
    stride = args[1] if info.name == "aten::empty_strided" else None
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    if stride is None:
        meta = torch.empty(size, dtype=dtype, device="meta", memory_format=kwargs.get("memory_format")
                           or torch.contiguous_format)
        size, stride = meta.shape, meta.stride()
    _wants_neuron(kwargs)
    st = storage.allocate(_storage_bytes(size, stride, dtype), storage.unwritten_byte(dtype))
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
        # the source first: it gets its fill before the destination, which may share its
        # memory, is taken as overwritten
        h_src = storage.host_alias(src) if src.device.type == "neuron" else src
        h_dst = storage.host_alias(dst, overwrite=True) if dst.device.type == "neuron" else dst
        h_dst.copy_(h_src)
        if dst.device.type == "neuron":
            storage.mark_written(dst)
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
    """``Tensor.resize_``, as the CPU does it: the new geometry comes from the same resize
    on a meta tensor (so bad sizes get the CPU's errors); a storage too small for it grows
    in place (:func:`storage.resize_in_place`, HBM checked first), so the base and every
    view see the new memory, and its new bytes read as NaN for floats; a smaller size
    leaves the storage as it is."""
    t, size = args[0], args[1]
    fmt = kwargs.get("memory_format") or (args[2] if len(args) > 2 else None)
    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    meta.resize_(size, memory_format=fmt)
    offset = t.storage_offset()
    st = t.untyped_storage()
    if meta.numel():
        need = offset * t.element_size() + _storage_bytes(meta.shape, meta.stride(), t.dtype)
        if need > st.nbytes():
            storage.resize_in_place(st, need, storage.unwritten_byte(t.dtype))
    storage.rebind(t, st, meta.shape, meta.stride(), offset)
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
    if info.name == "aten::set_.source_Storage_storage_offset":
        _grow_for_set(args, kwargs)
    return op.redispatch(_CPU_KS, *args, **kwargs)


def _grow_for_set(args: tuple, kwargs: dict) -> None:
    """``set_(storage, offset, size, stride)`` past the storage's end grows the storage
    in place, as the CPU's does (HBM checked first). Like the CPU's, it does not where
    the tensor already has that size (and stride, if given): the CPU then raises its
    out-of-bounds error."""
    t, src = args[0], args[1]
    rest = list(args[2:]) + [kwargs[k] for k in ("storage_offset", "size", "stride") if k in kwargs]
    if len(rest) < 2:
        return
    offset, size = rest[0], list(rest[1])
    given = list(rest[2]) if len(rest) > 2 and rest[2] else None
    if list(t.shape) == size and (given is None or list(t.stride()) == given):
        return
    stride = given if given is not None else torch.empty(size, device="meta").stride()
    st = src.untyped_storage() if isinstance(src, torch.TypedStorage) else src
    if any(n == 0 for n in size) or offset < 0:
        return
    need = offset * t.element_size() + _storage_bytes(size, stride, t.dtype)
    if need > st.nbytes():
        storage.resize_in_place(st, need, storage.unwritten_byte(t.dtype))


def _no_time(op, info: _OpInfo, args: tuple, kwargs: dict):
    """Ops that only read metadata: run on the host alias, no device time."""
    host = _Host(info, args, kwargs)
    return op(*host.args, **host.kwargs)


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


def _lazy_clone(op, info: _OpInfo, args: tuple, kwargs: dict):
    """``_lazy_clone`` (copy-on-write) needs a device allocator; a neuron copy is a clone."""
    return _compute(op, info, args, kwargs, host_op=_aten.clone.default)


def _native_dropout(op, info: _OpInfo, args: tuple, kwargs: dict):
    """``native_dropout`` has no generator argument; its host op draws from the device's."""
    return _compute(op, info, args, kwargs, host_op=rng.native_dropout)


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
    "aten::_lazy_clone": _lazy_clone,
    "aten::native_dropout": _native_dropout,
    "aten::convolution_overrideable": _conv,
    "aten::convolution_backward_overrideable": _conv_backward,
    "aten::is_pinned": _no_time,
    "aten::is_set_to": _no_time,
    "aten::_efficientzerotensor": edge_ops.efficient_zeros,
    "aten::histc": edge_ops.histc,
    "aten::histc.out": edge_ops.histc,
    **{f"aten::{name}": edge_ops.rnn_cell for name in edge_ops._RNN_CELLS},
    "aten::_to_sparse": sparse.to_sparse,
    "aten::_to_sparse.sparse_dim": sparse.to_sparse,
}


# Structured ops' functional and in-place forms have CompositeExplicitAutogradNonFunctional
# kernels that call ``empty`` and then the ``out=`` form, so without a kernel of their own
# each would reach the fallback twice. They get the fallback as their neuron kernel, on
# the first op (registering some 440 kernels would slow ``import torch``).
_direct_lib: torch.library.Library | None = None
_direct_lock = threading.Lock()


def _register_direct() -> None:
    global _direct_lib
    with _direct_lock:   # the first ops of two threads: register once
        if _direct_lib is not None:
            return
        lib = torch.library.Library("aten", "IMPL")
        _direct_lib = lib
        _register_direct_kernels(lib)


def _register_direct_kernels(lib: torch.library.Library) -> None:
    for qual in torch._C._dispatch_get_all_op_names():
        if not qual.startswith("aten::") or torch._C._dispatch_has_kernel_for_dispatch_key(qual, "PrivateUse1"):
            continue
        structured = torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CompositeExplicitAutogradNonFunctional")
        # a _foreach_ op is one multi-tensor kernel launch on a device, not one op per tensor
        foreach = qual.startswith("aten::_foreach_") and \
            torch._C._dispatch_has_kernel_for_dispatch_key(qual, "CompositeExplicitAutograd")
        if not (structured or foreach):
            continue
        op = overload(qual)
        if torch.Tag.inplace_view in op.tags:
            continue   # as_strided_ only changes metadata: its composite kernel, no device time
        lib.impl(qual.removeprefix("aten::"), kernel_for(op), "PrivateUse1")


def overload(name: str) -> torch._ops.OpOverload:
    """The aten op overload named ``name`` (``"aten::add.Tensor"``, ``"add.Tensor"``, ``"exp"``)."""
    base, _, over = name.removeprefix("aten::").partition(".")
    return getattr(getattr(_aten, base), over or "default")


def kernel_for(op: torch._ops.OpOverload, handler: Callable | None = None) -> Callable:
    """A kernel to register for ``op`` that hands it and its arguments to ``handler``
    (default: :func:`fallback`)."""
    fn = handler if handler is not None else fallback

    def kernel(*args, **kwargs):
        return fn(op, *args, **kwargs)

    return kernel


# Ops with a CompositeExplicitAutograd kernel that would win over the fallback ("name" or
# "name.overload").
_OVERRIDES = ("convolution_overrideable", "convolution_backward_overrideable",
              # the CPU has a fused kernel; the composite one decomposes into ops that each
              # round to the tensor's dtype, so bf16 results differ from the CPU's
              "native_layer_norm", "native_group_norm", "addr", "addr.out", "linalg__powsum",
              # the composite one would ask the device for pinned memory for non_blocking copies to the CPU
              "_to_copy",
              # the composite one would ask the device for an allocator (copy-on-write storage)
              "_lazy_clone",
              # the composite one is one ``mm.out`` per group; a device runs one grouped kernel
              "_grouped_mm")


def register_overrides(lib: torch.library.Library) -> None:
    """Register the fallback itself as the neuron kernel of :data:`_OVERRIDES`."""
    for name in _OVERRIDES:
        lib.impl(name, kernel_for(overload(name)), "PrivateUse1")
