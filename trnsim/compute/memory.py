"""The bytes of one NeuronCore: SBUF, PSUM and the HBM tensors of a Program.

SBUF and PSUM are uint8 arrays [partitions, partition_bytes] of the chip's
sizes. An on-chip tensor occupies partitions ``start_partition`` onwards, its
free dimensions row-major from ``byte_offset`` in each. Each HBM tensor has a
byte buffer of its own, row-major.

HBM that nothing wrote is undefined on the chip. Here it reads as NaN for float
dtypes (as NKI's own simulator fills it) and as 0 for integer dtypes, which have
no NaN; every HBM tensor but the inputs keeps a mask of the elements written, so
:meth:`CoreMemory.unwritten` can name what a Program left out.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from trnsim.compute.reference import encode
from trnsim.dtypes import Storage
from trnsim.errors import ProgramError
from trnsim.isa import Memory, Tensor, View
from trnsim.program import REGISTER_BYTES, Program


class CoreMemory:
    """SBUF, PSUM and HBM buffers for ``program``'s tensors, read and written through Views.

    SBUF and PSUM start zeroed; HBM tensors other than inputs start as NaN (0 for
    integer dtypes) and record which elements are written.
    """

    def __init__(self, program: Program) -> None:
        chip = program.chip
        # per physical core; past SBUF's last byte: engine registers (Program.registers)
        self.sbufs = [np.zeros((chip.sbuf.partitions, chip.sbuf.partition_bytes + REGISTER_BYTES), dtype=np.uint8)
                      for _ in range(max(program.cores, 1))]
        self.psums = [np.zeros((chip.psum.partitions, chip.psum.partition_bytes), dtype=np.uint8)
                      for _ in range(max(program.cores, 1))]
        self.sbuf, self.psum = self.sbufs[0], self.psums[0]
        self.hbm: dict[int, NDArray[np.uint8]] = {}
        self._written: dict[int, NDArray[np.bool_]] = {}
        self._tensors: set[int] = set()
        self._program_name = program.name
        inputs = {id(t) for t in program.inputs}
        # an alias (Program.hbm_alias) shares its base's bytes; a write through it counts
        # its base as written (the elements differ in size, so the whole of it)
        self._alias_of = dict(program.aliases)
        for t in program.tensors:
            self._tensors.add(id(t))
            if t.memory is Memory.HBM:
                base = self._alias_of.get(id(t))
                if base is not None:
                    self.hbm[id(t)] = self.hbm[id(base)]
                    continue
                self.hbm[id(t)] = _undefined(t)
                if id(t) not in inputs:
                    self._written[id(t)] = np.zeros(t.size, dtype=bool)

    def mark_written(self, view: View) -> None:
        """Record that ``view`` (of an HBM tensor) was written."""
        base = self._alias_of.get(id(view.tensor)) if self._alias_of else None
        if base is not None:
            if id(base) in self._written:
                self._written[id(base)][...] = True
            return
        mask = self._written.get(id(view.tensor))
        if mask is not None and view.size:
            np.ndarray(view.shape, dtype=bool, buffer=mask, offset=view.offset,
                       strides=tuple(s for s, _ in view.dims))[...] = True

    def all_written(self, view: View) -> bool:
        """Whether every element of ``view`` was written (always, for inputs and on-chip tensors)."""
        mask = self._written.get(id(view.tensor))
        if mask is None or not view.size:
            return True
        return bool(np.ndarray(view.shape, dtype=bool, buffer=mask, offset=view.offset,
                               strides=tuple(s for s, _ in view.dims)).all())

    def elements(self, tensor: Tensor) -> Storage:
        """All of HBM tensor ``tensor`` as a flat numpy view of its storage (writes go through)."""
        flat: Storage = self.hbm[id(tensor)].view(tensor.dtype.storage)
        return flat

    def mark_elements(self, tensor: Tensor, addresses: NDArray[np.int64]) -> None:
        """Record that the elements at flat ``addresses`` of HBM ``tensor`` were written."""
        base = self._alias_of.get(id(tensor)) if self._alias_of else None
        if base is not None:
            if id(base) in self._written:
                self._written[id(base)][...] = True
            return
        mask = self._written.get(id(tensor))
        if mask is not None:
            mask[addresses] = True

    def elements_written(self, tensor: Tensor, addresses: NDArray[np.int64]) -> bool:
        """Whether every element at flat ``addresses`` of HBM ``tensor`` was written."""
        mask = self._written.get(id(tensor))
        return mask is None or bool(mask[addresses].all())

    def unwritten(self, tensor: Tensor) -> NDArray[np.bool_] | None:
        """A bool array of ``tensor``'s shape, True where nothing wrote (None if all was written
        or the tensor is an input)."""
        mask = self._written.get(id(tensor))
        if mask is None or mask.all():
            return None
        return ~mask.reshape(tensor.shape)

    def array(self, view: View) -> Storage:
        """The elements of ``view`` as a numpy view (shape ``view.shape``, the dtype's storage type).

        Writing to the result writes the simulated memory. Raises ProgramError
        if the view reaches outside its tensor.
        """
        t = view.tensor
        if id(t) not in self._tensors:
            raise ProgramError(f"view {view!r} belongs to no tensor of program {self._program_name!r}; "
                               "make the Machine after adding every tensor")
        storage = t.dtype.storage
        if view.size == 0:
            return np.empty(view.shape, dtype=storage)
        item = t.dtype.itemsize
        if t.on_chip:
            buffer, offset, strides = self._on_chip(view)
        else:
            _check_span(view, view.offset, view.dims, t.size, "the tensor")
            buffer, offset, strides = self.hbm[id(t)], view.offset * item, tuple(s * item for s, _ in view.dims)
        elements: Storage = np.ndarray(view.shape, dtype=storage, buffer=buffer, offset=offset, strides=strides)
        return elements

    def _on_chip(self, view: View) -> tuple[NDArray[np.uint8], int, tuple[int, ...]]:
        t = view.tensor
        mem = (self.sbufs if t.memory is Memory.SBUF else self.psums)[t.core]
        row_bytes = mem.shape[1]
        first, free_offset = divmod(view.offset, t.row_elems)
        if not view.dims:
            raise ProgramError(f"on-chip view {view!r} has no partition dimension; give it one (count 1 for a single partition)")
        (step, count), free = view.dims[0], view.dims[1:]
        if count > 1 and step != t.row_elems:
            raise ProgramError(f"view {view!r} steps {step} elements over partitions; on chip the partition "
                               f"stride must be the tensor's {t.row_elems} elements per partition")
        if first < 0 or first + count > t.shape[0]:
            raise ProgramError(f"view {view!r} covers partitions {first}..{first + count - 1} of {t!r}, "
                               f"which has {t.shape[0]}; fix the view's offset or partition count")
        _check_span(view, free_offset, free, t.row_elems, "each partition of the tensor")
        item = t.dtype.itemsize
        offset = (t.start_partition + first) * row_bytes + t.byte_offset + free_offset * item
        return mem, offset, (row_bytes,) + tuple(s * item for s, _ in free)


def _check_span(view: View, start: int, dims: tuple[tuple[int, int], ...], limit: int, where: str) -> None:
    """Raise unless elements ``start + sum(i_k * stride_k)`` all lie in [0, limit)."""
    lo = start + sum(min(0, s * (c - 1)) for s, c in dims)
    hi = start + sum(max(0, s * (c - 1)) for s, c in dims)
    if lo < 0 or hi >= limit:
        raise ProgramError(f"view {view!r} reaches elements {lo}..{hi} but {where} holds {limit} "
                           f"({view.tensor!r}); fix the view's offset or strides")


def _undefined(t: Tensor) -> NDArray[np.uint8]:
    """The bytes of HBM tensor ``t`` before anything writes it: NaN for floats, 0 for integers."""
    buffer = np.zeros(t.nbytes, dtype=np.uint8)
    if t.dtype.is_float:
        buffer.view(t.dtype.storage)[...] = encode(np.array(np.nan), t.dtype)
    return buffer


def describe_region(missing: NDArray[np.bool_]) -> str:
    """Where ``missing`` (a bool array with a True) is True: ``rows 128:200``, ``columns 5:8``,
    ``elements [2:4, 2:4]``, or a count of elements within such a box."""
    spans = []
    for axis in range(missing.ndim):
        hit = np.flatnonzero(missing.any(axis=tuple(a for a in range(missing.ndim) if a != axis)))
        spans.append((int(hit[0]), int(hit[-1]) + 1))
    full = [lo == 0 and hi == n for (lo, hi), n in zip(spans, missing.shape)]
    box = "[" + ", ".join(f"{lo}:{hi}" for lo, hi in spans) + "]"
    count = int(missing.sum())
    if count != int(np.prod([hi - lo for lo, hi in spans])):
        return f"{count} of {missing.size} elements, within {box},"
    if missing.ndim >= 2 and all(full[1:]):
        return f"rows {spans[0][0]}:{spans[0][1]}"
    if missing.ndim >= 2 and full[0] and all(full[2:]):
        return f"columns {spans[1][0]}:{spans[1][1]}"
    return f"elements {box}"
