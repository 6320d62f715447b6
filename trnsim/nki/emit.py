"""The shared machinery of ``nl`` and ``nisa``: making tiles, emitting instructions,
masks, and matmul results waiting to land in PSUM.

Both styles of NKI end up here: value-returning calls make a fresh destination
tile and emit into it; destination-passing calls emit into the tile given.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Sequence

import numpy as np

from trnsim import dtypes
from trnsim.isa import (Activation, ActivationFunc, AluOp, DmaIndirect, Engine, Instruction, Memory, Memset, MultiplyMoving,
                        LoadStationary, ReduceOp, TensorCopy, TensorReduce, TensorScalar, TensorTensor, Transpose, View,
                        pe_rows)
from trnsim.nki.tiles import Mask, NkiTensor, _Placement
from trnsim.nki.tracer import KernelError, Tracer, caller_source, current


def tracer() -> Tracer:
    return current()


def dtype_of(value: Any, default: dtypes.DType | None = None) -> dtypes.DType:
    if value is None:
        if default is None:
            raise KernelError("a dtype is needed here")
        return default
    try:
        return dtypes.as_dtype(value)
    except Exception as e:  # noqa: BLE001 - whatever the dtype is, the kernel line is at fault
        raise tracer().fail(str(e)) from None


def new_tensor(shape: Sequence[int], dtype: Any, buffer: Memory = Memory.SBUF, name: str | None = None,
               bases: tuple | None = None, serial: int | None = None, private: bool = False) -> NkiTensor:
    """Place a tensor and wrap it. An HBM tensor is the one every instance of a launch
    grid shares (made by the first), but a ``private`` one on the cores of a logical
    NeuronCore (``nl.private_hbm``), which each core makes for itself."""
    tr = tracer()
    shape = tuple(int(s) for s in shape)
    if not shape:
        shape = (1, 1)
    if buffer is not Memory.HBM and len(shape) == 1:
        shape = (shape[0], 1)
    private = private and tr.team is not None
    if buffer is Memory.HBM and not private:
        shared = tr.shared_hbm(shape, dtype_of(dtype))
        if shared is not None:
            return shared
    t = tr.place(shape, dtype_of(dtype), buffer, name, serial)
    placement = _Placement(tr, t)
    result = NkiTensor(placement, t.view(), bases)
    if buffer is Memory.HBM and not private:
        tr.hbm_made.append(result)
    return result


def like(x: NkiTensor, dtype: Any = None, buffer: Memory = Memory.SBUF, shape: Sequence[int] | None = None) -> NkiTensor:
    """A fresh tile shaped like ``x`` (same index bases, so masks still apply)."""
    return new_tensor(shape or x.shape, dtype_of(dtype, x.dtype), buffer, bases=None if shape else x.bases)


def readable(x: Any, what: str = "operand") -> NkiTensor:
    """An on-chip tile to read: results are materialised, HBM is refused."""
    if isinstance(x, NkiTensor):
        if x.view.tensor.memory is Memory.HBM:
            raise tracer().fail(f"{what} {x.name}{list(x.shape)} is in HBM; engines read SBUF/PSUM only, so nl.load it first")
        return x
    if isinstance(x, MatmulResult):
        return x.materialize()
    raise tracer().fail(f"{what} {x!r} is not a tile; pass a tile (nl.load it first) or a number where one is allowed")


def emit(inst: Any) -> int:
    return tracer().emit(inst)


def clip(mask: Mask | None, *tiles: NkiTensor) -> list[View]:
    """The views of ``tiles`` restricted to where ``mask`` holds.

    A mask works on the instruction's iteration space, as NKI's compiler reads it: a
    condition on an ``nl.arange`` index bounds the axis each tile was indexed with it
    on, and a condition on an index no tile was indexed with (tiles sliced with ``:``)
    bounds the axis of the index grid that index sits on (``[:, None, None]`` axis 0,
    ``[None, :, None]`` axis 1, ...) in every tile."""
    if mask is None:
        return [t.view for t in tiles]
    return [t.view[i] for t, i in zip(tiles, _clip_index(mask, tiles))]


def _clip_index(mask: Mask, tiles: Sequence[NkiTensor]) -> list[tuple[slice, ...]]:
    ranges = _ranges(mask)
    grid = mask.grid_axes()
    ref = {b: next((t.bases.index(b) for t in tiles if b in t.bases), grid[b]) for b in ranges}
    return [_index(t, ranges, ref) for t in tiles]


def clip_rows(mask: Mask | None, full: Sequence[NkiTensor], rows: Sequence[Any]) -> tuple[list[View], list[Any]]:
    """``full`` clipped as :func:`clip` does, and ``rows`` (per-partition operands and
    results: a [P, 1] bias or scalar operand, max8's [P, 8]; tiles or views) clipped to
    the partitions the mask keeps of ``full[0]``; numbers and None pass unchanged."""
    if mask is None:
        return [t.view for t in full], [r.view if isinstance(r, NkiTensor) else r for r in rows]
    index = _clip_index(mask, full)
    kept = index[0][:1]
    return ([t.view[i] for t, i in zip(full, index)],
            [r.view[kept] if isinstance(r, NkiTensor) else r[kept] if isinstance(r, View) else r for r in rows])


def partition_rows(v: Any, partitions: int) -> Any:
    """A per-partition operand (a [P', 1] bias, scale, scalar operand or bound) of an
    instruction over ``partitions`` partitions: its first ``partitions`` when it has more,
    as the engine reads one value for each partition it works on, from the operand's
    first (nki-library passes a [128, 1] zero bias to a range_select over 81 rows);
    anything else unchanged."""
    if isinstance(v, NkiTensor):
        v = v.view
    if isinstance(v, View) and v.partitions > partitions:
        return v[0:partitions]
    return v


def _ranges(mask: object) -> dict[int, tuple[int, int]]:
    if not isinstance(mask, Mask):
        raise tracer().fail(f"mask {mask!r} is not a condition on nl.arange indices or loop counters "
                            "(such as i_p + 128 * k < n)")
    if any(expr.single() is None for expr, _ in mask.conds):
        raise tracer().fail("a mask condition relating two indices (such as i_p >= i_f) cannot clip an access to a "
                            "box; mask with nisa.affine_select, or give each index its own bound")
    return mask.ranges()


def _index(t: NkiTensor, ranges: dict[int, tuple[int, int]], ref: dict[int, int],
           kept: int | None = None) -> tuple[slice, ...]:
    """The slices of ``t`` where each base stays in its range: on the axis ``t`` was
    indexed with the base on, else on axis ``ref[base]`` (bases missing from ``ref``
    bound nothing in ``t``); only axes below ``kept`` when it is given."""
    shape = t.view.shape
    bounds: dict[int, tuple[int, int]] = {}
    for b, (lo, hi) in ranges.items():
        if b in t.bases:
            axis = t.bases.index(b)
        elif b in ref and (kept is None or ref[b] < kept):
            axis = ref[b]
        else:
            continue
        if axis >= len(shape):
            raise tracer().fail(f"the mask bounds axis {axis} of the index grid, and {t.name}{list(shape)} has "
                                f"{len(shape)} axes; place the mask's nl.arange on an axis of the tile "
                                "([:, None] the partitions, [None, :] the first free axis)")
        old_lo, old_hi = bounds.get(axis, (0, shape[axis]))
        lo, hi = min(max(lo, old_lo), shape[axis]), min(hi, old_hi)
        bounds[axis] = (lo, max(lo, hi))
    return tuple(slice(*bounds[a]) if a in bounds else slice(None) for a in range(len(shape)))


def clip_result(mask: Mask | None, out: NkiTensor, kept: int | None = None, named: Any = ()) -> View:
    """The part of ``out`` that a mask keeps: the rows (or kept free indices) the mask
    leaves out are not written, as on the chip. Bases in ``named`` (those the operands
    were indexed with) bound ``out`` only where ``out`` carries them; other bases bound
    their index-grid axis, below ``kept`` (a reduction's kept axes) when given."""
    if mask is None:
        return out.view
    ranges = _ranges(mask)
    ref = {b: a for b, a in mask.grid_axes().items() if b not in set(named)}
    return out.view[_index(out, ranges, ref, kept)]


def restricted(t: Any, mask: Mask | None, named: Any = ()) -> Any:
    """Tile ``t`` restricted to where ``mask`` holds (see :func:`clip_result`); other
    values pass through."""
    if mask is None or not isinstance(t, NkiTensor):
        return t
    return NkiTensor(t._placement, clip_result(mask, t, named=named), t.bases)


def named_bases(*values: Any) -> set[int]:
    """The ``nl.arange`` bases the tiles among ``values`` were indexed with."""
    return {b for v in values if isinstance(v, NkiTensor) for b in v.bases if b is not None}


def masked(fn: Any) -> Any:
    """``fn`` with ``mask=``: it runs on the tiles restricted to the mask, and its result
    lands in the masked part of a full-size tile (elements outside are not written)."""
    def wrapper(*args: Any, mask: Mask | None = None, **kwargs: Any) -> NkiTensor:
        if mask is None:
            return fn(*args, **kwargs)
        args = tuple(readable(a) if isinstance(a, MatmulResult) else a for a in args)
        named = named_bases(*args)
        part = fn(*(restricted(a, mask, named) for a in args), **kwargs)
        ref = next(a for a in args if isinstance(a, NkiTensor))
        out = like(ref, part.dtype)
        copy_to(clip_result(mask, out, named=named), part.view, engine=None)
        return out

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def maskable(fn: Any) -> Any:
    """``fn`` taking NKI's ``mask=`` as a Python bool as well: a condition on loop counters
    alone (``mask=(2 * i + g) * 128 < seqlen``) is one while a kernel is traced. True
    masks nothing; False masks everything, so the call emits nothing (NKI's compiler
    skips the instruction): a tile it returns holds whatever its memory held, and
    ``t[...] = `` or ``t += `` of such a tile leaves ``t`` as it was."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("mask")
        if not isinstance(mask, (bool, np.bool_)):
            return fn(*args, **kwargs)
        del kwargs["mask"]
        if mask:
            return fn(*args, **kwargs)
        tr = tracer()
        tr.masked_off_depth += 1
        try:
            result = fn(*args, **kwargs)
            return result.materialize() if isinstance(result, MatmulResult) else result
        finally:
            tr.masked_off_depth -= 1

    return wrapper


def take_bool_masks(namespace: dict[str, Any], names: Sequence[str]) -> None:
    """Wrap the functions of ``namespace`` named in ``names`` that take ``mask=`` (or any
    keyword) with :func:`maskable`."""
    for name in names:
        fn = namespace.get(name)
        if not inspect.isfunction(fn):
            continue
        params = inspect.signature(fn).parameters.values()
        if any(p.name == "mask" or p.kind is p.VAR_KEYWORD for p in params):
            namespace[name] = maskable(fn)


def check_overrun(hbm: NkiTensor, mask: Mask | None, what: str) -> None:
    """An index past the end of an HBM tensor is fine only under a mask that keeps the access inside."""
    if mask is None and any(hbm.overrun) and not tracer().masked_off_depth:   # mask=False: nothing is accessed
        axis, over = next((i, o) for i, o in enumerate(hbm.overrun) if o)
        raise tracer().fail(f"{what}: the index into {hbm.name}{list(hbm.tensor.shape)} runs {over} elements past its end "
                            f"on axis {axis}; pass mask= (such as i_p + base < n) to keep the access inside")


def move(dst: Any, src: Any, mask: Any = None, skip: bool = False) -> None:
    """DMA ``src`` into ``dst``, restricted to ``mask``; one side may be indirect."""
    tr = tracer()
    dst_v, src_v = clip(mask, dst, src)
    if dst.indirect is None and src.indirect is None:
        if dst_v.size:
            tr.dma(dst_v, src_v)
        return
    if dst.indirect is not None and src.indirect is not None:
        raise tr.fail(f"DMA from {src.name} into {dst.name}: both sides are indexed through tiles; an indirect DMA "
                      "gathers or scatters one side: gather into SBUF first, then scatter")
    scatter = dst.indirect is not None
    side, ind = (dst, dst.indirect) if scatter else (src, src.indirect)
    index = ind.index.view
    if mask is not None:
        lo, hi = mask.ranges().get(side.bases[ind.dim], (0, index.partitions))
        index = index[lo:hi]
    if not dst_v.size:
        return
    if src_v.size != dst_v.size:
        raise tr.fail(f"DMA of {list(src_v.shape)} into {list(dst_v.shape)}: sizes differ")
    if side.view.tensor.memory is not Memory.HBM:
        raise tr.fail(f"{side.name}: the indexed side of an indirect DMA must be in HBM")
    tr.emit(DmaIndirect(dst_v, src_v, tr.next_queue(dst_v), indices=index, dim=ind.dim, step=ind.step,
                        bound=ind.bound, scatter=scatter, skip=skip))


def _placed(inst: Instruction, engine: Engine | None) -> int:
    """Emit ``inst`` on ``engine``, or on the engine the compiler picks when None
    (:mod:`trnsim.nki.workload`)."""
    if engine is None:
        return tracer().emit(inst, choose=True)
    return tracer().emit(inst)


def copy_to(dst: View, src: View, engine: Engine | None = Engine.VECTOR) -> int:
    return _placed(TensorCopy(dst, src, engine=engine or Engine.VECTOR), engine)


def activation(dst: View, src: View, func: ActivationFunc, bias: View | None = None, scale: float | View = 1.0,
               reduce_op: ReduceOp | None = None, reduce_dst: View | None = None) -> int:
    return emit(Activation(dst, src, func, bias, scale, reduce_op, reduce_dst, engine=Engine.SCALAR))


def tensor_tensor(dst: View, a: View, b: View, op: AluOp, engine: Engine | None = Engine.VECTOR) -> int:
    return _placed(TensorTensor(dst, a, b, op, engine=engine or Engine.VECTOR), engine)


def tensor_scalar(dst: View, src: View, op0: AluOp, operand0: Any, op1: AluOp | None = None, operand1: Any = None,
                  reverse0: bool = False, engine: Engine | None = Engine.VECTOR) -> int:
    return _placed(TensorScalar(dst, src, op0, operand0, op1, operand1, reverse0, engine=engine or Engine.VECTOR), engine)


def memset(dst: View, value: float, engine: Engine | None = Engine.VECTOR) -> int:
    return _placed(Memset(dst, value, engine=engine or Engine.VECTOR), engine)


def reduce(dst: View, src: View, op: ReduceOp, num_axes: int, engine: Engine = Engine.VECTOR,
           negate: bool = False) -> int:
    return emit(TensorReduce(dst, src, op, num_axes, negate, engine=engine))


def transpose(dst: View, src: View) -> int:
    return emit(Transpose(dst, src, engine=Engine.TENSOR))


def matmul(dst: View, stationary: View, moving: View, accumulate: bool, double_row: bool = False) -> int:
    """Load ``stationary`` [K, M] and stream ``moving`` [K, N] into ``dst`` [M, N] (PSUM);
    ``double_row``: [K, 2, M] and [K, 2, N], a contraction of 2K (fp8 on NC-v3 and later)."""
    tr = tracer()
    tr.emit(LoadStationary(stationary, double_row, engine=Engine.TENSOR))
    return tr.emit(MultiplyMoving(dst, moving, accumulate, double_row, engine=Engine.TENSOR))


def flat2d(v: View) -> View:
    """A view of [P, f1, f2, ...] seen as [P, f1 * f2 * ...] when its free part is contiguous."""
    if len(v.dims) <= 2:
        return v
    run = v.contiguous_run()
    if run != v.free_size:
        raise tracer().fail(f"{v!r} is not contiguous inside each partition; copy it to a fresh tile first")
    return View(v.tensor, v.offset, (v.dims[0], (1, v.free_size)))


class MatmulResult:
    """``nl.matmul``'s result before it lands: ``+=`` accumulates it into a PSUM tile,
    any other use puts it in a fresh PSUM tile."""

    def __init__(self, stationary: View, moving: View, keep: tuple[NkiTensor, ...] = (), transpose: bool = False,
                 double_row: bool = False) -> None:
        self.stationary = stationary
        self.moving = moving
        self._keep = keep  # the operand tiles stay placed until the result lands
        self.double_row = double_row   # [K, 2, M] and [K, 2, N] operands: the fp8 double-row mode
        rows = pe_rows(double_row)
        self.shape = (stationary.free_size // rows, moving.free_size // rows)
        # transpose mode (nc_matmul(is_transpose=True), moving an identity) moves the
        # stationary's values through the PE array: its PSUM tile may keep their dtype
        self.transpose = transpose
        self.dtype = stationary.dtype if transpose else dtypes.float32
        self._tile: NkiTensor | None = None
        self._tile_written = False
        self._serial: int | None = None
        self._source = ""   # the kernel line that asked for it, when held (nisa.nc_matmul)

    def write_into(self, dst: NkiTensor, accumulate: bool) -> None:
        tr = tracer()
        if tr.pending_matmul is self:
            tr.pending_matmul = None
        if dst is not self._tile and not self._tile_written:
            self._tile = None  # landed in the kernel's tile: a reserved one is not needed
        if dst.buffer is not Memory.PSUM:
            raise tr.fail(f"matmul results accumulate in PSUM; {dst.name} is in {dst.buffer.value.upper()} "
                          "(PSUM accumulation group misuse): make the accumulator with buffer=nl.psum")
        if dst.view.partitions != self.shape[0] or dst.view.free_size != self.shape[1]:
            raise tr.fail(f"matmul result is {list(self.shape)} but the accumulator {dst.name} slice is "
                          f"[{dst.view.partitions}, {dst.view.free_size}] (PSUM accumulation group misuse)")
        if id(dst.tensor) in tr.zeros:
            # a zero accumulator: the first matmul over all of it starts the group; a
            # matmul into part of it adds to the zeros the tracer writes first
            accumulate = not tr.covers_whole(dst.view)
        elif accumulate and not tr.written(dst.view):
            accumulate = False
        tr.source_override = self._source
        try:
            if self.transpose:
                transpose(dst.view, self.stationary)
            else:
                matmul(dst.view, self.stationary, self.moving, accumulate, self.double_row)
        finally:
            tr.source_override = ""
        self._keep = ()

    def accumulate_into(self, dst: NkiTensor) -> None:
        self.write_into(dst, accumulate=True)

    def reserve(self) -> None:
        """Place the fresh PSUM tile now if it fits (where an eager result would go), else
        when the result lands; either way under the number this tile has now."""
        tr = tracer()
        self._serial = tr.new_tile()
        self._source = caller_source()
        if tr.program.psum_alloc.fits(0, self.shape[0], self.shape[1] * self.dtype.itemsize):
            self._tile = new_tensor(self.shape, self.dtype, Memory.PSUM, serial=self._serial)

    def materialize(self) -> NkiTensor:
        tile = self._tile
        if tile is None:
            tile = self._tile = new_tensor(self.shape, self.dtype, Memory.PSUM, serial=self._serial)
        if not self._tile_written:
            self.write_into(tile, accumulate=False)
            self._tile_written = True
        return tile

    def __getattr__(self, name: str) -> Any:
        # any other use of the result is a use of the tile it lands in
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    def __getitem__(self, index: object) -> NkiTensor:
        return self.materialize()[index]


def _on_tile(name: str) -> Any:
    def op(self: MatmulResult, *args: Any) -> Any:
        return getattr(self.materialize(), name)(*args)

    op.__name__ = name
    return op


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
              "__mod__", "__pow__", "__neg__"):
    setattr(MatmulResult, _name, _on_tile(_name))
