"""The vector engine's accumulator registers, one fp32 value per partition, that
``range_select``, ``select_reduce``, ``tensor_scalar_reduce``, ``tensor_scalar_cumulative``
and ``exponential`` reduce into. ``reduce_cmd`` says where each instruction's reduction
starts: ``reset_reduce`` from the reduction's identity, ``load_reduce`` from a given
value, ``reduce`` from what the last accumulating instruction left; ``idle`` leaves the
registers undefined, as NKI documents.

trnsim holds the registers in a [128, 1] fp32 tile per traced kernel, past the last byte
of SBUF that kernels allocate (they are not SBUF on the chip, so no tile a kernel places,
automatically or at an address of its own, shares their space), so chained instructions
depend on each other through it as they do on the chip. Carrying them costs
small [P, 1] vector instructions that the chip does not run: one to combine with the
carried value (``reduce``, or ``load_reduce`` from a tile), one to copy the result out
to ``reduce_res``. Except in the common case: a ``tensor_scalar_reduce`` that starts
afresh (``reset_reduce``) into an fp32 ``reduce_res`` is one instruction writing
``reduce_res``, and the registers are taken to hold what it wrote there (:func:`kept`);
a later ``reduce`` continues from that tile, as long as nothing wrote it since.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from numbers import Real
from typing import Any

from trnsim import dtypes as _dt
from trnsim.isa import AluOp, Engine, ReduceOp, View
from trnsim.nki import emit as _e
from trnsim.nki.isa.constants import reduce_cmd as reduce_cmd_enum
from trnsim.nki.isa._common import fail, reduce_res_tile, tile
from trnsim.nki.tiles import NkiTensor, _Placement
from trnsim.nki.tracer import Tracer

IDENTITY = {AluOp.ADD: 0.0, AluOp.SUBTRACT: 0.0, AluOp.MULTIPLY: 1.0, AluOp.MAXIMUM: -math.inf, AluOp.MINIMUM: math.inf}
COMBINE = {ReduceOp.ADD: AluOp.ADD, ReduceOp.MAX: AluOp.MAXIMUM, ReduceOp.MIN: AluOp.MINIMUM}
REGISTERS = 128


@dataclass
class _Registers:
    tile: NkiTensor
    holds: str | None = None   # the instruction whose reduction they hold; None when undefined
    #: where their value was written instead of into them: a [P, 1] fp32 view and the
    #: index of the instruction that wrote it (:func:`kept`)
    kept_in: tuple[View, int] | None = None


_registers: weakref.WeakKeyDictionary[Tracer, _Registers] = weakref.WeakKeyDictionary()


def _state() -> _Registers:
    tr = _e.tracer()
    regs = _registers.get(tr)
    if regs is None:
        t = tr.place_registers((REGISTERS, 1), _dt.float32, "vector_accumulator")
        regs = _registers[tr] = _Registers(NkiTensor(_Placement(tr, t), t.view()))
    return regs


def registers(partitions: int) -> View:
    """The registers of the first ``partitions`` partitions."""
    if partitions > REGISTERS:
        raise fail(f"an accumulating instruction over {partitions} partitions; the vector engine has {REGISTERS}")
    return _state().tile[0:partitions, :].view


def idle() -> None:
    """An instruction ran with ``reduce_cmd=idle``: NKI documents that the registers may
    still change, so a later ``reduce`` has nothing defined to continue."""
    regs = _registers.get(_e.tracer())
    if regs is not None:
        regs.holds = None
        regs.kept_in = None


def kept(name: str, view: View, index: int) -> None:
    """Instruction ``index`` (``name``) reduced afresh into ``view`` ([P, 1] fp32)
    rather than into the registers: they hold that value, which a later ``reduce``
    continues from ``view``."""
    regs = _state()
    regs.holds = name
    regs.kept_in = (view, index)


def start(name: str, cmd: Any, op: AluOp, init: Any, partitions: int) -> float | View:
    """Where the reduction of ``name`` starts under ``cmd``: a number or a [P, 1] view."""
    if cmd is reduce_cmd_enum.reset_reduce or cmd is reduce_cmd_enum.idle or cmd is None:
        return IDENTITY[op]
    if cmd is reduce_cmd_enum.load_reduce:
        if init is None:
            raise fail(f"{name}: reduce_cmd=load_reduce starts the accumulator from a value; pass it")
        if isinstance(init, Real):
            return float(init)
        t = tile(init, f"{name} initial value")
        if t.view.partitions != partitions or t.view.free_size != 1:
            raise fail(f"{name}: the initial value {t.name}{list(t.shape)} must be [{partitions}, 1]")
        return t.view
    if cmd is reduce_cmd_enum.reduce:
        regs = _state()
        if regs.holds is None:
            raise fail(f"{name}: reduce_cmd=reduce continues the accumulator, but no earlier instruction of this "
                       "kernel left a reduction in it (the last one ran with reduce_cmd=idle, or none ran); start "
                       "the chain with reduce_cmd=reset_reduce or load_reduce")
        if regs.kept_in is not None:
            view, index = regs.kept_in
            if view.partitions != partitions:
                raise fail(f"{name}: reduce_cmd=reduce continues {regs.holds}'s reduction over {view.partitions} "
                           f"partitions with {partitions}")
            if _e.tracer().hazards.last_writers(view) != [index]:
                raise fail(f"{name}: reduce_cmd=reduce continues {regs.holds}'s reduction, which trnsim keeps in that "
                           "instruction's reduce_res, and something wrote reduce_res since; trnsim cannot follow this "
                           "(keep reduce_res until the chain ends, or start the chain with reduce_cmd=load_reduce from it)")
            return view
        return registers(partitions)
    raise fail(f"{name}: reduce_cmd={cmd!r} is not one of nisa.reduce_cmd.idle, reset_reduce, reduce, load_reduce")


def finish(name: str, cmd: Any, op: AluOp, begin: float | View, partial: View | None, reduce_res: Any,
           partitions: int) -> None:
    """Combine the instruction's own reduction ``partial`` ([P, 1] fp32, already in the
    registers when None) with ``begin``, leave it in the registers, and copy it to
    ``reduce_res`` when given."""
    regs = _state()
    acc = registers(partitions)
    regs.kept_in = None
    if partial is not None:
        if isinstance(begin, View):
            _e.tensor_tensor(acc, begin, partial, op)
        elif begin != IDENTITY[op]:
            _e.tensor_scalar(acc, partial, op, begin)
        else:
            _e.copy_to(acc, partial)
    regs.holds = None if cmd is reduce_cmd_enum.idle else name
    if reduce_res is not None:
        res = reduce_res_tile(name, reduce_res, partitions)
        _e.copy_to(_e.flat2d(res.view), acc, Engine.VECTOR)


def scratch(begin: float | View, op: AluOp, partitions: int) -> NkiTensor | None:
    """Where the instruction writes its own row reduction: None for straight into the
    registers (it starts from the identity), else a scratch [P, 1] fp32 tile that
    :func:`finish` combines with ``begin``."""
    if not isinstance(begin, View) and begin == IDENTITY[op]:
        return None
    return _e.new_tensor((partitions, 1), _dt.float32)
