"""Static timing caches costs and DMA plans by operand signature (trnsim/hw/static.py):
a Program that reuses a signature gets exactly the costs and plans it would get had
every instruction been costed afresh, including for instructions that differ only in
what the signature must tell apart (function, reduction, dtype, memory, stationary M,
back-to-back dependency, DMA direction)."""

import pytest

from trnsim import Program, ProgramError, dtypes
from trnsim.hw.dma import plan_key
from trnsim.hw.engines import cost_key
from trnsim.hw.static import static_timing
from trnsim.isa import (Activation, ActivationFunc, AluOp, DmaCopy, Engine, ReduceOp, TensorCopy, TensorReduce,
                        TensorScalar, TensorTensor)


def _scenarios(p):
    """Lists of (instruction, deps relative to the scenario's first instruction); every
    scenario reuses the operand shapes of the others."""
    f = p.sbuf([128, 512], dtypes.float32)
    h = p.sbuf([128, 512], dtypes.bfloat16)
    h2 = p.sbuf([128, 512], dtypes.bfloat16)
    acc = p.psum([128, 512], dtypes.float32)
    red = p.sbuf([128, 1], dtypes.float32)
    hb = p.hbm([128, 512], dtypes.float32, kind="input")
    k_m = p.sbuf([128, 128], dtypes.bfloat16)
    moving = p.sbuf([128, 32], dtypes.bfloat16)
    out = p.psum([128, 32], dtypes.float32)
    out16 = p.psum([16, 32], dtypes.float32)
    vec, act = Engine.VECTOR, Engine.SCALAR
    return [
        [(Activation(f, f, ActivationFunc.EXP, engine=act), ())],
        [(Activation(f, f, ActivationFunc.RECIPROCAL, engine=act), ())],
        [(TensorReduce(red, h, ReduceOp.ADD, engine=vec), ())],
        [(TensorReduce(red, h, ReduceOp.MIN, engine=vec), ())],
        [(TensorCopy(h2, h, engine=vec), ())],
        [(TensorCopy(f, f, engine=vec), ())],
        [(TensorTensor(f, acc, f, AluOp.ADD, engine=vec), ())],
        [(TensorTensor(f, f, f, AluOp.ADD, engine=vec), ())],
        [(TensorScalar(f, f, AluOp.MULTIPLY, 2.0, engine=vec), ()),
         (TensorScalar(f, f, AluOp.MULTIPLY, 2.0, engine=vec), (0,))],
        [(("matmul", out16, k_m[:, 0:16], moving), ())],
        [(("matmul", out, k_m, moving), ())],
        [(DmaCopy(f.view(), hb.view()), ())],
        [(DmaCopy(f.view(), acc.view()), ())],
        [(DmaCopy(h.view(), hb.view()), ())],
    ]


def _add(p, inst, deps):
    if isinstance(inst, tuple):
        _, dst, stationary, moving = inst
        return p.matmul(dst, stationary, moving, deps=deps)
    inst.deps = deps
    return p.add(inst)


def _costs(p):
    timing = static_timing(p)
    return list(timing.costs), [timing.plans.get(i) for i in range(len(p))]


def test_cached_costs_and_plans_match_fresh_ones():
    shared = Program("trn2")
    for scenario in _scenarios(shared):
        first = len(shared)
        for inst, deps in scenario:
            _add(shared, inst, tuple(first + d for d in deps))
    fresh_costs, fresh_plans = [], []
    for n in range(len(_scenarios(Program("trn2")))):
        alone = Program("trn2")
        for inst, deps in _scenarios(alone)[n]:
            _add(alone, inst, deps)
        costs, plans = _costs(alone)
        fresh_costs += costs
        fresh_plans += plans
    assert _costs(shared) == (fresh_costs, fresh_plans)
    # what the keys must tell apart does change the cost
    assert len(set(fresh_costs)) >= 10


def test_keys_tell_apart_what_decides_the_cost():
    p = Program("trn2")
    exp, recip, add, low, copy16, copy32 = [inst for s in _scenarios(p)[:6] for inst, _ in s]
    assert cost_key(exp, False, 0) != cost_key(recip, False, 0)
    assert cost_key(add, False, 0) != cost_key(low, False, 0)
    assert cost_key(copy16, False, 0) != cost_key(copy32, False, 0)
    assert cost_key(add, True, 0) != cost_key(add, False, 0)
    # the stationary's M counts only for a multiply, dependency only on vector and scalar
    assert cost_key(add, False, 0) == cost_key(add, False, 128)
    dmas = [inst for s in _scenarios(p)[-3:] for inst, _ in s]
    assert len({plan_key(d) for d in dmas}) == 3


def test_timing_follows_a_program_that_grows_and_takes_an_instruction_back():
    """A Program holds no timing: what static_timing worked out for it is extended when
    the Program grows, and worked out again when the Program took an instruction back
    (a matmul whose multiply failed leaves no load behind)."""
    grown = Program("trn2")
    scenarios = _scenarios(grown)
    static_timing(grown)   # timed while empty, then grown
    for scenario in scenarios:
        first = len(grown)
        for inst, deps in scenario:
            _add(grown, inst, tuple(first + d for d in deps))
            static_timing(grown)
    fresh = Program("trn2")
    for scenario in _scenarios(fresh):
        first = len(fresh)
        for inst, deps in scenario:
            _add(fresh, inst, tuple(first + d for d in deps))
    assert _costs(grown) == _costs(fresh)
    a = grown.sbuf([128, 128], dtypes.float32)
    wrong = grown.psum([64, 128], dtypes.float32)
    before = static_timing(grown)
    with pytest.raises(ProgramError):
        grown.matmul(wrong.view(), a.view(), a.view())   # the load joins, then the multiply is refused
    assert len(grown) == len(fresh) and grown.revision == 1
    after = static_timing(grown)
    assert after is not before and _costs(grown) == _costs(fresh)
