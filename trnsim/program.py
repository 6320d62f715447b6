"""Programs: tensors placed in HBM, SBUF and PSUM, and instructions checked against the chip.

A :class:`Program` owns tensors and a list of instructions (see :mod:`trnsim.isa`).
Tensors are placed by :meth:`Program.hbm`, :meth:`Program.sbuf` and
:meth:`Program.psum`; every instruction is checked against the chip's limits
(partitions, alignment, capacity, PSUM banks, matmul sizes) and costed on it as it
joins, so simulating a Program only schedules it.
"""

from __future__ import annotations

import linecache
import math
import operator
import os
import re
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from trnsim.dtypes import FLOAT8, PACKED, as_dtype, float32
from trnsim.errors import AllocationError, ProgramError
from trnsim.isa import (ALU_COMPARISONS, BN_STATS_MAX_FREE, BN_STATS_WIDTH, MAX_FREE_DIMS, MAX_TENSOR_DIMS, MEMORY_NAMES,
                        Activation, AffineSelect,
                        BnAggr, BnStats, DmaCopy, DmaIndirect, Engine, Instruction, Iota, LoadStationary, Memory, MultiplyMoving,
                        RangeSelect, Select, SemaphoreWait, Tensor, TensorCopy, TensorReduce, TensorScalar, TensorTensor,
                        Transpose, View, dims_extent, pe_rows)

if TYPE_CHECKING:
    from trnsim.hw.placement import OnChipAllocator
    from trnsim.hw.spec import ChipSpec


_set = object.__setattr__


def partition_start_ok(start: int, count: int) -> bool:
    """Whether an engine access of ``count`` partitions may start on partition ``start``
    (DMAs reach any partition)."""
    if count > 64:
        return start == 0
    if count > 32:
        return start in (0, 64)
    return start in (0, 32, 64, 96)


def _allowed_starts(count: int) -> str:
    if count > 64:
        return "0"
    if count > 32:
        return "0 or 64"
    return "0, 32, 64 or 96"


#: Bytes per partition past the end of SBUF where the simulator keeps engine state that
#: the chip holds outside SBUF (the vector engine's accumulator registers: see
#: :meth:`Program.registers`); no kernel tile can be placed there.
REGISTER_BYTES = 16

# ``name = ...`` (or ``name: T = ...``) at the start of a source line
_ASSIGNED = re.compile(r"\s*([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)")
# the names a Program gives the tensors its source made without naming them
_AUTO_NAME = re.compile(r"\b(?:" + "|".join(MEMORY_NAMES.values()) + r")_\d+\b")


def _source_name(name: str, where: tuple[str, int] | None) -> str:
    if where is None:
        return name
    found = _ASSIGNED.match(linecache.getline(*where))
    return found.group(1) if found else f"{name} (made at {os.path.basename(where[0])}:{where[1]})"


class Program:
    """Tensors and a list of instructions with explicit dependencies.

    Tensors are placed by :meth:`hbm`, :meth:`sbuf` and :meth:`psum` (which check
    capacity against ``chip``); instructions are appended by :meth:`add` or the
    helpers named after them, each checked against the chip's limits as it joins.
    A Program holds no timing: :func:`trnsim.hw.static.static_timing` costs it on its
    chip and :mod:`trnsim.hw.core` schedules it.
    """

    def __init__(self, chip: str | os.PathLike[str] | ChipSpec | None = None, name: str = "program") -> None:
        from trnsim.hw.spec import load_chip

        self.chip = load_chip(chip)
        self.name = name
        self.instructions: list[Instruction] = []
        self.tensors: list[Tensor] = []
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        #: per physical core, its SBUF and PSUM allocators (see :meth:`use_core`)
        self.allocators: list[tuple[OnChipAllocator, OnChipAllocator]] = []
        #: the physical core whose SBUF and PSUM new on-chip tensors go into
        self.core = 0
        self.use_core(0)
        self._hbm_bytes = 0
        self._names: set[str] = set()
        self._tensor_ids: set[int] = set()
        #: moves on when an instruction is taken back, so what was worked out from the
        #: instruction list before (its timing) is worked out again
        self.revision = 0
        #: where (file, line) the source that traced this Program made each tensor it did
        #: not name; :meth:`source_names` reads it
        self.made_at: dict[str, tuple[str, int] | None] = {}
        #: HBM tensors that read another's bytes as another dtype (:meth:`hbm_alias`): by
        #: id of the alias, the tensor that owns the bytes
        self.aliases: dict[int, Tensor] = {}

    def use_core(self, core: int) -> None:
        """Place the on-chip tensors made from now on in the SBUF and PSUM of physical core
        ``core`` (a kernel launched over a logical NeuronCore's cores uses several; each has
        its own SBUF and PSUM, and all share HBM)."""
        from trnsim.hw.placement import OnChipAllocator

        if not isinstance(core, int) or core < 0:
            raise ProgramError(f"core {core!r} must be a non-negative int, the physical core's number")
        chip = self.chip
        while len(self.allocators) <= core:
            self.allocators.append((
                OnChipAllocator(Memory.SBUF, chip.sbuf.partitions, chip.sbuf.partition_bytes, chip.name),
                OnChipAllocator(Memory.PSUM, chip.psum.partitions, chip.psum.partition_bytes, chip.name,
                                bank_bytes=chip.psum.bank_bytes)))
        self.core = core

    @property
    def sbuf_alloc(self) -> OnChipAllocator:
        """The SBUF allocator of the current core (:meth:`use_core`)."""
        return self.allocators[self.core][0]

    @property
    def psum_alloc(self) -> OnChipAllocator:
        """The PSUM allocator of the current core (:meth:`use_core`)."""
        return self.allocators[self.core][1]

    @property
    def cores(self) -> int:
        """How many physical cores the Program's tensors and instructions use."""
        return len(self.allocators)

    def source_names(self, message: str) -> str:
        """``message`` with each tensor made without a name (``sbuf_3``) called by the
        variable its source line assigns (``c_tile = nl.load(a)``: ``c_tile``), or by that
        line; a kernel's HBM arguments carry its parameter names already."""
        return _AUTO_NAME.sub(lambda m: _source_name(m.group(0), self.made_at[m.group(0)])
                              if m.group(0) in self.made_at else m.group(0), message)

    # -- tensors -----------------------------------------------------------

    def _name(self, name: str | None, kind: str) -> str:
        if name is None:
            name = f"{kind}{len(self.tensors)}"
        if name in self._names:
            raise ProgramError(f"tensor name {name!r} is already used in program {self.name!r}; pick another")
        self._names.add(name)
        return name

    def hbm(self, shape: Sequence[int], dtype: object = float32, name: str | None = None, *, kind: str = "internal") -> Tensor:
        """A tensor in HBM; ``kind`` is ``"input"``, ``"output"`` or ``"internal"``."""
        shape = _check_shape(shape, "hbm")
        dt = as_dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        capacity = self.chip.hbm.capacity_bytes
        if self._hbm_bytes + nbytes > capacity:
            raise AllocationError(f"HBM tensor {name or 'hbm'!r} of {nbytes / 2**30:.2f} GiB does not fit: "
                                  f"{self._hbm_bytes / 2**30:.2f} GiB already placed of the {capacity / 2**30:.0f} GiB "
                                  f"on {self.chip.name}; use smaller tensors or a chip with more HBM")
        t = Tensor(self._name(name, "hbm"), Memory.HBM, shape, dt, byte_offset=self._hbm_bytes)
        self._hbm_bytes += t.nbytes
        self.tensors.append(t)
        self._tensor_ids.add(id(t))
        if kind == "input":
            self.inputs.append(t)
        elif kind == "output":
            self.outputs.append(t)
        elif kind != "internal":
            raise ProgramError(f"hbm tensor kind {kind!r}: use 'input', 'output' or 'internal'")
        return t

    def hbm_alias(self, base: Tensor, shape: Sequence[int], dtype: object, name: str) -> Tensor:
        """The bytes of HBM tensor ``base`` read as another dtype and shape of the same
        byte count (NKI's ``t.view(dtype)``): no data moves; both name the same memory.
        The instructions' dependencies take an access to an alias as one to all of its
        base (:attr:`aliases`)."""
        if base.memory is not Memory.HBM or id(base) not in self._tensor_ids:
            raise ProgramError(f"hbm_alias({base!r}): the base must be an HBM tensor of program {self.name!r}")
        shape = _check_shape(shape, "hbm")
        dt = as_dtype(dtype)
        if math.prod(shape) * dt.itemsize != base.nbytes:
            raise ProgramError(f"hbm_alias({base!r}) as {list(shape)} {dt.name}: {math.prod(shape) * dt.itemsize} bytes, "
                               f"the base has {base.nbytes}; give a shape of the same byte count")
        root = self.aliases.get(id(base), base)
        t = Tensor(self._name(name, "hbm"), Memory.HBM, shape, dt, byte_offset=base.byte_offset)
        self.tensors.append(t)
        self._tensor_ids.add(id(t))
        self.aliases[id(t)] = root
        return t

    def on_chip_alias(self, base: Tensor, shape: Sequence[int], dtype: object, name: str) -> Tensor:
        """The bytes of SBUF/PSUM tensor ``base`` read as another dtype: the same
        partitions and bytes in each (``shape[0]`` is the base's partition count), no
        space of its own."""
        if not base.on_chip or id(base) not in self._tensor_ids:
            raise ProgramError(f"on_chip_alias({base!r}): the base must be an SBUF or PSUM tensor of program {self.name!r}")
        shape = _check_shape(shape, MEMORY_NAMES[base.memory])
        dt = as_dtype(dtype)
        if shape[0] != base.shape[0] or math.prod(shape[1:]) * dt.itemsize != base.partition_bytes:
            raise ProgramError(f"on_chip_alias({base!r}) as {list(shape)} {dt.name}: give {base.shape[0]} partitions "
                               f"of {base.partition_bytes} bytes each, as the base has")
        if name in self._names:
            raise ProgramError(f"tensor name {name!r} is already used in program {self.name!r}; pick another")
        self._names.add(name)
        t = Tensor(name, base.memory, shape, dt, start_partition=base.start_partition, byte_offset=base.byte_offset,
                   core=base.core)
        self.tensors.append(t)
        self._tensor_ids.add(id(t))
        self.aliases[id(t)] = self.aliases.get(id(base), base)
        return t

    def sbuf(self, shape: Sequence[int], dtype: object = float32, name: str | None = None, *, start_partition: int = 0) -> Tensor:
        """A tensor in SBUF: ``shape[0]`` partitions, the rest row-major in each partition."""
        return self._on_chip(self.sbuf_alloc, shape, dtype, name, start_partition)

    def psum(self, shape: Sequence[int], dtype: object = float32, name: str | None = None, *, start_partition: int = 0) -> Tensor:
        """A tensor in PSUM; it must fit in one bank (2 KiB per partition) or span whole banks."""
        return self._on_chip(self.psum_alloc, shape, dtype, name, start_partition)

    def _on_chip(self, alloc: OnChipAllocator, shape: Sequence[int], dtype: object, name: str | None,
                 start_partition: int) -> Tensor:
        kind = MEMORY_NAMES[alloc.memory]
        shape = _check_shape(shape, kind)
        dt = as_dtype(dtype)
        label = name if name is not None else f"{kind}{len(self.tensors)}"
        _check_partitions(lambda: f"{kind} tensor {label!r}", start_partition, shape[0], self.chip)
        if label in self._names:
            raise ProgramError(f"tensor name {label!r} is already used in program {self.name!r}; pick another")
        nbytes = math.prod(shape[1:]) * dt.itemsize
        offset = alloc.allocate(label, start_partition, shape[0], nbytes)
        self._names.add(label)
        name = label
        t = Tensor(name, alloc.memory, shape, dt, start_partition=start_partition, byte_offset=offset, core=self.core)
        self.tensors.append(t)
        self._tensor_ids.add(id(t))
        return t

    def place_at(self, memory: Memory, shape: Sequence[int], dtype: object, name: str, start_partition: int,
                 byte_offset: int) -> Tensor:
        """An SBUF or PSUM tensor at the address the caller chose (NKI's direct allocation);
        it may share space with other tensors placed so."""
        alloc = self.sbuf_alloc if memory is Memory.SBUF else self.psum_alloc
        kind = MEMORY_NAMES[memory]
        shape = _check_shape(shape, kind)
        dt = as_dtype(dtype)
        _check_partitions(lambda: f"{kind} tensor {name!r}", start_partition, shape[0], self.chip)
        if name in self._names:
            raise ProgramError(f"tensor name {name!r} is already used in program {self.name!r}; pick another")
        alloc.place_at(name, start_partition, shape[0], byte_offset, math.prod(shape[1:]) * dt.itemsize)
        self._names.add(name)
        t = Tensor(name, memory, shape, dt, start_partition=start_partition, byte_offset=byte_offset, core=self.core)
        self.tensors.append(t)
        self._tensor_ids.add(id(t))
        return t

    def registers(self, shape: Sequence[int], dtype: object, name: str) -> Tensor:
        """An SBUF-shaped tensor for engine state that lives outside SBUF on the chip (the
        vector engine's accumulator registers): it sits past the last byte kernels can
        allocate (:data:`REGISTER_BYTES` per partition there), so no tile, placed
        automatically or directly, shares its space."""
        shape = _check_shape(shape, "registers")
        dt = as_dtype(dtype)
        _check_partitions(lambda: f"registers {name!r}", 0, shape[0], self.chip)
        nbytes = math.prod(shape[1:]) * dt.itemsize
        if nbytes > REGISTER_BYTES:
            raise ProgramError(f"registers {name!r} of {nbytes} bytes per partition exceed the {REGISTER_BYTES} "
                               "bytes the simulator keeps for engine registers")
        if name in self._names:
            raise ProgramError(f"tensor name {name!r} is already used in program {self.name!r}; pick another")
        self._names.add(name)
        t = Tensor(name, Memory.SBUF, shape, dt, byte_offset=self.chip.sbuf.partition_bytes, core=self.core)
        self.tensors.append(t)
        self._tensor_ids.add(id(t))
        return t

    def free(self, tensor: Tensor) -> None:
        """Return an on-chip tensor's space to its allocator (its name stays taken)."""
        if tensor.memory is Memory.SBUF:
            self.allocators[tensor.core][0].release(tensor.name)
        elif tensor.memory is Memory.PSUM:
            self.allocators[tensor.core][1].release(tensor.name)
        else:
            raise ProgramError(f"free({tensor!r}): only SBUF and PSUM tensors are freed")

    # -- instructions ------------------------------------------------------

    def add(self, inst: Instruction) -> int:
        """Check ``inst`` against the chip and append it; returns its index.

        From then on the instruction is fixed: changing a field (its dependencies, an
        operand) raises ProgramError, since the checks and the timing were done with them.
        """
        if inst.owner is not None:
            raise ProgramError(f"instruction {inst.index} {inst.opcode} is already in program {inst.owner!r}; "
                               "an instruction joins one program once, so build a new one")
        if not isinstance(inst.deps, (tuple, list)):
            raise ProgramError(f"instruction {inst.opcode}: deps {inst.deps!r} must be a tuple of instruction indices")
        # not sealed yet, so set as its guard would (the dataclass is frozen to the type checker)
        _set(inst, "deps", tuple(inst.deps))   # a list given stays the caller's to change; the deps must not
        _set(inst, "index", len(self.instructions))
        try:
            self._validate(inst)
        except ProgramError:
            _set(inst, "index", -1)
            raise
        self.instructions.append(inst)
        inst._seal(self.name)
        return inst.index

    def add_traced(self, inst: Instruction, deps: tuple[int, ...], reads: tuple[View, ...], writes: tuple[View, ...]) -> int:
        """:meth:`add` for a tracer, which found ``deps`` itself (earlier instructions, in
        order) and ``inst``'s operands (``reads``, ``writes``) already: the same checks
        but those of the dependencies, and the instruction is sealed as it joins."""
        index = len(self.instructions)
        _set(inst, "deps", deps)
        _set(inst, "index", index)
        try:
            self._check_operands(inst, reads + writes)
        except ProgramError:
            _set(inst, "index", -1)
            raise
        self.instructions.append(inst)
        _set(inst, "_owner", self.name)
        return index

    def check_operands(self, inst: Instruction) -> None:
        """Raise :class:`ProgramError` if ``inst`` could not join: its engine or queue, its
        operands and its own rules (not its dependencies)."""
        self._check_operands(inst, inst.reads() + inst.writes())

    def replace_last(self, inst: Instruction, deps: tuple[int, ...]) -> None:
        """Put ``inst`` (checked by the caller) in place of the last instruction, with
        ``deps``: a tracer that finds the last instruction's result assigned elsewhere
        has it write there instead."""
        index = len(self.instructions) - 1
        if any(d >= index for d in deps):
            raise ProgramError(f"instruction {index} {inst.opcode} would wait for {sorted(d for d in deps if d >= index)}: "
                               "an instruction waits only for earlier ones")
        _set(inst, "deps", deps)
        _set(inst, "index", index)
        self.instructions[index] = inst
        _set(inst, "_owner", self.name)
        self.revision += 1

    def listing(self, header: str) -> str:
        """The Program as text: a ``# header`` line, then one line per instruction (its
        index, opcode and operands)."""
        lines = [f"# {header}"] + [f"{i:6d} {inst.describe()}" for i, inst in enumerate(self.instructions)]
        return "\n".join(lines) + "\n"

    def __len__(self) -> int:
        return len(self.instructions)

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def _fail(self, inst: Instruction, message: str) -> ProgramError:
        where = f" ({inst.source})" if inst.source else ""
        return ProgramError(f"instruction {inst.index} {inst.opcode}{where}: {message}")

    def _validate(self, inst: Instruction) -> None:
        index = inst.index
        for d in inst.deps:
            if not isinstance(d, int) or not 0 <= d < index:
                raise self._fail(inst, f"dependency {d!r} must be the index of an earlier instruction (0..{index - 1})")
        self._check_operands(inst, inst.reads() + inst.writes())

    def _check_operands(self, inst: Instruction, views: tuple[View, ...]) -> None:
        """Everything :meth:`_validate` checks but the dependencies: engine or queue, each
        operand ``views`` against its tensor, and the instruction's own rules."""
        if isinstance(inst, DmaCopy):
            nq = self.chip.dma.engines * self.chip.dma.queues_per_engine
            if not 0 <= inst.queue < nq:
                raise self._fail(inst, f"DMA queue {inst.queue} does not exist on {self.chip.name}; use 0..{nq - 1}")
        elif inst.engine not in inst.engines:
            names = ", ".join(e.value for e in inst.engines)
            raise self._fail(inst, f"cannot run on the {inst.engine.value} engine; it runs on: {names}")
        for v in views:
            self._validate_view(inst, v)
        key = (self.__class__, inst.__class__)
        check = _CHECKS.get(key)
        if check is None:
            check = _CHECKS[key] = getattr(type(self), f"_check_{inst.opcode}", _no_check)
        check(self, inst)

    def _validate_view(self, inst: Instruction, v: View) -> None:
        t = v.tensor
        if id(t) not in self._tensor_ids:
            raise self._fail(inst, f"operand {v!r} belongs to no tensor of program {self.name!r}")
        if v.size == 0:
            raise self._fail(inst, f"operand {v!r} is empty; drop the instruction or fix the slice")
        dims = v.dims
        if len(dims) > MAX_FREE_DIMS + 1:
            raise self._fail(inst, f"operand {v!r} has {len(dims)} dimensions; at most a partition dimension "
                                   f"and {MAX_FREE_DIMS} free dimensions")
        if not t.on_chip:
            if not isinstance(inst, DmaCopy):
                raise self._fail(inst, f"operand {v!r} is in HBM; engines read and write SBUF/PSUM only, "
                                       "so move it with a DMA first")
            return
        if t.core != inst.core and not isinstance(inst, DmaCopy):
            raise self._fail(inst, f"operand {v!r} is in the memory of physical core {t.core}, and the instruction "
                                   f"runs on core {inst.core}; an engine reads and writes its own core's SBUF/PSUM, "
                                   "so move the data with a DMA first")
        row = t.row_elems
        if dims and dims[0][1] > 1 and dims[0][0] != row:
            raise self._fail(inst, f"operand {v!r} steps over partitions; the partition dimension must have step 1")
        start = t.start_partition + v.offset // row
        count = v.partitions
        extent = 1
        for stride, n in dims[1:]:
            if n > 0:
                extent += stride * (n - 1)
        if start + count > t.start_partition + t.shape[0] or v.offset % row + extent > row:
            raise self._fail(inst, f"operand {v!r} reaches outside {t!r}")
        if start != 0 or count > self.chip.sbuf.partitions:
            # the start-partition rule is the engines' (their lanes stream whole quadrants);
            # a DMA addresses any partition
            _check_partitions(lambda: f"instruction {inst.index} {inst.opcode} operand {v!r}", start, count, self.chip,
                              aligned=not isinstance(inst, DmaCopy))

    def _check_matmul_shapes(self, inst: Instruction, k: int, m: int) -> None:
        te = self.chip.tensor_engine
        if k > te.pe_rows:
            raise self._fail(inst, f"contraction (partition) size {k} exceeds the {te.pe_rows} rows of the PE array; "
                                   f"split K into tiles of {te.pe_rows}")
        if m > te.stationary_free_max:
            raise self._fail(inst, f"stationary free size {m} exceeds {te.stationary_free_max}; "
                                   f"split M into tiles of {te.stationary_free_max}")

    def _check_load_stationary(self, inst: LoadStationary) -> None:
        if inst.src.memory is not Memory.SBUF:
            raise self._fail(inst, f"stationary {inst.src!r} must be in SBUF")
        if inst.double_row:
            self._check_double_row(inst, inst.src, "stationary")
        self._check_matmul_shapes(inst, inst.src.partitions, inst.src.free_size // pe_rows(inst.double_row))

    def _check_double_row(self, inst: Instruction, v: View, what: str) -> None:
        problem = double_row_problem(self.chip, v, what)
        if problem is not None:
            raise self._fail(inst, problem)

    def _check_multiply_moving(self, inst: MultiplyMoving) -> None:
        te = self.chip.tensor_engine
        if inst.src.memory is not Memory.SBUF:
            raise self._fail(inst, f"moving {inst.src!r} must be in SBUF")
        if inst.dst.memory is not Memory.PSUM or inst.dst.dtype is not float32:
            raise self._fail(inst, f"matmul output {inst.dst!r} must be a float32 PSUM tile")
        if inst.double_row:
            self._check_double_row(inst, inst.src, "moving")
        rows = pe_rows(inst.double_row)
        n = inst.src.free_size // rows
        if n > te.moving_free_max:
            raise self._fail(inst, f"moving free size {n} exceeds {te.moving_free_max} (one PSUM bank of fp32); "
                                   f"split N into tiles of {te.moving_free_max}")
        stationary = self._last_stationary(inst)
        if stationary is None:
            raise self._fail(inst, "no load_stationary precedes this multiply_moving; load the stationary tile first")
        if stationary.double_row != inst.double_row:
            mode = "double-row" if stationary.double_row else "plain"
            raise self._fail(inst, f"the stationary was loaded in {mode} mode; load and multiply in the same mode")
        k, m = stationary.src.partitions, stationary.src.free_size // rows
        if inst.src.partitions != k:
            raise self._fail(inst, f"moving has {inst.src.partitions} partitions but the stationary has {k}; "
                                   "both are the contraction size K")
        if inst.dst.partitions != m or inst.dst.free_size != n:
            raise self._fail(inst, f"output {inst.dst!r} must be [{m}, {n}] (stationary free x moving free)")
        self._check_one_bank(inst, inst.dst)

    def _check_one_bank(self, inst: Instruction, v: View) -> None:
        bank = self.chip.psum.bank_bytes
        first = v.tensor.byte_offset + v.free_offset * v.dtype.itemsize
        last = first + _extent(v) * v.dtype.itemsize - 1
        if first // bank != last // bank:
            raise self._fail(inst, f"output {v!r} crosses a PSUM bank boundary ({bank} bytes per partition per bank); "
                                   "keep each matmul output inside one bank")

    def _last_stationary(self, inst: Instruction) -> LoadStationary | None:
        for prev in reversed(self.instructions):
            if isinstance(prev, LoadStationary) and prev.core == inst.core:
                return prev
        return None

    def _check_transpose(self, inst: Transpose) -> None:
        te = self.chip.tensor_engine
        p, f = inst.src.partitions, inst.src.free_size
        if f > te.pe_cols:
            raise self._fail(inst, f"transpose input free size {f} exceeds {te.pe_cols}; transpose [P, {te.pe_cols}] tiles")
        if inst.dst.memory is not Memory.PSUM:
            raise self._fail(inst, f"transpose output {inst.dst!r} must be in PSUM")
        if inst.dst.partitions != f or inst.dst.free_size != p:
            raise self._fail(inst, f"transpose of [{p}, {f}] writes [{f}, {p}], got {inst.dst!r}")
        self._check_one_bank(inst, inst.dst)

    def _check_same_size(self, inst: Instruction, out: View, *ins: View) -> None:
        for v in ins:
            if v.partitions != out.partitions or v.free_size != out.free_size:
                raise self._fail(inst, f"operand {v!r} has [{v.partitions}, {v.free_size}] elements "
                                       f"but {out!r} has [{out.partitions}, {out.free_size}]")

    def _check_per_partition(self, inst: Instruction, out: View, v: object, what: str) -> None:
        if isinstance(v, View) and (v.partitions != out.partitions or v.free_size != 1):
            raise self._fail(inst, f"{what} {v!r} must be [{out.partitions}, 1]: one value per partition")

    def _check_activation(self, inst: Activation) -> None:
        self._check_same_size(inst, inst.dst, inst.src)
        self._check_per_partition(inst, inst.dst, inst.bias, "bias")
        self._check_per_partition(inst, inst.dst, inst.scale, "scale")
        if (inst.reduce_op is None) != (inst.reduce_dst is None):
            raise self._fail(inst, "reduce_op and reduce_dst go together: give both or neither")
        self._check_per_partition(inst, inst.dst, inst.reduce_dst, "reduce_dst")

    def _check_range_select(self, inst: RangeSelect) -> None:
        self._check_same_size(inst, inst.dst, inst.src)
        self._check_per_partition(inst, inst.src, inst.bound0, "bound0")
        self._check_per_partition(inst, inst.src, inst.bound1, "bound1")
        self._check_per_partition(inst, inst.src, inst.reduce_dst, "reduce_dst")

    def _check_tensor_tensor(self, inst: TensorTensor) -> None:
        self._check_same_size(inst, inst.dst, inst.a, inst.b)

    def _check_tensor_scalar(self, inst: TensorScalar) -> None:
        self._check_same_size(inst, inst.dst, inst.src)
        self._check_per_partition(inst, inst.dst, inst.operand0, "operand0")
        self._check_per_partition(inst, inst.dst, inst.operand1, "operand1")
        if (inst.op1 is None) != (inst.operand1 is None):
            raise self._fail(inst, "op1 and operand1 go together: give both or neither")
        if (inst.reduce_op is None) != (inst.reduce_dst is None):
            raise self._fail(inst, "reduce_op and reduce_dst go together: give both or neither")
        self._check_per_partition(inst, inst.dst, inst.reduce_dst, "reduce_dst")

    def _check_tensor_reduce(self, inst: TensorReduce) -> None:
        free = inst.src.shape[1:]
        if not 1 <= inst.num_axes <= len(free):
            raise self._fail(inst, f"num_axes {inst.num_axes} must be between 1 and the {len(free)} "
                                   f"free dimensions of {inst.src!r}")
        kept = math.prod(free[: len(free) - inst.num_axes])
        if inst.dst.partitions != inst.src.partitions or inst.dst.free_size != kept:
            raise self._fail(inst, f"reducing the last {inst.num_axes} free axes of {inst.src!r} "
                                   f"gives [{inst.src.partitions}, {kept}], got {inst.dst!r}")

    def _check_tensor_copy(self, inst: TensorCopy) -> None:
        self._check_same_size(inst, inst.dst, inst.src)

    def _check_select(self, inst: Select) -> None:
        on_false = [inst.on_false] if isinstance(inst.on_false, View) else []
        self._check_same_size(inst, inst.dst, inst.mask, inst.on_true, *on_false)

    def _check_iota(self, inst: Iota) -> None:
        if len(inst.steps) != len(inst.dst.shape) - 1:
            raise self._fail(inst, f"iota needs one step per free dimension of {inst.dst!r} "
                                   f"({len(inst.dst.shape) - 1}), got {len(inst.steps)}")

    def _check_affine_select(self, inst: AffineSelect) -> None:
        self._check_same_size(inst, inst.dst, inst.src)
        if len(inst.steps) != len(inst.src.shape) - 1:
            raise self._fail(inst, f"affine_select needs one step per free dimension of {inst.src!r} "
                                   f"({len(inst.src.shape) - 1}), got {len(inst.steps)}")
        if inst.cmp not in ALU_COMPARISONS:
            raise self._fail(inst, f"cmp {inst.cmp.value!r} is not a comparison; "
                                   f"use one of {', '.join(c.value for c in ALU_COMPARISONS)}")

    def _check_bn_stats(self, inst: BnStats) -> None:
        if inst.src.free_size > BN_STATS_MAX_FREE:
            raise self._fail(inst, f"bn_stats takes at most {BN_STATS_MAX_FREE} elements per partition, "
                                   f"got {inst.src.free_size}; run it on chunks and combine them with bn_aggr")
        if inst.dst.partitions != inst.src.partitions or inst.dst.free_size != BN_STATS_WIDTH:
            raise self._fail(inst, f"bn_stats of {inst.src!r} writes [{inst.src.partitions}, {BN_STATS_WIDTH}], got {inst.dst!r}")

    def _check_bn_aggr(self, inst: BnAggr) -> None:
        if inst.src.free_size % BN_STATS_WIDTH or inst.src.contiguous_run() % BN_STATS_WIDTH:
            raise self._fail(inst, f"bn_aggr takes bn_stats results [P, {BN_STATS_WIDTH} * k] laid out contiguously, "
                                   f"got {inst.src!r}")
        if inst.dst.partitions != inst.src.partitions or inst.dst.free_size != 2:
            raise self._fail(inst, f"bn_aggr of {inst.src!r} writes [{inst.src.partitions}, 2] (mean, variance), "
                                   f"got {inst.dst!r}")

    def _check_semaphore_wait(self, inst: SemaphoreWait) -> None:
        if not isinstance(inst.count, int) or inst.count < 1:
            raise self._fail(inst, f"semaphore_wait count {inst.count!r} must be a positive integer (the signals to wait for)")

    def _check_dma_copy(self, inst: DmaCopy) -> None:
        if inst.src.size != inst.dst.size:
            raise self._fail(inst, f"copies {inst.src.size} elements from {inst.src!r} into {inst.dst.size} of {inst.dst!r}; "
                                   "sizes must match")
        # a converting DMA casts through fp32 (NKI's dma_copy docs), except to or from the MX formats
        if inst.src.dtype is not inst.dst.dtype and (inst.src.dtype in PACKED or inst.dst.dtype in PACKED):
            raise self._fail(inst, f"DMA cannot convert {inst.src.dtype.name} to {inst.dst.dtype.name}: a DMA does "
                                   "not cast MX formats (NKI's DMA docs); copy them as they are")
        for v in (inst.src, inst.dst):
            if not v.tensor.on_chip and _extent(v) + v.offset > v.tensor.size:
                raise self._fail(inst, f"access {v!r} reaches past the end of {v.tensor!r}")

    def _check_dma_indirect(self, inst: DmaIndirect) -> None:
        self._check_dma_copy(inst)
        side, idx = inst.indirect, inst.indices
        if side.tensor.on_chip:
            raise self._fail(inst, f"the indexed side {side!r} of an indirect DMA must be in HBM; gather within "
                                   "SBUF with nc_n_gather or local_gather")
        if not idx.tensor.on_chip or idx.dtype.is_float:
            raise self._fail(inst, f"indices {idx!r} must be an integer tile in SBUF")
        if not 0 <= inst.dim < len(side.dims) or side.dims[inst.dim][0] != 0:
            raise self._fail(inst, f"dim {inst.dim} of {side!r} must be the indexed dim, with stride 0")
        if idx.size != side.dims[inst.dim][1]:
            raise self._fail(inst, f"{idx.size} indices in {idx!r} for the {side.dims[inst.dim][1]} positions of dim "
                                   f"{inst.dim} of {side!r}; give one index per position")
        if inst.step <= 0 or inst.bound <= 0:
            raise self._fail(inst, f"indirect step {inst.step} and bound {inst.bound} must be positive")
        span = inst.span()
        if _extent(span) + span.offset > span.tensor.size:
            raise self._fail(inst, f"indices up to {inst.bound - 1} (stride {inst.step}) would reach past the end of "
                                   f"{span.tensor!r}")

    # -- convenience builders ---------------------------------------------

    def matmul(self, dst: View, stationary: View, moving: View, *, accumulate: bool = False, deps: Sequence[int] = (),
               source: str = "") -> int:
        """Load ``stationary`` [K, M] and multiply ``moving`` [K, N] into ``dst`` [M, N];
        returns the index of the multiply."""
        i = self.add(LoadStationary(stationary, engine=Engine.TENSOR, deps=tuple(deps), source=source))
        try:
            return self.add(MultiplyMoving(dst, moving, accumulate, engine=Engine.TENSOR, deps=(i, *deps), source=source))
        except ProgramError:
            self.instructions.pop()  # a failed matmul leaves no half behind
            self.revision += 1
            raise

    def dma(self, dst: View | Tensor, src: View | Tensor, *, queue: int = 0, deps: Sequence[int] = (), source: str = "") -> int:
        """Append a DMA copy; tensors are taken whole."""
        dst_v = dst.view() if isinstance(dst, Tensor) else dst
        src_v = src.view() if isinstance(src, Tensor) else src
        return self.add(DmaCopy(dst_v, src_v, queue, deps=tuple(deps), source=source))

    def matmuls(self) -> Iterator[tuple[int, MultiplyMoving]]:
        """Each multiply with its FLOPs (2 per MAC of the stationary loaded before it)."""
        k = m = 0
        for inst in self.instructions:
            if isinstance(inst, LoadStationary):
                rows = pe_rows(inst.double_row)
                k, m = inst.src.partitions * rows, inst.src.free_size // rows
            elif isinstance(inst, MultiplyMoving):
                yield 2 * k * m * (inst.src.free_size // pe_rows(inst.double_row)), inst

    def flops(self) -> int:
        """Multiply-add FLOPs of every matmul (2 per MAC)."""
        return sum(f for f, _ in self.matmuls())

# Program._check_<opcode> per (program class, instruction class), looked up once.
_CHECKS: dict[tuple[type, type], Callable[[Program, Instruction], None]] = {}


def _no_check(program: Program, inst: Instruction) -> None:
    """Instructions with no checks of their own beyond their operands."""


def _extent(v: View) -> int:
    """Elements from the view's first element to its last, inclusive, past the partitions."""
    return dims_extent(v.dims[1:] if v.tensor.on_chip else v.dims)


def double_row_problem(chip: ChipSpec, v: View, what: str) -> str | None:
    """What breaks the fp8 double-row matmul mode's rules for operand ``v`` (``what``:
    stationary or moving) on ``chip``, or None: NC-v3 or later, fp8, [K, 2, X]."""
    if chip.tensor_engine.fp8_rows_factor < 2:
        return (f"the fp8 double-row matmul mode needs NeuronCore-v3 or later; {chip.name} is {chip.neuron_core}, "
                "which has none: use perf_mode='none'")
    if v.dtype not in FLOAT8:
        return f"the double-row mode multiplies float8 tiles (e4m3, e5m2); {what} is {v.dtype.name}"
    if len(v.dims) != 3 or v.dims[1][1] != 2:
        return (f"the double-row mode splits the contraction between the partitions and a first free axis of size 2: "
                f"{what} must be [K, 2, X], got {list(v.shape)}")
    return None


def _check_shape(shape: Sequence[int], where: str) -> tuple[int, ...]:
    if type(shape) is tuple and all([type(s) is int and s > 0 for s in shape]) and 0 < len(shape) <= MAX_TENSOR_DIMS:
        return shape  # the common case, checked in one pass: a tuple of positive ints
    try:
        # operator.index refuses 1.5 (int() would truncate it to 1); a bool is no size either
        if isinstance(shape, (str, bytes)) or any(isinstance(s, bool) for s in shape):
            raise TypeError
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise ProgramError(f"{where} tensor shape {shape!r} must be a sequence of integers") from None
    if not shape or any(s <= 0 for s in shape):
        raise ProgramError(f"{where} tensor shape {list(shape)} must be non-empty with positive sizes")
    if len(shape) > MAX_TENSOR_DIMS:
        raise ProgramError(f"{where} tensor shape {list(shape)} has {len(shape)} dimensions; at most {MAX_TENSOR_DIMS}")
    return shape


def _check_partitions(what: Callable[[], str], start: int, count: int, chip: ChipSpec, aligned: bool = True) -> None:
    """Partition range and (``aligned``) start alignment; ``what`` names the operand (built
    only on failure)."""
    limit = chip.sbuf.partitions
    if count > limit:
        raise ProgramError(f"{what()}: partition dimension {count} exceeds the {limit} partitions of {chip.name}; "
                           f"tile the first axis into pieces of {limit}")
    if start < 0 or start + count > limit:
        raise ProgramError(f"{what()}: partitions {start}..{start + count - 1} fall outside 0..{limit - 1} on {chip.name}")
    if aligned and not partition_start_ok(start, count):
        raise ProgramError(f"{what()}: start partition {start} is misaligned for {count} partitions; "
                           f"it must be {_allowed_starts(count)}")
