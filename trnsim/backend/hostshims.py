"""Pinned host memory for the ``neuron`` device.

PyTorch asks a device's C++ hooks for a pinned-memory allocator, which a pure-Python
device cannot give, so trnsim serves ``Tensor.pin_memory()`` / ``is_pinned()`` for
``neuron`` itself: a pinned tensor is a copy in ordinary host memory that trnsim
remembers as pinned (the simulated host has no pageable/pinned distinction that
changes any time). Requests for other devices go to PyTorch's own kernels. Host
tensors made pinned from the start (``torch.empty(..., pin_memory=True)``, any factory
with ``pin_memory=True``, and the pinned buffers PyTorch's C++ makes, such as DDP's map
of used parameters under ``find_unused_parameters=True``) all reach the CPU kernels of
``empty`` and ``empty_strided``, which make them in ordinary host memory, remembered as
pinned, while ``neuron`` is the accelerator (:func:`_pinned_factory`). That kernel is
installed once the process uses the device (its first op, a ``neuron`` process group,
``Tensor.pin_memory()``, ``trnsim run``), not at ``import torch``:
a factory asking for pinned memory before any of those gets PyTorch's own error.

``torch.load`` onto ``neuron`` (saved neuron tensors, or ``map_location="neuron"``)
would ask the device for an allocator; trnsim's deserializer adopts the loaded host
storage instead. Saved files are plain PyTorch checkpoints.

Storages made directly on the device (``torch.UntypedStorage(n, device="neuron")``,
which ``storage.to(device=...)`` and ``storage.clone()`` use) would also ask for the
allocator; they are made through ``torch.empty`` instead, so their HBM is accounted.
``torch.accelerator``'s device-generic calls (``synchronize``, ``memory_allocated``,
``memory_stats``, ``reset_peak_memory_stats``, ``empty_cache``, ``get_memory_info``) ask
the device's C++ guard and allocator, which a pure-Python device has not; while
``neuron`` is the current accelerator they are answered by ``torch.neuron``'s functions,
as on a device with C++ hooks (:func:`install_accelerator`).

Resizing a neuron storage in place (``UntypedStorage.resize_``, which FSDP2 uses to
free and bring back parameters) would need the device's C++ hooks; trnsim swaps a new
HBM block's memory into the storage instead (:func:`trnsim.backend.storage.resize_in_place`).

``module.to("neuron")`` moves each parameter in place (``param.data = moved``), as it does
between the CPU and CUDA, only where PyTorch deems the two tensors' types compatible, a
list of dense backends that lacks PrivateUse1 (pytorch/pytorch#196975); it otherwise makes
new Parameter objects, which turns a LazyModule's uninitialized parameters into empty
ordinary ones. A neuron tensor is a plain TensorImpl on host memory, so trnsim answers
that check as PyTorch does for CUDA (:func:`_shallow_copy_compatible`).

``Tensor.to("neuron:<LOCAL_RANK>")`` of a tensor already on the process's core returns
the tensor itself, as ``.to`` of a tensor already on the named CUDA device does: PyTorch
numbers the core ``neuron:0``, so it would otherwise see another device and copy, and a
Parameter's copy is a plain tensor (accelerate's ``set_module_tensor_to_device``, which
``device_map`` dispatch uses on rank 1, then finds a module whose parameter is no
Parameter). :func:`_to_own_core` names the core ``neuron:0`` before ``to`` decides.

Under timing fidelity a neuron storage has no data pointer: ``UntypedStorage.fill_``
(refused by PyTorch for such a storage) and ``nn.init.trunc_normal_`` (which redraws
until it reads no value out of range) are served here, as writes that keep no values.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Any

import torch

from trnsim.backend import state

_pinned: dict[int, weakref.ref] = {}
_ORIGINAL = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def _for_neuron(device) -> bool:
    if device is None:
        acc = torch.accelerator.current_accelerator()
        return acc is not None and acc.type == "neuron"
    d = torch.device(device)
    if d.type != "neuron":
        return False
    state.check_device_index(d.index)
    return True


def _pinned_ptr(t: torch.Tensor) -> bool:
    st = t.untyped_storage()
    ref = _pinned.get(st.data_ptr())
    return ref is not None and ref() is not None and st.nbytes() > 0


def _remember_pinned(t: torch.Tensor) -> torch.Tensor:
    st = t.untyped_storage()
    ptr = st.data_ptr()
    _pinned[ptr] = weakref.ref(st, lambda _r, p=ptr: _pinned.pop(p, None))
    return t


def _pin_memory(self: torch.Tensor, device=None) -> torch.Tensor:
    if not _for_neuron(device):
        return torch.ops.aten._pin_memory.default.redispatch(_ORIGINAL, self, device)
    install_pinned_factories()   # a script that pins batches will make pinned tensors too
    out = torch.empty_like(self, memory_format=torch.contiguous_format) if self.numel() else self.clone()
    out.copy_(self)
    return _remember_pinned(out)


def _pinned_factory(kernel: Any):
    """The CPU kernel of ``empty`` / ``empty_strided`` in front of PyTorch's: a request
    for pinned memory (``pin_memory=True``) while ``neuron`` is the accelerator gets
    ordinary host memory remembered as pinned; everything else goes to PyTorch's kernel."""
    def cpu_kernel(keyset, *args, **kwargs):
        if kwargs.get("pin_memory") and _for_neuron(None):
            return _remember_pinned(kernel.call_boxed(keyset, *args, **{**kwargs, "pin_memory": False}))
        return kernel.call_boxed(keyset, *args, **kwargs)

    return cpu_kernel


def _is_pinned(self: torch.Tensor, device=None) -> bool:
    if device is not None and not _for_neuron(device):
        return torch.ops.aten.is_pinned.default.redispatch(_ORIGINAL, self, device)
    return _pinned_ptr(self)


_DENSE = ("cpu", "neuron")


def _shallow_copy_compatible(self: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether ``other``'s TensorImpl may be copied into ``self``'s (``self.data = other``):
    the same kind of tensor, or dense strided tensors on the CPU or ``neuron``."""
    kinds = [(t.device.type, t.layout, t.is_quantized, t.is_nested) for t in (self, other)]
    return kinds[0] == kinds[1] or all(dev in _DENSE and layout == torch.strided and not quantized and not nested
                                       for dev, layout, quantized, nested in kinds)


def _own_core(device: torch.device | None) -> torch.device | None:
    """``neuron:0`` if ``device`` is ``neuron:<LOCAL_RANK>`` (this process's core under
    another index), else ``device``."""
    if device is not None and device.type == "neuron" and device.index and state.check_device_index(device.index) == 0:
        return torch.device("neuron", 0)
    return device


def _to_own_core(op):
    """A kernel for ``op`` (``aten::to.device`` or ``aten::to.dtype_layout``, which
    PyTorch implements from other ops) that names this process's core ``neuron:0``, so
    that ``to`` returns the tensor itself when nothing else changes, then runs PyTorch's
    own implementation."""
    if op is torch.ops.aten.to.device:
        def kernel(self, device, dtype, non_blocking=False, copy=False, memory_format=None):
            return op.decompose(self, _own_core(device), dtype, non_blocking, copy, memory_format)
    else:
        def kernel(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, copy=False,
                   memory_format=None):
            return op.decompose(self, dtype=dtype, layout=layout, device=_own_core(device), pin_memory=pin_memory,
                                non_blocking=non_blocking, copy=copy, memory_format=memory_format)
    return kernel


_lib = None


def install() -> None:
    global _lib
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("_pin_memory", _pin_memory, "CPU")
    _lib.impl("is_pinned", _is_pinned, "CPU")
    _lib.impl("_has_compatible_shallow_copy_type", _shallow_copy_compatible, "PrivateUse1")
    for name, op in (("to.device", torch.ops.aten.to.device), ("to.dtype_layout", torch.ops.aten.to.dtype_layout)):
        # the autograd key (where PyTorch's own implementation runs) and, for inference
        # mode, which skips it, the backend key
        for key in ("AutogradPrivateUse1", "PrivateUse1"):
            _lib.impl(name, _to_own_core(op), key)
    install_serialization()
    install_storage()
    install_accelerator()


_factories_lib: torch.library.Library | None = None
_factories_lock = threading.Lock()


def install_pinned_factories() -> None:
    """Put :func:`_pinned_factory` in front of the CPU kernels of ``empty`` and
    ``empty_strided`` (idempotent). Not at registration: a Python kernel in front of every
    CPU ``empty`` makes small CPU ops about three times slower, and ``import torch`` with
    trnsim installed must cost CPU-only code nothing. The first op on the device and a
    ``neuron`` process group install it, before anything can ask for pinned memory for
    ``neuron`` (a factory's ``pin_memory=True``, DDP's pinned buffers)."""
    global _factories_lib
    if _factories_lib is not None:
        return
    with _factories_lock:   # first ops from many threads at once: one registration
        if _factories_lib is not None:
            return
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # each registration warns that it overrides the CPU kernel
            for name, op in (("empty.memory_format", torch.ops.aten.empty.memory_format),
                             ("empty_strided", torch.ops.aten.empty_strided.default)):
                lib.impl(name, _pinned_factory(torch.library.get_kernel(op, "CPU")), "CPU", with_keyset=True)
        _factories_lib = lib


def _neuron_current() -> bool:
    acc = torch._C._accelerator_getAccelerator()
    return acc is not None and acc.type == "neuron"


def _nested(flat: dict[str, int]) -> dict:
    """``{"a.b.c": 1}`` as ``{"a": {"b": {"c": 1}}}``: the C++ allocator's stats form."""
    out: dict = {}
    for key, value in flat.items():
        *path, last = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _accelerator_calls() -> dict:
    from trnsim.backend import device

    return {
        "_accelerator_synchronizeDevice": lambda index=None: device.synchronize(index),
        "_accelerator_isAllocatorInitialized": lambda: True,
        "_accelerator_getDeviceStats": lambda index=None: _nested(device.memory_stats(index)),
        "_accelerator_resetAccumulatedStats": lambda index=None: device.reset_accumulated_memory_stats(index),
        "_accelerator_resetPeakStats": lambda index=None: device.reset_peak_memory_stats(index),
        "_accelerator_emptyCache": lambda: device.empty_cache(),
        "_accelerator_getMemoryInfo": lambda index=None: device.mem_get_info(index),
        # device indices: checked as torch.neuron checks them (PyTorch's own calls accept any)
        "_accelerator_setDeviceIndex": lambda index: device.set_device(index) if index >= 0 else None,
        "_accelerator_getDeviceIndex": lambda: device.current_device(),
        "_accelerator_exchangeDevice": _exchange_device,
        "_accelerator_maybeExchangeDevice": _exchange_device,
    }


def _exchange_device(index: int) -> int:
    """Make ``index`` current and return the index that was (``torch.accelerator.device_index``)."""
    from trnsim.backend import device

    if index >= 0:
        device.set_device(index)
    return device.current_device()


def install_accelerator() -> None:
    """Answer ``torch.accelerator``'s C++ calls with ``torch.neuron``'s while neuron is the
    current accelerator; other accelerators keep PyTorch's."""
    for name, ours in _accelerator_calls().items():
        original = getattr(torch._C, name, None)
        if original is None or getattr(original, "_trnsim", False):
            continue

        def call(*args, _ours=ours, _original=original):
            return _ours(*args) if _neuron_current() else _original(*args)

        call._trnsim = True
        setattr(torch._C, name, call)


_storage_new = torch.UntypedStorage.__new__
_storage_resize = torch.UntypedStorage.resize_


def _new_storage(cls, *args, device=None, **kwargs):
    if device is not None and torch.device(device).type == "neuron":
        from trnsim.backend import storage

        if args and isinstance(args[0], (float, complex, bool)):
            raise RuntimeError(f"torch.UntypedStorage(): Expected a sequence type, but got "
                               f"{type(args[0]).__name__} ({args[0]!r}); give the size as a whole number of bytes")
        if cls is not torch.UntypedStorage or kwargs or len(args) > 1 or (args and not hasattr(args[0], "__index__")):
            raise TypeError(f"{cls.__name__}(*{args!r}, device={device!r}) is not supported on neuron; make a "
                            "neuron storage as torch.empty(nbytes, dtype=torch.uint8, device='neuron')"
                            ".untyped_storage()")
        nbytes = storage.storage_size(args[0]) if args else 0
        return torch.empty(nbytes, dtype=torch.uint8, device=device).untyped_storage()
    return _storage_new(cls, *args, device=device, **kwargs) if device is not None else \
        _storage_new(cls, *args, **kwargs)


def _resize_storage(self, size: int):
    if self.device.type == "neuron":
        from trnsim.backend import storage

        storage.resize_in_place(self, storage.storage_size(size))
        return self
    return _storage_resize(self, size)


_storage_fill = torch.UntypedStorage.fill_


def _fill_storage(self, value: int):
    """``UntypedStorage.fill_``: PyTorch refuses a storage without a data pointer, which a
    neuron storage made under timing fidelity is; it is the ``fill_`` of a byte tensor over
    the storage, as PyTorch's own does it, timed and keeping no values."""
    if self.device.type == "neuron":
        from trnsim.backend import storage

        storage.on_storage(self, torch.uint8, (self.nbytes(),), (1,), 0).fill_(value)
        return self
    return _storage_fill(self, value)


_trunc_normal = torch.nn.init._no_grad_trunc_normal_


def _trunc_normal_(tensor: torch.Tensor, mean: float, std: float, a: float, b: float, generator=None) -> torch.Tensor:
    """``nn.init.trunc_normal_`` draws again until no value lies outside [a, b], which needs
    values; a tensor made under timing fidelity has none, so it is drawn once (one timed
    ``normal_``), as PyTorch makes sampling a no-op on meta tensors."""
    if type(tensor) is torch.Tensor and tensor.device.type == "neuron" and _no_values(tensor):
        with torch.no_grad():
            return tensor.normal_(mean, std, generator=generator)
    return _trunc_normal(tensor, mean, std, a, b, generator=generator)


def _no_values(t: torch.Tensor) -> bool:
    """Whether plain neuron tensor ``t`` was made under timing fidelity (its storage keeps
    no host values); a storage trnsim did not make counts as holding values."""
    block = getattr(t.untyped_storage(), "_trnsim_block", None)
    return block is not None and block.host is None


def install_storage() -> None:
    torch.UntypedStorage.__new__ = _new_storage
    torch.UntypedStorage.resize_ = _resize_storage
    torch.UntypedStorage.fill_ = _fill_storage
    torch.nn.init._no_grad_trunc_normal_ = _trunc_normal_


def _tag(obj) -> str | None:
    """``torch.save``'s location of a neuron storage, whose bytes it then reads directly
    (so memory nothing wrote gets its fill first)."""
    if getattr(obj, "device", None) is not None and obj.device.type == "neuron":
        block = getattr(obj, "_trnsim_block", None)
        if block is not None:
            block.fill_unwritten()
        return "neuron:0"
    return None


def _deserialize(obj, location: str):
    """``torch.load`` onto ``neuron``: the loaded host storage becomes the device's memory."""
    if not location.startswith("neuron"):
        return None
    from trnsim.backend import storage

    if obj.device.type == "neuron":
        return obj
    return storage.neuron_storage(obj.untyped_storage() if hasattr(obj, "untyped_storage") else obj)


def install_serialization() -> None:
    torch.serialization.register_package(5, _tag, _deserialize)
