"""What each instruction computes: a Program run functionally on one NeuronCore.

A :class:`Machine` holds the SBUF, PSUM and HBM bytes of one core and executes
instructions one at a time, in any order that respects their dependencies
(program order is one). Operands are read as float64 values decoded from their
dtypes; every result is rounded into the destination's dtype by ``encode``.
DMA copies bits, except between float dtypes, which it converts through fp32.
Random instructions draw from one numpy generator per core (seeded 0, reseeded by
``set_rng_seed``): the same program gives the same numbers, but not the hardware's.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from numpy.typing import NDArray

from trnsim.compute.indirect import dma_indirect
from trnsim.compute.numerics import Backend, get_backend
from trnsim.compute.memory import CoreMemory, describe_region
from trnsim.dtypes import Storage, Values, check_values, int_range
from trnsim.errors import ProgramError, UninitializedReadWarning, UnwrittenOutputWarning, warn
from trnsim.isa import (BN_STATS_WIDTH, GATHER_GROUP, SHUFFLE_KEEP, SHUFFLE_QUADRANT, Activation, AffineSelect, AluOp,
                        BlockTranspose, BnAggr, BnStats, DmaCopy, DmaIndirect, Dropout, FindIndex8, Gather, Instruction, Iota,
                        LoadStationary,
                        LocalGather, MatchReplace8, Max8, Memset, MultiplyMoving, NonzeroWithCount, PartitionReduce,
                        RandomUniform, RangeSelect, Reciprocal, ReduceOp, RngSeed, RngState, ScalarTensorTensor, Select,
                        SemaphoreSignal, SemaphoreWait, SequenceBounds, StreamShuffle, Tensor, TensorCopy, TensorReduce,
                        TensorScalar, TensorTensor, TensorTensorScan, Transpose, View)
from trnsim.program import Program


class Machine:
    """The memories of one NeuronCore running ``program``, and the semantics of its instructions.

    ``backend`` names the numeric kernels: ``"numba"`` (compiled) or ``"numpy"``
    (the reference); both give the same bits. SBUF and PSUM start zeroed, HBM other
    than inputs as NaN (see :mod:`trnsim.compute.memory`); load the inputs with
    :meth:`bind`, then :meth:`run` and read outputs with :meth:`result`.
    """

    def __init__(self, program: Program, backend: str = "numba") -> None:
        self.program = program
        self.backend: Backend = get_backend(backend)
        self.memory = CoreMemory(program)
        # Values [K, M] of the PE array's stationary operand, once one is loaded.
        self.stationary: Values | None = None
        # each handler takes an instruction of its class
        self._handlers: dict[type[Instruction], Callable[..., None]] = {
            LoadStationary: self._load_stationary, MultiplyMoving: self._multiply_moving,
            Transpose: self._transpose, Activation: self._activation, TensorTensor: self._tensor_tensor,
            TensorScalar: self._tensor_scalar, TensorReduce: self._tensor_reduce, TensorCopy: self._tensor_copy,
            Memset: self._memset, Iota: self._iota, Select: self._select, AffineSelect: self._affine_select,
            DmaCopy: self._dma_copy, SemaphoreSignal: _no_data, SemaphoreWait: _no_data,
            BnStats: self._bn_stats, BnAggr: self._bn_aggr, TensorTensorScan: self._scan,
            ScalarTensorTensor: self._scalar_tensor_tensor, Max8: self._max8, FindIndex8: self._find_index8,
            MatchReplace8: self._match_replace8, RangeSelect: self._range_select, SequenceBounds: self._sequence_bounds,
            StreamShuffle: self._stream_shuffle, PartitionReduce: self._partition_reduce, RandomUniform: self._random,
            Dropout: self._dropout, RngSeed: self._rng_seed, RngState: self._rng_state, Reciprocal: self._reciprocal,
            NonzeroWithCount: self._nonzero, LocalGather: self._local_gather, Gather: self._gather,
            BlockTranspose: self._transpose, DmaIndirect: lambda inst: dma_indirect(self, inst),
        }
        self.rng = np.random.default_rng(0)

    # -- data in and out ----------------------------------------------------

    def bind(self, tensor: Tensor, array: object) -> None:
        """Load ``array`` (real numbers of ``tensor``'s shape) into ``tensor``, rounded to its dtype."""
        values = np.asarray(array)
        if values.shape != tensor.shape:
            raise ProgramError(f"bind {tensor!r}: the array has shape {list(values.shape)} but the tensor has shape "
                               f"{list(tensor.shape)}; pass an array of shape {list(tensor.shape)}")
        check_values(values, tensor.dtype, f"bind {tensor!r}")
        self.write(tensor.view(), values.astype(np.float64))

    def read(self, view: View) -> Values:
        """The float64 values of ``view``, of shape ``view.shape``."""
        return self.backend.decode(self.memory.array(view), view.dtype)

    def write(self, view: View, values: NDArray[np.floating]) -> None:
        """Round float64 ``values`` (of shape ``view.shape``) to ``view``'s dtype and store them."""
        wide = np.asarray(values, dtype=np.float64)
        _check_shape(view, wide, "values")
        self.memory.array(view)[...] = self.backend.encode(wide, view.dtype)
        self.memory.mark_written(view)

    def read_raw(self, view: View) -> Storage:
        """A copy of the storage (bit patterns) of ``view``, of shape ``view.shape``."""
        bits: Storage = self.memory.array(view).copy()
        return bits

    def write_raw(self, view: View, bits: Storage) -> None:
        """Store bit patterns ``bits`` (``view``'s storage type, of shape ``view.shape``) unchanged."""
        bits = np.asarray(bits)
        _check_shape(view, bits, "bits")
        if bits.dtype != view.dtype.storage:
            raise ProgramError(f"raw write to {view!r}: bits of {bits.dtype} are not {view.dtype.name} storage "
                               f"({view.dtype.storage}); use write() to convert values")
        self.memory.array(view)[...] = bits
        self.memory.mark_written(view)

    def result(self, tensor: Tensor) -> NDArray[np.generic]:
        """The values of ``tensor``: float32 for float dtypes (narrow ones widened), the integer type for ints."""
        bits = self.read_raw(tensor.view())
        if not tensor.dtype.is_float:
            return bits
        return self.backend.decode(bits, tensor.dtype).astype(np.float32)

    def warn_unwritten(self) -> None:
        """Issue an UnwrittenOutputWarning for each output tensor left partly unwritten."""
        for t in self.program.outputs:
            missing = self.memory.unwritten(t)
            if missing is not None:
                fill = "NaN" if t.dtype.is_float else "0"
                warn(self.program.source_names(
                    f"{self.program.name!r}: {describe_region(missing)} of output {t.name} {list(t.shape)} were "
                    f"never written and read as {fill} (undefined on the chip); store every element of the "
                    "output, or mask or pad the shapes the loops do not cover"), UnwrittenOutputWarning)

    # -- execution ------------------------------------------------------------

    def run(self) -> None:
        """Execute every instruction of the program in program order."""
        for inst in self.program.instructions:
            self.execute(inst)

    def execute(self, inst: Instruction) -> None:
        """Carry out the effect of one instruction on the memories."""
        handler = next((self._handlers[c] for c in type(inst).__mro__ if c in self._handlers), None)
        if handler is None:
            raise ProgramError(f"instruction {inst.index} {inst.opcode}: the Machine has no semantics for "
                               f"{type(inst).__name__}; use the instruction classes of trnsim.isa")
        try:
            handler(inst)
        except ProgramError as err:
            raise ProgramError(f"instruction {inst.index} {inst.opcode}: {err}") from err

    def _rows(self, view: View) -> Values:
        """Values of ``view`` as [partitions, free elements]."""
        return self.read(view).reshape(view.partitions, view.free_size)

    def _per_partition(self, operand: float | View, partitions: int) -> Values:
        """A number or a [P, 1] view as float64 [P, 1]."""
        if isinstance(operand, View):
            return self._rows(operand)
        return np.full((partitions, 1), float(operand))

    def _put(self, view: View, values: NDArray[np.floating]) -> None:
        """Write ``values`` in logical order into ``view``, whatever its free shape."""
        if values.size != view.size:
            raise ProgramError(f"{values.size} results do not fit {view!r}, which has {view.size} elements")
        self.write(view, values.reshape(view.shape))

    def _contraction_rows(self, view: View, double_row: bool) -> Values:
        """A matmul operand as [contraction rows, columns]: a double-row [K, 2, X] as
        [2K, X], row ``r * K + k`` from ``[k, r]``."""
        if not double_row:
            return self._rows(view)
        k, x = view.partitions, view.free_size // 2
        rows: Values = self._rows(view).reshape(k, 2, x).transpose(1, 0, 2).reshape(2 * k, x)
        return rows

    def _load_stationary(self, inst: LoadStationary) -> None:
        self.stationary = self._contraction_rows(inst.src, inst.double_row)

    def _multiply_moving(self, inst: MultiplyMoving) -> None:
        if self.stationary is None:
            raise ProgramError("no load_stationary has run; load the stationary tile first")
        moving = self._contraction_rows(inst.src, inst.double_row)
        k, m = self.stationary.shape
        if moving.shape[0] != k:
            raise ProgramError(f"moving {inst.src!r} has {moving.shape[0]} partitions but the stationary has {k}; "
                               "both are the contraction size K")
        if inst.accumulate:
            acc = self._rows(inst.dst)
        else:
            acc = np.zeros((m, moving.shape[1]), dtype=np.float32)
        self._put(inst.dst, self.backend.matmul(acc, self.stationary, moving))

    def _transpose(self, inst: Transpose) -> None:
        self._put(inst.dst, self._rows(inst.src).T)

    def _activation(self, inst: Activation) -> None:
        x = self._rows(inst.src)
        partitions = x.shape[0]
        scale = self._per_partition(inst.scale, partitions)[:, 0]
        bias = np.zeros(partitions) if inst.bias is None else self._per_partition(inst.bias, partitions)[:, 0]
        out = self.backend.activation(x, inst.func, scale, bias)
        bits = self.backend.encode(out, inst.dst.dtype)
        self.write_raw(inst.dst, bits.reshape(inst.dst.shape))
        if inst.reduce_op is not None and inst.reduce_dst is not None:   # a Program gives both or neither
            # The engine reduces what it wrote: the outputs after rounding to dst's dtype.
            rounded = self.backend.decode(bits, inst.dst.dtype)
            self._put(inst.reduce_dst, self.backend.reduce(rounded, inst.reduce_op))

    def _alu(self, a: Values, b: Values, op: AluOp, width: np.dtype[np.integer] | None, native: bool = False) -> Values:
        """``backend.alu(a, b, op)``, a left shift wrapped to the integer type ``width`` (None: no wrap).

        Integer shifts drop the bits shifted out of the operand's width, as C's ``<<`` and numpy's
        ``np.left_shift`` on that dtype do (nki.language.left_shift/right_shift are documented as
        numpy's: "Similar to numpy.left_shift", implementing the C/Python operators; right shifts
        are arithmetic on signed dtypes, logical on unsigned ones, which the int64 shift already
        gives). The result is wrapped, not saturated by the store into the destination dtype.
        """
        out = self.backend.alu(a, b, op)
        if native and AluOp(op) is AluOp.DIVIDE:
            # all-int32/uint32 arithmetic runs in native integers (nki.isa.tensor_tensor's
            # docs: GpSimd's integer arithmetic), so a quotient truncates toward zero as C's
            with np.errstate(all="ignore"):
                return np.trunc(out)
        if width is None or AluOp(op) is not AluOp.LEFT_SHIFT:
            return out
        return out.astype(np.int64).astype(width).astype(np.float64)

    def _tensor_tensor(self, inst: TensorTensor) -> None:
        width = _int_width(inst.a, inst.b)
        native = _native_int(inst.dst, inst.a, inst.b)
        self._put(inst.dst, self._alu(self._rows(inst.a), self._rows(inst.b), inst.op, width, native))

    def _tensor_scalar(self, inst: TensorScalar) -> None:
        x = self._rows(inst.src)
        width = _int_width(inst.src, inst.operand0, inst.operand1)
        native = _native_int(inst.dst, inst.src, inst.operand0, inst.operand1)
        operand0 = self._per_partition(inst.operand0, x.shape[0])
        out = self._alu(operand0, x, inst.op0, width, native) if inst.reverse0 else \
            self._alu(x, operand0, inst.op0, width, native)
        if inst.op1 is not None and inst.operand1 is not None:   # a Program gives both or neither
            out = self._alu(out, self._per_partition(inst.operand1, x.shape[0]), inst.op1, width, native)
        if inst.reduce_op is None or inst.reduce_dst is None:
            self._put(inst.dst, out)
            return
        # the engine reduces what it wrote: the outputs after rounding to dst's dtype
        bits = self.backend.encode(out, inst.dst.dtype)
        self.write_raw(inst.dst, bits.reshape(inst.dst.shape))
        rounded = self.backend.decode(bits, inst.dst.dtype)
        self._put(inst.reduce_dst, self.backend.reduce(rounded.reshape(inst.src.partitions, -1), inst.reduce_op))

    def _tensor_reduce(self, inst: TensorReduce) -> None:
        free = inst.src.shape[1:]
        kept = math.prod(free[: len(free) - inst.num_axes])
        rows = self.read(inst.src).reshape(inst.src.partitions * kept, -1)
        out = self.backend.reduce(rows, inst.op)
        # negating before the rounding to dst's dtype is exact: round to nearest even is symmetric
        self._put(inst.dst, -out if inst.negate else out)

    def _bn_stats(self, inst: BnStats) -> None:
        stats = self.backend.bn_stats(self.read(inst.src).reshape(inst.src.partitions, -1))
        out = np.zeros((inst.src.partitions, BN_STATS_WIDTH))
        out[:, :3] = stats
        self._put(inst.dst, out)

    def _bn_aggr(self, inst: BnAggr) -> None:
        stats = self.read(inst.src).reshape(inst.src.partitions, -1, BN_STATS_WIDTH)[:, :, :3]
        self._put(inst.dst, self.backend.bn_aggr(stats))

    def _tensor_copy(self, inst: TensorCopy) -> None:
        self._put(inst.dst, self.read(inst.src))

    def _memset(self, inst: Memset) -> None:
        self._put(inst.dst, np.full(inst.dst.shape, float(inst.value)))

    def _iota(self, inst: Iota) -> None:
        self._put(inst.dst, _affine(inst.dst.shape, inst.offset, inst.channel_multiplier, inst.steps).astype(np.float64))

    def _select(self, inst: Select) -> None:
        mask = self._rows(inst.mask)
        on_false = self._rows(inst.on_false) if isinstance(inst.on_false, View) else float(inst.on_false)
        self._put(inst.dst, np.where(mask != 0.0, self._rows(inst.on_true), on_false))

    def _affine_select(self, inst: AffineSelect) -> None:
        pattern = _affine(inst.src.shape, inst.offset, inst.channel_multiplier, inst.steps).astype(np.float64)
        keep = self.backend.alu(pattern, np.zeros(()), inst.cmp)
        self._put(inst.dst, np.where(keep != 0.0, self.read(inst.src), float(inst.fill)))

    def _dma_copy(self, inst: DmaCopy) -> None:
        if not self.memory.all_written(inst.src):
            warn(self.program.source_names(
                f"{self.program.name!r}: instruction {inst.index} dma_copy{_at(inst)} reads {inst.src!r}, "
                "parts of which nothing wrote; they read as NaN (0 for integer dtypes), undefined on the "
                "chip; write the HBM tensor before reading it"), UninitializedReadWarning)
        bits = self.read_raw(inst.src)
        if bits.size != inst.dst.size:
            raise ProgramError(f"copies {bits.size} elements into {inst.dst!r}, which has {inst.dst.size}; sizes must match")
        if inst.src.dtype is not inst.dst.dtype:
            wide = self.backend.decode(bits, inst.src.dtype).astype(np.float32).astype(np.float64)
            self.write(inst.dst, wide.reshape(inst.dst.shape))
            return
        self.write_raw(inst.dst, bits.reshape(inst.dst.shape))

    def _scan(self, inst: TensorTensorScan) -> None:
        a = self._rows(inst.a)
        initial = self._per_partition(inst.initial, a.shape[0])[:, 0]
        out = self.backend.scan(a, self._rows(inst.b), initial, inst.op0, inst.op1, inst.reverse0, inst.reverse1)
        self._put(inst.dst, out)

    def _scalar_tensor_tensor(self, inst: ScalarTensorTensor) -> None:
        x = self._rows(inst.src)
        operand0 = self._per_partition(inst.operand0, x.shape[0])
        width = _int_width(inst.src, inst.operand0)
        t = self._alu(operand0, x, inst.op0, width) if inst.reverse0 else self._alu(x, operand0, inst.op0, width)
        t = t.astype(np.float32).astype(np.float64)   # the engine computes in fp32
        b = self._rows(inst.b)
        width = _int_width(inst.src, inst.operand0, inst.b)
        self._put(inst.dst, self._alu(b, t, inst.op1, width) if inst.reverse1 else self._alu(t, b, inst.op1, width))

    def _local_gather(self, inst: LocalGather) -> None:
        src = self._rows(inst.src)
        index = self._rows(inst.indices).astype(np.int64)
        out = np.empty((src.shape[0], inst.valid, inst.elems))
        offsets = np.arange(inst.elems)
        last = src.shape[1] - inst.elems   # the largest index whose num_elem_per_idx elements fit
        for start in range(0, src.shape[0], GATHER_GROUP):
            group = slice(start, start + GATHER_GROUP)
            rows = index[group]
            flat = rows.reshape(-1, order="F")[: inst.valid]
            bad = np.flatnonzero((flat < 0) | (flat > last))
            if bad.size:
                k = int(bad[0])   # the k-th index of the group, read column by column
                p, j = start + k % rows.shape[0], k // rows.shape[0]
                raise ProgramError(f"{_where(inst)}local_gather index {int(flat[k])} (partition {p}, element {j} of "
                                   f"{inst.indices!r}) is outside 0..{last}: each index and the "
                                   f"{inst.elems} elements after it must lie in the {src.shape[1]} elements per "
                                   f"partition of {inst.src!r}")
            out[group] = src[group][:, flat[:, None] + offsets[None, :]]
        self._put(inst.dst, out)

    def _nonzero(self, inst: NonzeroWithCount) -> None:
        src = self._rows(inst.src)
        out = self._rows(inst.dst)
        for p in range(0, src.shape[0], GATHER_GROUP):
            found = np.flatnonzero(src[p] != 0.0)
            out[p] = inst.padding
            out[p, : found.size] = found + inst.offset
            out[p, -1] = found.size
        self._put(inst.dst, out)

    def _gather(self, inst: Gather) -> None:
        src = self._rows(inst.src)
        index = self._rows(inst.indices).astype(np.int64)
        bad = np.argwhere((index < 0) | (index >= src.shape[1]))
        if bad.size:
            p, j = (int(x) for x in bad[0])
            raise ProgramError(f"{_where(inst)}nc_n_gather index {int(index[p, j])} (partition {p}, element {j} of "
                               f"{inst.indices!r}) is outside 0..{src.shape[1] - 1}, the {src.shape[1]} elements per "
                               f"partition of {inst.src!r}; keep every index in that range")
        self._put(inst.dst, np.take_along_axis(src, index, axis=1))

    def _reciprocal(self, inst: Reciprocal) -> None:
        x = self._rows(inst.src).astype(np.float32).astype(np.float64)
        self._put(inst.dst, self.backend.alu(np.ones(()), x, AluOp.DIVIDE))

    def _max8(self, inst: Max8) -> None:
        self._put(inst.dst, self.backend.max8(self._rows(inst.src)))

    def _indices(self, idx: NDArray[np.int64], view: View) -> Values:
        """Positions as values of ``view``'s dtype: -1 (not found) is all ones of an unsigned dtype."""
        ones = float(int_range(view.dtype)[1]) if view.dtype.storage.kind == "u" else -1.0
        return np.where(idx < 0, ones, idx).astype(np.float64)

    def _find_index8(self, inst: FindIndex8) -> None:
        idx = self.backend.find_index8(self._rows(inst.src), self._rows(inst.vals))
        self._put(inst.dst, self._indices(idx, inst.dst))

    def _match_replace8(self, inst: MatchReplace8) -> None:
        out, idx = self.backend.match_replace8(self._rows(inst.src), self._rows(inst.vals), float(inst.imm))
        self._put(inst.dst, out)
        if inst.dst_idx is not None:
            self._put(inst.dst_idx, self._indices(idx, inst.dst_idx))

    def _range_select(self, inst: RangeSelect) -> None:
        x = self._rows(inst.src)
        index = (inst.start + np.arange(x.shape[1], dtype=np.float64))[None, :]
        keep = (self.backend.alu(index, self._rows(inst.bound0), inst.cmp0) != 0.0) & \
               (self.backend.alu(index, self._rows(inst.bound1), inst.cmp1) != 0.0)
        out = np.where(keep, x, float(inst.fill))
        bits = self.backend.encode(out, inst.dst.dtype)
        self.write_raw(inst.dst, bits.reshape(inst.dst.shape))
        if inst.reduce_dst is not None:
            rounded = self.backend.decode(bits, inst.dst.dtype)
            self._put(inst.reduce_dst, self.backend.reduce(rounded, ReduceOp.MAX))

    def _sequence_bounds(self, inst: SequenceBounds) -> None:
        self._put(inst.dst, self.backend.sequence_bounds(self.read(inst.src)))

    def _stream_shuffle(self, inst: StreamShuffle) -> None:
        src = self._rows(inst.src)
        out = self._rows(inst.dst)
        for p in range(out.shape[0]):
            base, lane = divmod(p, SHUFFLE_QUADRANT)
            pick = inst.mask[lane]
            if pick != SHUFFLE_KEEP:
                out[p] = src[base * SHUFFLE_QUADRANT + pick]
        self._put(inst.dst, out)

    def _partition_reduce(self, inst: PartitionReduce) -> None:
        self._put(inst.dst, self.backend.reduce(self._rows(inst.src).T, inst.op))

    def _random(self, inst: RandomUniform) -> None:
        if inst.bits:
            raw = self.rng.integers(0, 2**32, size=inst.dst.shape, dtype=np.uint64)
            storage = inst.dst.dtype.storage
            self.write_raw(inst.dst, (raw & np.uint64(2 ** (8 * storage.itemsize) - 1)).astype(storage))
            return
        u = np.floor(self.rng.random(size=inst.dst.shape) * 2.0**24) / 2.0**24   # 24-bit fractions: below 1 in fp32
        self._put(inst.dst, inst.low + (inst.high - inst.low) * u)

    def _dropout(self, inst: Dropout) -> None:
        x = self._rows(inst.src)
        prob = self._per_partition(inst.prob, x.shape[0])
        draw = self.rng.random(size=x.shape)
        self._put(inst.dst, np.where(draw < prob, 0.0, x))

    def _rng_seed(self, inst: RngSeed) -> None:
        seeds = np.nan_to_num(self.read(inst.src).reshape(-1))
        self.rng = np.random.default_rng([int(v) & 0xFFFFFFFF for v in seeds])

    def _rng_state(self, inst: RngState) -> None:
        self._put(inst.dst, np.broadcast_to(rng_state_words(self.rng, inst.dst.shape[-1]), inst.dst.shape))


def rng_state_words(rng: np.random.Generator, count: int) -> NDArray[np.uint32]:
    """``count`` uint32 words of ``rng``'s PCG64 state: the 128-bit state then the 128-bit
    increment, least significant word first, repeated to fill ``count``."""
    state = rng.bit_generator.state["state"]
    words = [(int(state[key]) >> (32 * i)) & 0xFFFFFFFF for key in ("state", "inc") for i in range(4)]
    return np.resize(np.array(words, dtype=np.uint32), count)


def _at(inst: Instruction) -> str:
    return f" ({inst.source})" if inst.source else ""


def _where(inst: Instruction) -> str:
    """``file:line: `` of the kernel line that made ``inst`` (empty when unknown)."""
    return f"{inst.source}: " if inst.source else ""


#: the integer types whose all-integer arithmetic the engines run natively (see ``_alu``)
_NATIVE_INT = (np.dtype(np.int32), np.dtype(np.uint32))


def _int_width(*operands: float | View | None) -> np.dtype[np.integer] | None:
    """The integer type a shift of these operands wraps to: numpy's promotion of the integer
    dtypes of the Views among them (int8 with int32 gives int32), or None when none is an
    integer View (numbers take the tile's type, as numpy's do)."""
    ints = [v.dtype.storage for v in operands if isinstance(v, View) and not v.dtype.is_float]
    return np.result_type(*ints) if ints else None


def _native_int(dst: View, *operands: float | View | None) -> bool:
    """Whether every tile read and written is int32/uint32 and every number an integer:
    such arithmetic runs in native integers (see ``_alu``)."""
    views = [dst, *(v for v in operands if isinstance(v, View))]
    numbers = [v for v in operands if v is not None and not isinstance(v, View)]
    return all(v.dtype.storage in _NATIVE_INT for v in views) and all(float(n).is_integer() for n in numbers)


def _no_data(inst: Instruction) -> None:
    """Semaphores order engines; they move no data."""


def _affine(shape: tuple[int, ...], offset: int, channel_multiplier: int, steps: tuple[int, ...]) -> NDArray[np.int64]:
    """int64 ``offset + channel_multiplier * p + sum(steps[k] * i_k)`` over ``shape``, p counted from 0."""
    if len(steps) != len(shape) - 1:
        raise ProgramError(f"{len(steps)} steps given for the {len(shape) - 1} free dimensions of shape {list(shape)}; "
                           "give one step per free dimension")
    value = np.full(shape, offset, dtype=np.int64)
    for axis, step in enumerate((channel_multiplier, *steps)):
        index_shape = [1] * len(shape)
        index_shape[axis] = shape[axis]
        value += step * np.arange(shape[axis], dtype=np.int64).reshape(index_shape)
    return value


def _check_shape(view: View, array: NDArray[np.generic], what: str) -> None:
    if array.shape != view.shape:
        raise ProgramError(f"{what} of shape {list(array.shape)} do not match {view!r} of shape {list(view.shape)}; "
                           "reshape them to the view's shape")
