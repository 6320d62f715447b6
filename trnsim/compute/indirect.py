"""What an indirect DMA (:class:`~trnsim.isa.DmaIndirect`) computes: a gather or scatter
of an HBM tensor through an index tile.

The indexed side's element at position ``i`` sits at ``offset + sum_k i_k * stride_k``
with the indexed dim's term ``indices[i_dim] * step`` (see the instruction). An index
outside ``0..bound - 1`` raises IndexError, as NKI's own simulator does (with numpy's
words, naming the first element it would reach; its cause, a ProgramError, names the
index, its position and the fix), or with ``skip`` moves nothing for that index.
Duplicate indices of a scatter leave the last write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from trnsim.errors import ProgramError, UninitializedReadWarning, warn
from trnsim.isa import DmaIndirect, View

if TYPE_CHECKING:
    from trnsim.compute.machine import Machine


def addresses(side: View, dim: int, index: NDArray[np.int64], step: int) -> NDArray[np.int64]:
    """The element address of each position of ``side`` (shape ``side.shape``) when
    position ``j`` of dim ``dim`` is ``index[j] * step``."""
    addr = np.full(side.shape, side.offset, dtype=np.int64)
    for k, (stride, count) in enumerate(side.dims):
        term = index * step if k == dim else np.arange(count, dtype=np.int64) * stride
        shape = [1] * len(side.dims)
        shape[k] = count
        addr = addr + term.reshape(shape)
    return addr


def _check_bounds(inst: DmaIndirect, index: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Which indices are in bounds; raises IndexError for the first that is not, unless ``skip``."""
    ok = (index >= 0) & (index < inst.bound)
    if ok.all() or inst.skip:
        return ok
    j = int(np.flatnonzero(~ok)[0])
    side = inst.indirect
    t = side.tensor
    where = f" ({inst.source})" if inst.source else ""
    why = ProgramError(f"instruction {inst.index} dma_indirect{where}: index {int(index[j])} at position {j} of "
                       f"{inst.indices!r} is outside 0..{inst.bound - 1}, the rows of {t!r} it may choose; keep "
                       "the indices in range, or pass oob_mode=nisa.oob_mode.skip to leave such rows untouched")
    # NKI's simulator raises IndexError in numpy's words; kernels' tests catch exactly that
    raise IndexError(f"index {side.offset + int(index[j]) * inst.step} is out of bounds for axis 0 with size "
                     f"{t.size}") from why


def dma_indirect(m: Machine, inst: DmaIndirect) -> None:
    """Carry out ``inst`` on the memories of ``m``."""
    side = inst.indirect
    t = side.tensor
    index = m.read(inst.indices).reshape(-1).astype(np.int64)
    ok = _check_bounds(inst, index)
    keep = np.broadcast_to(ok.reshape([-1 if k == inst.dim else 1 for k in range(len(side.dims))]),
                           side.shape).reshape(-1)
    addr = addresses(side, inst.dim, np.where(ok, index, 0), inst.step).reshape(-1)
    flat = m.memory.elements(t)
    if inst.scatter:
        bits = _converted(m, m.read_raw(inst.src).reshape(-1), inst.src, inst.dst)
        flat[addr[keep]] = bits[keep]
        m.memory.mark_elements(t, addr[keep])
        return
    if not m.memory.elements_written(t, addr[keep]):
        warn(m.program.source_names(
            f"{m.program.name!r}: instruction {inst.index} dma_indirect reads rows of {t!r} that nothing wrote; "
            "they read as NaN (0 for integer dtypes), undefined on the chip; write the HBM tensor before "
            "gathering from it"), UninitializedReadWarning)
    bits = _converted(m, flat[addr], inst.src, inst.dst)
    if not keep.all():
        old = m.read_raw(inst.dst).reshape(-1)
        bits = np.where(keep, bits, old)
    m.write_raw(inst.dst, bits.reshape(inst.dst.shape))


def _converted(m: Machine, bits: NDArray[np.generic], src: View, dst: View) -> NDArray[np.generic]:
    """``src``'s bit patterns as ``dst``'s: floats convert through fp32, as every DMA does."""
    if src.dtype is dst.dtype:
        return bits
    wide = m.backend.decode(bits, src.dtype).astype(np.float32).astype(np.float64)
    return np.asarray(m.backend.encode(wide, dst.dtype))
