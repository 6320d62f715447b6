"""Neuron tensors across pickling, ``torch.save``, processes and DLPack.

PyTorch pickles a tensor through its storage. Three places need the device's help,
and get it through PyTorch's own hooks:

- **Writing and reading a storage's bytes** (``pickle``, ``copy.deepcopy`` of objects
  that pickle their tensors, ``torch.save(..., _use_new_zipfile_serialization=False)``):
  PyTorch's C++ reader and writer reach a device storage through a second StorageImpl
  over the same pointer, which trnsim cannot see. A neuron storage is written from a
  CPU copy, as a CUDA storage is, so the file is a plain checkpoint, and read straight
  into its host memory.
- **Multiprocessing queues** (``torch.multiprocessing``, fork and spawn): a neuron
  storage is shared, as a CUDA storage is through CUDA IPC. Its host memory moves into
  shared memory, and the other process rebuilds a neuron storage over the same bytes
  (registering the device first, so a spawned child needs no ``import trnsim``).
  Writes on either side are seen by the other.
- **DLPack** export is refused with ``BufferError``, the exception the DLPack
  protocol names for it: the memory is host memory behind a simulated device, and
  DLPack has no device code for it; labelling it as CPU memory would give a consumer
  a "CPU" array of a tensor that PyTorch says is on another device. Export ``t.cpu()``.

Tensors made under ``TRNSIM_FIDELITY=timing`` have no values, so none of these can
carry them: each raises one ``RuntimeError`` that says why and what to do.
"""

from __future__ import annotations

import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable

import torch
import torch.multiprocessing.reductions as mp_reductions

_TIMING_MESSAGE = (
    "cannot {what} a neuron tensor made under TRNSIM_FIDELITY=timing: it has a shape, dtype and "
    "simulated memory but no values to write; make it under fidelity 'op' or 'instruction' (or save "
    "shapes and dtypes yourself, e.g. as meta tensors with t.to('meta'))")


def timing_error(what: str) -> RuntimeError:
    """The one error for carrying a data-less (timing fidelity) neuron storage away."""
    return RuntimeError(_TIMING_MESSAGE.format(what=what))


def _has_no_data(st: torch.UntypedStorage) -> bool:
    """True for a neuron storage with bytes but no host memory (made under timing fidelity)."""
    return st.nbytes() > 0 and st._trnsim_block.host is None


# -- pickle and torch.save ----------------------------------------------------

_write_file: Callable = torch.UntypedStorage._write_file


def _write_neuron_file(self: torch.UntypedStorage, *args: Any, **kwargs: Any) -> Any:
    """``UntypedStorage._write_file`` (the legacy format's storage writer): neuron storages
    are written from a CPU copy."""
    if self.device.type != "neuron":
        return _write_file(self, *args, **kwargs)
    return _write_file(self.cpu(), *args, **kwargs)


_set_from_file: Callable = torch.UntypedStorage._set_from_file


def _set_neuron_from_file(self: torch.UntypedStorage, *args: Any, **kwargs: Any) -> Any:
    """``UntypedStorage._set_from_file`` (the legacy format's storage reader): a neuron
    storage is filled through its host memory."""
    if self.device.type != "neuron":
        return _set_from_file(self, *args, **kwargs)
    _set_from_file(self._trnsim_block.host, *args, **kwargs)
    return self


_tensor_reduce_ex: Callable = torch.Tensor.__reduce_ex__


_COMPRESSED = {torch.sparse_csr: "crow_indices", torch.sparse_bsr: "crow_indices",
               torch.sparse_csc: "ccol_indices", torch.sparse_bsc: "ccol_indices"}


def _reduce_ex(self: torch.Tensor, proto: int) -> Any:
    """``Tensor.__reduce_ex__`` (pickle and both ``torch.save`` formats): a data-less
    neuron tensor is refused before anything is written, and a compressed sparse one is
    pickled as its neuron parts, as a CPU one is. (PyTorch would pickle a CPU copy and
    move it back on load, which the legacy format does before it has read the bytes.)"""
    if self.device.type == "neuron":
        compressed = _COMPRESSED.get(self.layout)
        if compressed is not None and type(self) is torch.Tensor:
            plain = "col_indices" if compressed == "crow_indices" else "row_indices"
            parts = (getattr(self, compressed)(), getattr(self, plain)(), self.values(), self.size())
            return torch._utils._rebuild_sparse_tensor, (self.layout, parts)
        if self.layout is torch.strided and _has_no_data(self.untyped_storage()):
            raise timing_error("save or pickle")
    return _tensor_reduce_ex(self, proto)


_storage_copy: Callable = torch.UntypedStorage.copy_


def _copy_storage(self: torch.UntypedStorage, src: Any, non_blocking: bool | None = None) -> torch.UntypedStorage:
    """``UntypedStorage.copy_`` (``clone``, ``cpu``, ``copy.deepcopy``): between data-less
    neuron storages it copies nothing (as tensor copies do under timing fidelity); reading
    values out of one is refused."""
    src_empty = isinstance(src, torch.UntypedStorage) and src.device.type == "neuron" and _has_no_data(src)
    dst_empty = self.device.type == "neuron" and _has_no_data(self)
    if src_empty or dst_empty:
        if src_empty and not dst_empty and self.nbytes():
            raise timing_error("copy the values of")
        return self
    return _storage_copy(self, src) if non_blocking is None else _storage_copy(self, src, non_blocking)


# -- multiprocessing ---------------------------------------------------------

_torch_reduce_storage: Callable = mp_reductions.reduce_storage
# host storage (by its StorageImpl) -> the neuron storage rebuilt over it in this process
_rebuilt: dict[int, weakref.ref] = {}


def reduce_storage(st: torch.UntypedStorage) -> tuple:
    """Reduce a storage for a ``torch.multiprocessing`` queue: neuron storages are shared
    through shared host memory; every other storage takes PyTorch's own path."""
    if st.device.type != "neuron":
        return _torch_reduce_storage(st)
    from trnsim.backend import storage

    if _has_no_data(st):
        raise timing_error("send to another process")
    block = st._trnsim_block
    # the fill goes in before the memory is shared: filled later, it would land on what the
    # other process wrote meanwhile
    block.fill_unwritten()
    host = block.host
    if not host.is_shared():
        # moves the bytes to shared memory (a new address) before the pickler does it,
        # so the neuron storage can be pointed at them
        host.share_memory_()
        storage.follow_host(st)
    return rebuild_storage, (host,)


def rebuild_storage(host: torch.UntypedStorage) -> torch.UntypedStorage:
    """The receiving side: a neuron storage over the shared host memory ``host`` (one per
    host storage, so views sent apart still share it)."""
    from trnsim.backend import register, storage

    register()
    ref = _rebuilt.get(host._cdata)
    st = ref() if ref is not None else None
    if st is None:
        st = storage.neuron_storage(host)
        key = host._cdata
        _rebuilt[key] = weakref.ref(st, lambda _r: _rebuilt.pop(key, None))
    return st


# -- DLPack ------------------------------------------------------------------

_dlpack: Callable = torch.Tensor.__dlpack__
_dlpack_device: Callable = torch.Tensor.__dlpack_device__
_to_dlpack: Callable = torch.utils.dlpack.to_dlpack


def dlpack_error(t: torch.Tensor) -> BufferError:
    """The refusal of a DLPack export (``BufferError``, as the DLPack protocol asks)."""
    return BufferError(
        f"cannot export a {t.device} tensor through DLPack: its memory is the simulated device's (host memory "
        "behind the simulated chip), and DLPack has no device code for it; export a CPU copy with t.cpu()")


def _dlpack_method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    if self.device.type == "neuron":
        raise dlpack_error(self)
    return _dlpack(self, *args, **kwargs)


def _dlpack_device_method(self: torch.Tensor) -> Any:
    if self.device.type == "neuron":
        raise dlpack_error(self)
    return _dlpack_device(self)


def _to_dlpack_fn(tensor: torch.Tensor) -> Any:
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "neuron":
        raise dlpack_error(tensor)
    return _to_dlpack(tensor)


def install() -> None:
    """Install the neuron paths into PyTorch's pickling, multiprocessing and DLPack hooks."""
    torch.UntypedStorage._write_file = _write_neuron_file
    torch.UntypedStorage._set_from_file = _set_neuron_from_file
    torch.UntypedStorage.copy_ = _copy_storage
    torch.Tensor.__reduce_ex__ = _reduce_ex
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)
    torch.Tensor.__dlpack__ = _dlpack_method
    torch.Tensor.__dlpack_device__ = _dlpack_device_method
    torch.utils.dlpack.to_dlpack = _to_dlpack_fn
