"""Cost of each compute instruction on its engine, from the chip's figures.

Costs are in cycles of the engine's own clock and follow the documented cost
model (docs/hardware.md, with the source of each figure); :func:`cost_ps` turns them into
integer picoseconds, the unit of simulated time. Every constant comes from the
chip file; nothing here knows which chip it is.
"""

from __future__ import annotations

import math
from typing import cast

from trnsim import dtypes
from trnsim.hw.spec import ChipSpec, VectorEngineSpec
from trnsim.isa import (
    pe_rows,
    Activation,
    ActivationFunc,
    AffineSelect,
    BnAggr,
    BnStats,
    Engine,
    FindIndex8,
    Instruction,
    Iota,
    LoadStationary,
    MatchReplace8,
    Max8,
    Memory,
    Memset,
    MultiplyMoving,
    PartitionReduce,
    Reciprocal,
    ReduceOp,
    ScalarTensorTensor,
    Select,
    SemaphoreSignal,
    SemaphoreWait,
    SequenceBounds,
    TensorCopy,
    TensorReduce,
    TensorScalar,
    TensorTensor,
    TensorTensorScan,
    Transpose,
    View,
)
from trnsim.units import Cycles, Picos

#: What :func:`cost_ps` reads of an instruction (see :func:`cost_key`).
CostKey = tuple[object, ...]

_HALF = (dtypes.bfloat16, dtypes.float16)


def cycles_to_ps(cycles: Cycles, clock_ghz: float) -> Picos:
    """Cycles of a clock in GHz as whole picoseconds (rounded to nearest)."""
    return round(cycles * 1000.0 / clock_ghz)


def _pe_rate(chip: ChipSpec, dtype: dtypes.DType) -> float:
    """Cycles per column streamed through the PE array for ``dtype``: fp32 takes
    ``fp32_cycle_factor`` passes; bf16, fp16 and fp8 one (fp8 is faster only in the
    double-row mode, which packs two contraction rows into each column)."""
    if dtype is dtypes.float32:
        return float(chip.tensor_engine.fp32_cycle_factor)
    return 1.0


def load_stationary_cycles(chip: ChipSpec, src: View, double_row: bool = False) -> Cycles:
    """Loading a stationary [K, M] (or a double-row [K, 2, M]): up to
    ``stationary_load_speedup`` times faster than streaming M."""
    te = chip.tensor_engine
    return math.ceil(src.free_size // pe_rows(double_row) * _pe_rate(chip, src.dtype) / te.stationary_load_speedup)


def multiply_moving_cycles(chip: ChipSpec, moving: View, stationary_free: int, double_row: bool = False) -> Cycles:
    """max(min(64, M), N) cycles per matmul, scaled by dtype, plus the fixed start-up; a
    double-row moving [K, 2, N] streams its N columns in the time of [K, N]."""
    te = chip.tensor_engine
    columns = max(min(te.stationary_min_cycles, stationary_free), moving.free_size // pe_rows(double_row))
    return te.fixed_cycles + math.ceil(columns * _pe_rate(chip, moving.dtype))


def transpose_cycles(chip: ChipSpec, src: View) -> Cycles:
    """Transpose [P, F] through the PE array: max(P, min(64, F)) plus the fixed start-up."""
    te = chip.tensor_engine
    columns = max(src.partitions, min(te.stationary_min_cycles, src.free_size))
    return te.fixed_cycles + math.ceil(columns * _pe_rate(chip, src.dtype))


def _strided(views: tuple[View, ...], spec_stride: int) -> bool:
    return any(v.max_free_stride_bytes() > spec_stride for v in views)


def _is_half_sbuf(views: tuple[View, ...]) -> bool:
    return all(v.dtype in _HALF and v.memory is Memory.SBUF for v in views)


def _half_speedup(inst: Instruction, views: tuple[View, ...], fast_half: int, fast_contiguous: int) -> int:
    """How many times faster NC-v3's vector performance mode runs a bf16/fp16
    tensor_copy or tensor_scalar: ``fast_contiguous`` with every operand in SBUF and its
    innermost free axis contiguous, ``fast_half`` in SBUF otherwise or contiguous with one
    operand in PSUM (NKI's Trainium2 architecture guide); 1 otherwise. A memset in SBUF
    gets ``fast_half`` (the guide does not name it: assumption)."""
    if not all(v.dtype in _HALF for v in views):
        return 1
    in_psum = sum(v.memory is Memory.PSUM for v in views)
    if isinstance(inst, Memset):
        return fast_half if in_psum == 0 else 1
    contiguous = all(v.dims[-1][0] == 1 or v.dims[-1][1] == 1 for v in views)
    if in_psum == 0:
        return fast_contiguous if contiguous else fast_half
    return fast_half if contiguous and in_psum == 1 else 1


def _elementwise_work(inst: Instruction, fast_half: int, fast_contiguous: int = 1) -> float:
    """Cycles of work per partition row before the per-instruction minimum."""
    if isinstance(inst, (BnStats, BnAggr, Max8, FindIndex8, MatchReplace8)):
        # max8 and the find/replace searches read N elements to write 8 (assumption: N cycles)
        return inst.src.free_size
    if isinstance(inst, TensorReduce):
        n = inst.src.free_size
        halves = inst.src.dtype in _HALF and inst.op in (ReduceOp.ADD, ReduceOp.MAX)
        return n / 2 if halves else n
    n = inst.writes()[0].free_size if inst.writes() else 0
    ins = tuple(v for v in inst.reads() if v.free_size == n)
    # scalar_tensor_tensor costs about one tensor_tensor (NKI's documentation); a scan reads
    # two tensors like one (assumption)
    if isinstance(inst, (TensorTensor, Select, ScalarTensorTensor, TensorTensorScan)):
        if any(v.memory is Memory.PSUM for v in ins) or _is_half_sbuf(ins + inst.writes()):
            return n
        return 2 * n
    # the performance mode is published for tensor_copy and tensor_scalar, not for one
    # that also reduces (assumption: that runs at the plain rate)
    if isinstance(inst, (TensorCopy, TensorScalar, Memset)) and fast_half > 1 \
            and getattr(inst, "reduce_dst", None) is None:
        return n / _half_speedup(inst, ins + inst.writes(), fast_half, fast_contiguous)
    return n


def lane_engine_cycles(inst: Instruction, spec: VectorEngineSpec, dependent: bool) -> Cycles:
    """Vector or scalar engine: SBUF start-up + max(min, work), more for strides and back-to-back dependencies."""
    if isinstance(inst, (SemaphoreSignal, SemaphoreWait)):
        return 0
    work: float
    if isinstance(inst, Activation):
        n = inst.src.free_size
        work = spec.reciprocal_cycle_factor * n if inst.func is ActivationFunc.RECIPROCAL else n
    elif isinstance(inst, Reciprocal):
        work = spec.reciprocal_cycle_factor * inst.src.free_size
    else:
        work = _elementwise_work(inst, spec.bf16_speedup, spec.bf16_contiguous_speedup)
    if _strided(inst.reads() + inst.writes(), spec.large_stride_bytes):
        work *= 2
    extra = spec.dependent_issue_cycles if dependent else 0
    return spec.sbuf_access_cycles + max(spec.min_cycles, math.ceil(work)) + extra


def gpsimd_cycles(chip: ChipSpec, inst: Instruction) -> Cycles:
    """GpSimd: fixed start-up plus one cycle per element of a partition row (each core
    serves its partitions with a 512-bit SIMD unit)."""
    if isinstance(inst, (SemaphoreSignal, SemaphoreWait)):
        return 0
    g = chip.gpsimd
    work: float
    if isinstance(inst, (Iota, AffineSelect)):
        work = inst.dst.free_size
    elif isinstance(inst, SequenceBounds):
        work = inst.src.free_size
    elif isinstance(inst, PartitionReduce):
        # assumption: each GpSimd core folds the partitions it serves element by element
        # (N per partition), the cores' partial results combining in the fixed start-up
        work = inst.src.free_size * min(inst.src.partitions, g.partitions_per_core)
    else:
        work = _elementwise_work(inst, 1)
    return g.fixed_cycles + math.ceil(work * g.cycles_per_element)


def engine_clock_ghz(chip: ChipSpec, engine: Engine) -> float:
    """Clock of ``engine``; the sync engine runs at the scalar engine's clock (assumption)."""
    if engine is Engine.TENSOR:
        return chip.tensor_engine.clock_ghz
    if engine is Engine.VECTOR:
        return chip.vector_engine.clock_ghz
    if engine is Engine.GPSIMD:
        return chip.gpsimd.clock_ghz
    return chip.scalar_engine.clock_ghz


def cost_ps(chip: ChipSpec, inst: Instruction, *, dependent: bool = False, stationary_free: int = 0) -> Picos:
    """Simulated duration of a compute instruction in picoseconds.

    ``dependent``: the instruction depends on the one issued just before it on the
    same engine. ``stationary_free``: M of the stationary loaded for a multiply.
    """
    engine = inst.engine
    if isinstance(inst, LoadStationary):
        cycles = load_stationary_cycles(chip, inst.src, inst.double_row)
    elif isinstance(inst, MultiplyMoving):
        cycles = multiply_moving_cycles(chip, inst.src, stationary_free, inst.double_row)
    elif isinstance(inst, Transpose):
        cycles = transpose_cycles(chip, inst.src)
    elif engine is Engine.VECTOR:
        cycles = lane_engine_cycles(inst, chip.vector_engine, dependent)
    elif engine is Engine.SCALAR:
        cycles = lane_engine_cycles(inst, chip.scalar_engine, dependent)
    elif engine is Engine.GPSIMD:
        cycles = gpsimd_cycles(chip, inst)
    else:
        cycles = 0
    return cycles_to_ps(cycles, engine_clock_ghz(chip, engine))


def operand_key(v: object) -> tuple[object, ...] | None:
    """What the cost model reads of one operand: a View's dims, dtype and memory (its
    free size, partitions and strides follow from the dims); None for a non-View."""
    if isinstance(v, View):
        t = v.tensor
        return (v.dims, t.dtype, t.memory)
    return None


def cost_key(inst: Instruction, dependent: bool, stationary_free: int) -> CostKey:
    """Everything :func:`cost_ps` reads of its arguments but the chip: instructions with
    equal keys cost the same on one chip.

    :func:`cost_ps` branches on the instruction's type and engine, reads ``func`` of an
    Activation, ``op`` of a TensorReduce and ``double_row`` of a matmul, and reads operands only through ``src``,
    ``dst``, :meth:`~trnsim.isa.Instruction.reads` and
    :meth:`~trnsim.isa.Instruction.writes`, all of which are fields named in
    ``read_fields`` or ``write_fields`` (keyed here one by one, in order, by
    :func:`operand_key`). ``stationary_free`` counts only for a multiply, ``dependent``
    only on the vector and scalar engines; each is kept only where it counts."""
    kind = type(inst)
    engine = inst.engine
    if kind is Activation:
        extra: object = cast(Activation, inst).func
    elif kind is TensorReduce:
        extra = cast(TensorReduce, inst).op
    elif kind is LoadStationary or kind is MultiplyMoving:
        extra = cast(LoadStationary, inst).double_row
    else:
        extra = None
    return (kind, engine, extra,
            stationary_free if kind is MultiplyMoving else 0,
            dependent and (engine is Engine.VECTOR or engine is Engine.SCALAR),
            tuple([operand_key(getattr(inst, n)) for n in inst.read_fields]),
            tuple([operand_key(getattr(inst, n)) for n in inst.write_fields]))
