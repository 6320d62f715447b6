"""Neuron storages: host memory accounted against the simulated HBM.

A neuron tensor is a plain ``torch.Tensor`` whose StorageImpl points at a host (CPU)
buffer. The buffer and its HBM account hang off the Python storage object, which
PyTorch keeps alive as long as the StorageImpl lives, so views, detach and
in-place ops all share it, and the bytes are returned when the last user goes.
"""

from __future__ import annotations

import operator

from typing import Any

import torch

from trnsim.backend import state

_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_SET_BOXED = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed
_construct = torch._C._construct_storage_from_data_pointer
_create_empty = torch._C._acc.create_empty_tensor


_CPU_DEVICE = torch.device("cpu")
_DEVICE: list[torch.device] = []


def _device() -> torch.device:
    if not _DEVICE:
        _DEVICE.append(torch.device("neuron", 0))
    return _DEVICE[0]


class HbmBlock:
    """One allocation of simulated HBM: the host storage that backs it and its size.

    ``host`` is a CPU ``UntypedStorage`` (None in timing fidelity, where no data is
    kept). Dropping the block returns its bytes to the device's account.
    """

    __slots__ = ("host", "nbytes", "aliases", "fixed", "unwritten", "shrunk", "__weakref__")

    def __init__(self, host: torch.UntypedStorage | None, nbytes: int) -> None:
        state.memory.allocate(nbytes)
        self.host = host
        self.nbytes = nbytes
        # CPU tensors over ``host``, by (dtype, shape, stride, offset): made once, reused
        # by every op that reads that view (see host_alias)
        self.aliases: dict[tuple, torch.Tensor] = {}
        # a CPU storage over ``host``'s memory that a kernel cannot resize (see host_alias)
        self.fixed: torch.UntypedStorage | None = None
        # the byte nothing-written memory must read as, until it is filled in (see allocate)
        self.unwritten: int | None = None
        # the storage was resized down, so tensors made before may reach past its end;
        # only then are views checked against its size (see host_alias)
        self.shrunk = False

    def fill_unwritten(self) -> None:
        """Give memory that nothing wrote its ``unwritten`` byte, before it is first read."""
        if self.unwritten is not None:
            if self.host is not None and self.nbytes:
                torch.empty(0, dtype=torch.uint8).set_(self.host).fill_(self.unwritten)
            self.unwritten = None

    def regrow(self, nbytes: int) -> None:
        """Account for ``host`` having been resized in place to ``nbytes``."""
        if nbytes != self.nbytes:
            state.memory.reallocate(self.nbytes, nbytes)
            self.nbytes = nbytes

    def __del__(self) -> None:
        try:
            state.memory.free(self.nbytes)
        except Exception:  # noqa: BLE001 - interpreter shutdown: the account is gone already
            pass


# Memory nothing wrote holds all-ones bytes: a NaN in every float and complex dtype but
# the "fnuz" float8s, whose one NaN is 0x80. Integers and bool are left as they come
# (uninitialised, as on the CPU).
_UNWRITTEN = 0xFF
_UNWRITTEN_FNUZ = 0x80
_FNUZ = {getattr(torch, n) for n in ("float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)}


def unwritten_byte(dtype: torch.dtype) -> int | None:
    """The byte that fills memory nothing wrote, for tensors of ``dtype`` (so that
    floats read as NaN, not as a plausible zero), or None to leave it as it comes."""
    if dtype in _FNUZ:
        return _UNWRITTEN_FNUZ
    if dtype.is_floating_point or dtype.is_complex:
        return _UNWRITTEN
    return None


def allocate(nbytes: int, fill: int | None = None) -> torch.UntypedStorage:
    """A new neuron storage of ``nbytes`` that reads as bytes ``fill`` until written
    (None: uninitialised).

    HBM is checked first, so an allocation that does not fit raises
    ``torch.OutOfMemoryError`` before any host memory is touched. Timing fidelity
    keeps no host memory. The fill is lazy: an op that overwrites the whole storage
    first (``zeros`` is ``empty`` and ``zero_``; an ``out=`` argument) skips it, and
    anything else fills it in before it runs (see :func:`host_alias`)."""
    state.memory.check(nbytes)   # before touching host memory (HbmBlock accounts it after)
    if state.fidelity() == "timing":
        return timing_storage(nbytes)
    st = neuron_storage(torch.empty(nbytes, dtype=torch.uint8).untyped_storage())
    st._trnsim_block.unwritten = fill
    return st


def block_of(t: torch.Tensor) -> HbmBlock:
    """The HBM block behind neuron tensor ``t``."""
    return t.untyped_storage()._trnsim_block


def neuron_storage(host: torch.UntypedStorage) -> torch.UntypedStorage:
    """A neuron storage over the memory of the CPU storage ``host`` (zero-copy)."""
    nbytes = host.nbytes()
    block = HbmBlock(host, nbytes)
    st = _construct(host.data_ptr(), _device(), nbytes)
    st._trnsim_block = block
    return st


def follow_host(st: torch.UntypedStorage) -> None:
    """Re-point neuron storage ``st`` at its block's host memory after a CPU kernel resized
    that host storage in place (an ``out=`` argument growing). The StorageImpl itself takes
    the new memory, so every tensor on it follows, as on the CPU (none is left pointing at
    the freed memory), and the block's account follows the new size."""
    block = st._trnsim_block
    host = block.host
    block.aliases.clear()
    block.fixed = None
    try:
        block.regrow(host.nbytes())
    except torch.OutOfMemoryError:
        # past HBM: the host storage gives the memory back (its first bytes are the old
        # ones), so nothing is left pointing at freed memory and the account stays exact
        host.resize_(block.nbytes)
        _point(st, host.data_ptr(), host.nbytes())
        raise
    _point(st, host.data_ptr(), host.nbytes())


def _point(st: torch.UntypedStorage, ptr: int, nbytes: int) -> None:
    """Give the StorageImpl of neuron storage ``st`` the ``nbytes`` at ``ptr``
    (``_swap_data_ptr_`` swaps sizes too, so through a zero-byte storage)."""
    if st.nbytes():
        st._swap_data_ptr_(_construct(0, _device(), 0))
    if nbytes:
        st._swap_data_ptr_(_construct(ptr, _device(), nbytes))


def storage_size(size: object) -> int:
    """``size`` as a storage size in bytes, refused as the CPU refuses it: a float,
    bool, tensor or string is a RuntimeError, as is a negative size."""
    if isinstance(size, (bool, torch.Tensor)) or not hasattr(size, "__index__"):
        raise RuntimeError(f"resize_ expects an int, but got {type(size).__name__} ({size!r}); pass a whole "
                           "number of bytes")
    n = operator.index(size)
    if n < 0:
        raise RuntimeError(f"resize_ expects a size of at least 0 bytes, but got {n}")
    return n


def resize_in_place(st: torch.UntypedStorage, nbytes: int, fill: int | None = _UNWRITTEN) -> None:
    """Resize neuron storage ``st`` to ``nbytes`` in place, as the CPU resizes a storage:
    the StorageImpl itself takes the new memory, so every tensor on it (the base and each
    view) sees it, the first bytes are kept and the HBM account follows. Bytes past the
    old end are ``fill`` (None: uninitialised). ``UntypedStorage.resize_`` (FSDP2 frees
    unsharded parameters with ``resize_(0)`` and brings them back with ``resize_(n)``),
    ``Tensor.resize_``, ``set_`` and ``out=`` arguments growing all come here.

    The new memory is a new HBM block, made before anything changes, so running out of
    HBM raises ``torch.OutOfMemoryError`` before host memory is touched and leaves ``st``
    as it was; the StorageImpl then takes the new block's memory (``_swap_data_ptr_``,
    through a zero-byte storage since it swaps sizes too) and the old block is freed when
    nothing else uses it.
    """
    old_block = st._trnsim_block
    old = st.nbytes()
    if nbytes == old:
        return
    keep_data = old_block.host is not None if old else state.fidelity() != "timing"
    state.memory.check(nbytes)   # before touching host memory
    # a freed storage keeps an empty host storage where it keeps data: a block with no host
    # means timing fidelity to the rest of the backend (Tensor.resize_ would then give it no data)
    host = torch.empty(nbytes, dtype=torch.uint8).untyped_storage() if keep_data else None
    block = HbmBlock(host, nbytes)
    block.shrunk = old_block.shrunk or nbytes < old
    keep = min(old, nbytes)
    if old_block.unwritten is not None and (nbytes <= old or fill == old_block.unwritten):
        block.unwritten = old_block.unwritten   # still nothing written: nothing to copy or fill
    elif host is not None:
        old_block.fill_unwritten()
        new_bytes = torch.empty(0, dtype=torch.uint8).set_(host)
        if keep and old_block.host is not None:
            new_bytes[:keep].copy_(torch.empty(0, dtype=torch.uint8).set_(old_block.host)[:keep])
        if fill is not None and nbytes > keep:
            if keep:
                new_bytes[keep:].fill_(fill)
            else:
                block.unwritten = fill   # nothing kept: filled lazily, as allocate does
    _point(st, host.data_ptr() if host is not None else 0, nbytes)
    st._trnsim_block = block


def timing_storage(nbytes: int) -> torch.UntypedStorage:
    """A neuron storage of ``nbytes`` with no host memory (timing fidelity)."""
    block = HbmBlock(None, nbytes)
    st = _construct(0, _device(), nbytes)
    st._trnsim_block = block
    return st


def on_storage(st: torch.UntypedStorage, dtype: torch.dtype, size, stride, offset: int) -> torch.Tensor:
    """A neuron tensor viewing neuron storage ``st``."""
    t = _create_empty(size, dtype)
    _SET_BOXED(_CPU, t, st, offset, size, stride)
    return t


def adopt(cpu: torch.Tensor) -> torch.Tensor:
    """A neuron tensor that takes over the memory of CPU tensor ``cpu`` (zero-copy), with
    its lazy conjugate/negative bits.

    ``cpu`` is not kept as a host alias: aliases sit on the block's one fixed CPU storage
    (see :func:`host_alias`), not on the resizable one the kernel made.
    """
    st = neuron_storage(cpu.untyped_storage())
    t = on_storage(st, cpu.dtype, cpu.shape, cpu.stride(), cpu.storage_offset())
    if cpu.is_conj() or cpu.is_neg():
        return carry_math_bits(cpu, t)
    return t


def carry_math_bits(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Give ``dst`` the lazy conjugate and negative bits of ``src`` (they live on the
    TensorImpl, so a tensor rebuilt over the same memory loses them); returns ``dst``."""
    if src.is_conj():
        torch._C._set_conj(dst, True)
    if src.is_neg():
        torch._C._set_neg(dst, True)
    return dst


def rebind(t: torch.Tensor, st: torch.UntypedStorage, size, stride, offset: int) -> None:
    """Point neuron tensor ``t`` at storage ``st`` with new geometry (in place)."""
    _SET_BOXED(_CPU, t, st, offset, size, stride)


_MAX_ALIASES = 16   # views of one storage kept; more are made afresh (KV-cache slices, say)


def host_alias(t: torch.Tensor, fresh: bool = False, growable: bool = False, overwrite: bool = False) -> torch.Tensor:
    """A CPU tensor aliasing the host memory of neuron tensor ``t`` (zero-copy).

    Aliases are cached on the HBM block by view geometry, since making one costs more
    than most small ops. ``fresh=True`` makes a new one that is not cached: use it for
    arguments a kernel may re-point or reshape (``out=`` and in-place arguments). All
    aliases of a block sit on one CPU storage the kernel cannot resize (``block.fixed``):
    PyTorch's overlap checks then see readers and writers of one memory as one storage,
    and an ``out=`` argument that must grow makes the kernel fail before it allocates
    host memory (the caller grows it through :func:`resize_in_place`, which checks HBM
    first). ``growable=True`` gives an uncached alias on the host storage itself, for a
    kernel that must resize the host memory itself (then see :func:`follow_host`).

    A tensor whose storage is smaller than its view (the storage was resized down under
    it, ``untyped_storage().resize_(0)``) raises the RuntimeError the CPU's views raise.

    Memory nothing wrote yet gets its fill (see :func:`allocate`) before the alias is
    made, unless ``overwrite`` says the op writes every element of ``t`` without reading
    it and ``t`` covers the whole storage: then the fill is skipped, and the caller marks
    the memory written (:func:`mark_written`) once the op has succeeded, so an op that
    fails leaves it to read as unwritten, not as whatever the host memory held.
    """
    st = t.untyped_storage()
    block = st._trnsim_block
    if block.unwritten is not None and not (overwrite and covers_storage(t)):
        block.fill_unwritten()
    host = block.host
    if host is None:
        if st.nbytes() == 0:
            check_in_bounds(t, 0)
            return carry_math_bits(t, torch.empty_strided(t.shape, t.stride(), dtype=t.dtype))
        raise state.no_data_error()
    dtype, shape, stride, offset = t.dtype, t.shape, t.stride(), t.storage_offset()
    if not growable:
        # Every alias that is not growable sits on one CPU StorageImpl per block, so PyTorch's
        # own overlap checks (``add(a[:4], 1, out=a[1:5])``) see readers and writers of one
        # memory as one storage, as they would on the CPU.
        if block.fixed is None:
            block.fixed = _construct(host.data_ptr(), _CPU_DEVICE, host.nbytes())
        host = block.fixed
    if fresh or growable or t.is_conj() or t.is_neg():
        if block.shrunk:
            check_in_bounds(t, block.nbytes)
        return carry_math_bits(t, torch.empty(0, dtype=dtype).set_(host, offset, shape, stride))
    key = (dtype, shape, stride, offset)
    alias = block.aliases.get(key)
    if alias is None:
        if block.shrunk:
            check_in_bounds(t, block.nbytes)
        alias = torch.empty(0, dtype=dtype).set_(host, offset, shape, stride)
        if len(block.aliases) >= _MAX_ALIASES:
            block.aliases.clear()
        block.aliases[key] = alias
    return alias


def meta_like(x: Any) -> Any:
    """A meta tensor with the shape, strides and dtype of strided tensor ``x`` (to ask an
    op's meta kernel what it would do); anything else as it is."""
    if isinstance(x, torch.Tensor) and x.layout is torch.strided:
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def covers_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` is every byte of its storage, in order."""
    return t.storage_offset() == 0 and t.numel() * t.element_size() == t.untyped_storage().nbytes() \
        and t.is_contiguous()


def mark_written(t: torch.Tensor) -> None:
    """After an op wrote all of ``t`` (an alias taken with ``overwrite=True``): its memory
    no longer needs the unwritten fill."""
    if covers_storage(t):
        t.untyped_storage()._trnsim_block.unwritten = None


def check_in_bounds(t: torch.Tensor, nbytes: int) -> None:
    """Raise the CPU's RuntimeError if the view of ``t`` reaches past the ``nbytes`` of
    its storage (only a storage resized down under a tensor is that small)."""
    if t.numel() == 0:
        return
    offset, itemsize = t.storage_offset(), t.element_size()
    need = (offset + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * itemsize
    if need > nbytes:
        raise RuntimeError(
            f"setStorage: sizes {list(t.shape)}, strides {list(t.stride())}, storage offset {offset}, and itemsize "
            f"{itemsize} requiring a storage size of {need} are out of bounds for storage of size {nbytes}; the "
            "storage was resized down (untyped_storage().resize_) after this tensor was made: resize it back "
            f"to at least {need} bytes before using the tensor")
