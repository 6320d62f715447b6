"""Sparse compressed tensors (CSR, CSC, BSR, BSC) on the ``neuron`` device.

A compressed neuron tensor is PyTorch's own SparseCsrTensorImpl whose index and value
tensors are ordinary neuron tensors (``.to("neuron")`` of a CPU one builds it, as does
``torch.sparse_compressed_tensor`` on neuron components). Ops on it reach
:func:`fallback`, registered for ``SparseCsrPrivateUse1``:

- the accessors (``crow_indices``, ``values``, ...) and other views run the
  SparseCsrCPU kernels on the neuron tensor itself, so they return neuron views;
- every other op runs its CPU kernel on CPU compressed tensors built over zero-copy
  aliases of the components; compressed results come back as neuron compressed tensors
  over adopted components, dense ones are adopted as usual. The op is charged a
  bandwidth estimate of the bytes it moves.

Sparse COO tensors cannot be made on neuron: PyTorch has no SparsePrivateUse1 kernel to
build one, and a Python device cannot add it, so ops that would return one
(``to_sparse()``) raise :func:`coo_unsupported`'s error.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from trnsim.backend import storage, timeline
from trnsim.backend.edge_ops import OnHost

_SPARSE_CSR_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCsrCPU)
_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
_CPU = torch.device("cpu")
_aten = torch.ops.aten


def _components(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(compressed indices, plain indices, values) of compressed tensor ``t``, as views."""
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        pair = (_aten.crow_indices.default, _aten.col_indices.default)
    else:
        pair = (_aten.ccol_indices.default, _aten.row_indices.default)
    if t.device.type == "neuron":
        return (pair[0].redispatch(_SPARSE_CSR_CPU, t), pair[1].redispatch(_SPARSE_CSR_CPU, t),
                _aten.values.default.redispatch(_SPARSE_CSR_CPU, t))
    return pair[0](t), pair[1](t), _aten.values.default(t)


def _compressed(parts, like: torch.Tensor) -> torch.Tensor:
    return torch.sparse_compressed_tensor(*parts, like.shape, layout=like.layout, check_invariants=False)


class _Charged:
    """What the timeline needs of an op: its name (a name no kernel claims, so the op
    gets the bandwidth estimate)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def fallback(dense_fallback: DenseFallback, op, *args, **kwargs):
    """The neuron kernel of every op called with a compressed neuron tensor
    (``dense_fallback``: what it takes from the fallback of dense tensors)."""
    info = dense_fallback.info_of(op)
    if info.kind == "view":
        return op.redispatch(_SPARSE_CSR_CPU, *args, **kwargs)
    flat, spec = tree_flatten((args, kwargs))
    for i, name in info.mutable:
        target = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(target, torch.Tensor) and target.layout in _COMPRESSED:
            raise NotImplementedError(
                f"{info.name}: in-place and out= ops that write a sparse compressed neuron tensor are not "
                "supported; use the functional form of the op")
    owners: dict[int, Any] = {}
    dense: list[torch.Tensor] = []   # the bytes the op reads, for its time

    def host(x: torch.Tensor) -> torch.Tensor:
        # a fresh alias where requires_grad is set on it: a cached one is shared with
        # every later op on that view (and may be an inference tensor)
        a = storage.host_alias(x, fresh=x.requires_grad)
        if x.untyped_storage().nbytes():
            owners[a.untyped_storage().data_ptr()] = x.untyped_storage()
        dense.append(x)
        return a

    # requires_grad is carried over: some sparse kernels save what their backward needs
    # only when an input requires grad (sparse.mm's amax/amin argmax)
    host_flat = []
    for x in flat:
        if isinstance(x, torch.Tensor) and x.device.type == "neuron":
            if x.layout in _COMPRESSED:
                host_flat.append(_compressed([host(c) for c in _components(x)], x).requires_grad_(x.requires_grad))
            elif x.layout == torch.strided:
                host_flat.append(host(x).requires_grad_(x.requires_grad))
            else:
                host_flat.append(x)
        elif isinstance(x, torch.device) and x.type == "neuron":
            host_flat.append(_CPU)
        else:
            host_flat.append(x)
    h_args, h_kwargs = tree_unflatten(host_flat, spec)
    result = op(*h_args, **h_kwargs)
    dense_fallback.sync_mutated_args(info, args, kwargs, h_args, h_kwargs)   # dense out= tensors may be resized
    ids = {id(h): n for h, n in zip(host_flat, flat) if h is not n}
    out = ids.get(id(result)) if isinstance(result, torch.Tensor) and id(result) in ids else _back(result, owners)
    timeline.charge(op, _Charged(f"{info.name} (sparse)"), (), {}, dense, _dense_parts(out))
    return out


def from_host(t: torch.Tensor, owners: dict[int, Any]) -> torch.Tensor:
    """A non-strided CPU result of a dense neuron op (``to_sparse_csr()``) as a neuron
    tensor; ``owners`` maps host storage pointers to the neuron storages they alias."""
    return _back(t, owners)


def _back(r: Any, owners: dict[int, Any]) -> Any:
    """CPU results as neuron tensors: views of argument memory re-pointed at it, new
    memory adopted, compressed tensors rebuilt over neuron components."""
    if isinstance(r, (tuple, list)):
        mapped = [_back(x, owners) for x in r]
        return type(r)(mapped) if isinstance(r, tuple) else mapped
    if not isinstance(r, torch.Tensor) or r.device.type != "cpu":
        return r
    if r.layout in _COMPRESSED:
        return _compressed([_back(c, owners) for c in _components(r)], r)
    if r.layout != torch.strided:
        raise coo_unsupported(str(r.layout))
    st = r.untyped_storage()
    owner = owners.get(st.data_ptr()) if st.nbytes() else None
    if owner is not None:
        return storage.carry_math_bits(r, storage.on_storage(owner, r.dtype, r.shape, r.stride(), r.storage_offset()))
    return storage.adopt(r)


def _dense_parts(out: Any) -> list[torch.Tensor]:
    parts = []
    for x in tree_flatten(out)[0]:
        if isinstance(x, torch.Tensor):
            parts.extend(_components(x) if x.layout in _COMPRESSED else (x,))
    return parts


def coo_unsupported(what: str) -> NotImplementedError:
    """The error for an op whose result would be a sparse COO (or other non-strided,
    non-compressed) tensor on neuron."""
    return NotImplementedError(
        f"{what}: sparse COO tensors are not supported on neuron (PyTorch has no SparsePrivateUse1 kernels "
        "to build one); run it on the CPU, or use a compressed layout (to_sparse_csr())")


def to_sparse(op, info, args: tuple, kwargs: dict):
    """``_to_sparse`` of a dense neuron tensor: compressed layouts as any op, COO (the
    default) a clear error rather than a CPU result."""
    if kwargs.get("layout") in _COMPRESSED:
        return OnHost(None)
    raise coo_unsupported(info.name)


def _composite_sparse_ops() -> list[str]:
    """Ops with a SparseCsrCPU kernel and a composite one, which would win over the
    fallback for compressed neuron tensors (``values()``, ``sin``, ``mm``, ...)."""
    names = []
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
        try:
            if (torch._C._dispatch_has_kernel_for_dispatch_key(name, "SparseCsrCPU")
                    and (torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd")
                         or torch._C._dispatch_has_kernel_for_dispatch_key(
                             name, "CompositeExplicitAutogradNonFunctional"))):
                names.append(name)
        except RuntimeError:  # a schema the dispatcher does not know (TorchScript builtins)
            pass
    return [n for n in names if n not in ("aten::_pin_memory", "aten::is_pinned")]


@dataclass(frozen=True)
class DenseFallback:
    """What the compressed-tensor fallback takes from the dense one
    (:mod:`trnsim.backend.dispatch`, which installs it): an op's schema facts, the sync
    of written arguments, and how kernels are made for op overloads."""

    info_of: Callable[[Any], Any]
    sync_mutated_args: Callable[..., None]
    kernel_for: Callable[[Any, Callable], Callable]
    overload: Callable[[str], Any]


def install(fallback_lib: torch.library.Library, aten_lib: torch.library.Library, dense: DenseFallback) -> None:
    """Register :func:`fallback` for compressed neuron tensors: as the key's fallback
    (``fallback_lib``, the global ``_`` IMPL library) and as the kernel of the ops whose
    composite kernel would otherwise win (``aten_lib``, an ``aten`` IMPL library)."""
    handler = functools.partial(fallback, dense)
    fallback_lib.fallback(handler, "SparseCsrPrivateUse1")
    for name in _composite_sparse_ops():
        aten_lib.impl(name.removeprefix("aten::"), dense.kernel_for(dense.overload(name), handler),
                      "SparseCsrPrivateUse1")
