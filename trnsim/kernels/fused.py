"""Fused kernels: what ``torch.compile(backend="neuron")`` lowers a graph's fusions into.

A fusion is described by a :class:`Recipe`, a small straight-line program of
:class:`Step` s over one 2-D domain [N, D] (rows on partitions, 128 at a time; D along
the free axis). The compile backend (``trnsim.backend.compile``) builds recipes from FX
graphs; this module knows nothing of torch.

Operands (the kernel's inputs after the matmul operands, if any) each have a layout:

- ``"full"``: [N, D] in HBM, one value per element of the domain;
- ``"row"``: [D] in HBM, broadcast over the rows (a bias, a norm weight);
- ``"col"``: [N, 1] in HBM, broadcast along each row (per-row statistics);
- ``"scalar"``: [1] in HBM, one value broadcast everywhere.

A :class:`Ref` names a step's argument: an operand (``Ref("in", i)``), an earlier
step's value (``Ref("step", j)``), a constant known when the kernel is traced
(``Ref("const", value=x)``), or, in :func:`fused_matmul_kernel`, the matmul's product
(``Ref("mm")``, fp32 as PSUM holds it).

Step values are "full" ([128, D] tiles) or, after a reduction over D or from col and
scalar operands only, "col" ([128, 1] tiles); a step of constants only is folded when
tracing (it may not be an output). Every step computes in float64 from its arguments'
values and rounds its result once to ``Step.dtype`` (as each eager op rounds its
result; a constant enters as the float64 number it is). Values live in SBUF; only
operands are loaded from HBM and only :attr:`Recipe.outputs` are stored to it.

Step ops (``Step.op``):

- unary, one argument: exp, log, sqrt, rsqrt, reciprocal, tanh, sigmoid, relu, gelu,
  gelu_tanh, silu, abs, neg, sin, cos, erf, sign, square, copy (a cast when ``dtype``
  differs); transcendental functions are the chip's (trnsim defines them as the
  function evaluated in float64 and rounded);
- binary, two arguments (full, col or scalar values, constants broadcast): add,
  subtract, multiply, divide, maximum, minimum, power, and the comparisons equal,
  not_equal, greater, greater_equal, less, less_equal (1.0 where true, 0.0 where not);
- ``where``, three arguments: ``a if cond != 0 else b``;
- reductions over D, one full argument, giving a col value: sum, max, min, mean. Sums
  accumulate in fp32 in column order from +0 (as the engines do); mean is that fp32
  sum divided by D, rounded once.

:func:`reference` computes the same numbers in numpy; the kernels match it bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

import trnsim.nki as nki
import trnsim.nki.isa as nisa
import trnsim.nki.language as nl
from trnsim import dtypes
from trnsim.compute import reference as ref
from trnsim.hw.spec import ChipSpec, load_chip
from trnsim.isa import ActivationFunc, AluOp, Engine, ReduceOp, Select
from trnsim.nki import emit as _e

UNARY_OPS = frozenset({"exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh",
                       "silu", "abs", "neg", "sin", "cos", "erf", "sign", "square", "copy"})
BINARY_OPS = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "equal",
                        "not_equal", "greater", "greater_equal", "less", "less_equal"})
REDUCE_OPS = frozenset({"sum", "max", "min", "mean"})
LAYOUTS = ("full", "row", "col", "scalar")

TILE_P = 128       # rows per tile: one per partition
FREE_CHUNK = 2048  # columns per tile of a recipe without reductions
GROUP_MAX = 4      # row tiles traced step by step together, so the engines overlap
GROUP_SHARE = 5 / 8  # of an SBUF partition: what a group of row tiles and the shared tiles may take
_REDUCE = {"sum": ReduceOp.ADD, "mean": ReduceOp.ADD, "max": ReduceOp.MAX, "min": ReduceOp.MIN}


@dataclass(frozen=True)
class Ref:
    """An argument of a :class:`Step`: ``kind`` is ``"in"`` (operand ``index``),
    ``"step"`` (the value of step ``index``), ``"const"`` (the number ``value``) or
    ``"mm"`` (the matmul product of :func:`fused_matmul_kernel`)."""

    kind: str
    index: int = 0
    value: float = 0.0


@dataclass(frozen=True)
class Step:
    """One op of a fusion: ``op`` applied to ``args``, rounded to ``dtype`` (a chip
    dtype name: float32, bfloat16, float16, float8_e4m3, float8_e5m2)."""

    op: str
    args: tuple[Ref, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class Recipe:
    """A fusion: ``steps`` in order over operands of ``layouts``; the values of the
    steps listed in ``outputs`` are the kernel's results, in that order."""

    layouts: tuple[str, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]


# -- checks and shapes ---------------------------------------------------------------

def _arity(op: str) -> int:
    if op in UNARY_OPS or op in REDUCE_OPS:
        return 1
    if op in BINARY_OPS:
        return 2
    if op == "where":
        return 3
    raise nki.KernelError(f"fused recipe: op {op!r} is not a unary, binary, where or reduction op; use one of "
                          f"{', '.join(sorted(UNARY_OPS | BINARY_OPS | REDUCE_OPS | {'where'}))}")


def kinds(recipe: Recipe, matmul: bool = False) -> list[str]:
    """The kind of each step's value: ``"full"`` ([rows, D] tiles), ``"col"`` (one value per
    row) or ``"const"`` (a number known when tracing). Raises :class:`nki.KernelError`
    for a recipe that is not well formed, naming the step."""
    for i, lay in enumerate(recipe.layouts):
        if lay not in LAYOUTS:
            raise nki.KernelError(f"fused recipe: operand {i} has layout {lay!r}; use one of {', '.join(LAYOUTS)}")
    out: list[str] = []
    for j, step in enumerate(recipe.steps):
        if len(step.args) != _arity(step.op):
            raise nki.KernelError(f"fused recipe: step {j} ({step.op}) has {len(step.args)} arguments, needs {_arity(step.op)}")
        dtypes.as_dtype(step.dtype)
        arg_kinds = []
        for a in step.args:
            if a.kind == "in" and 0 <= a.index < len(recipe.layouts):
                arg_kinds.append("full" if recipe.layouts[a.index] in ("full", "row") else "col")
            elif a.kind == "step" and 0 <= a.index < j:
                arg_kinds.append(out[a.index])
            elif a.kind == "const":
                arg_kinds.append("const")
            elif a.kind == "mm" and matmul:
                arg_kinds.append("full")
            else:
                raise nki.KernelError(f"fused recipe: step {j} ({step.op}) refers to {a}, which is not an operand, an "
                                      f"earlier step, a constant{' or the product' if matmul else ''}")
        if step.op in REDUCE_OPS:
            if matmul:
                raise nki.KernelError(f"fused_matmul_kernel: step {j} ({step.op}) is a reduction; a matmul epilogue "
                                      "is elementwise: end the fusion before the reduction")
            if arg_kinds[0] != "full":
                raise nki.KernelError(f"fused recipe: step {j} ({step.op}) reduces a {arg_kinds[0]} value; reductions "
                                      "take a full value")
            out.append("col")
        else:
            out.append("full" if "full" in arg_kinds else "col" if "col" in arg_kinds else "const")
    for k in recipe.outputs:
        if not 0 <= k < len(recipe.steps) or out[k] == "const":
            raise nki.KernelError(f"fused recipe: output {k} is not a step computed from operands; list steps "
                                  f"0..{len(recipe.steps) - 1} that use an operand")
    return out


def has_reductions(recipe: Recipe) -> bool:
    """Whether some step reduces over D (then whole rows stay in SBUF)."""
    return any(s.op in REDUCE_OPS for s in recipe.steps)


def step_dtype(step: Step) -> dtypes.DType:
    return dtypes.as_dtype(step.dtype)


# -- the numpy reference ----------------------------------------------------------------

def _round(v: np.ndarray, dt: dtypes.DType) -> np.ndarray:
    return ref.decode(ref.encode(v, dt), dt)


_UNARY_FUNC = {"copy": ActivationFunc.IDENTITY, "gelu_tanh": ActivationFunc.GELU_TANH}


def _unary_ref(op: str, x: np.ndarray) -> np.ndarray:
    if op == "neg":
        return ref.alu(x, -1.0, AluOp.MULTIPLY)
    if op == "reciprocal":
        return ref.alu(1.0, x, AluOp.DIVIDE)
    flat = np.asarray(x, np.float64).reshape(-1, 1)
    ones = np.ones(flat.shape[0])
    return ref.activation(flat, _UNARY_FUNC.get(op, op), ones, np.zeros_like(ones)).reshape(np.shape(x))


def _step_ref(step: Step, args: list[Any], d: int) -> np.ndarray:
    if step.op in UNARY_OPS:
        return _unary_ref(step.op, args[0])
    if step.op in BINARY_OPS:
        return ref.alu(args[0], args[1], _ALU[step.op])
    if step.op == "where":
        return np.where(np.asarray(args[0]) != 0.0, args[1], args[2]).astype(np.float64)
    x = np.asarray(args[0], np.float64)
    r = ref.reduce(x.reshape(-1, x.shape[-1]), _REDUCE[step.op]).reshape(x.shape[:-1] + (1,))
    return r / d if step.op == "mean" else r


_ALU = {"add": AluOp.ADD, "subtract": AluOp.SUBTRACT, "multiply": AluOp.MULTIPLY, "divide": AluOp.DIVIDE,
        "maximum": AluOp.MAXIMUM, "minimum": AluOp.MINIMUM, "power": AluOp.POW, "equal": AluOp.IS_EQUAL,
        "not_equal": AluOp.NOT_EQUAL, "greater": AluOp.IS_GT, "greater_equal": AluOp.IS_GE, "less": AluOp.IS_LT,
        "less_equal": AluOp.IS_LE}


def reference(recipe: Recipe, operands: Sequence[Any], shape: Sequence[int], mm: Any = None) -> list[np.ndarray]:
    """The recipe's outputs computed in numpy with the chip's numerics: each step in
    float64 from its (rounded) arguments, rounded to its dtype; sums accumulate in fp32
    in column order; activations are the functions of :mod:`trnsim.compute.reference`.

    ``operands`` are arrays of the values the kernel reads (already rounded to their HBM
    dtypes), laid out as ``recipe.layouts`` says over the domain ``shape`` ([N, D], or
    [M, N] / [B, M, N] for a matmul epilogue, whose fp32 product is ``mm``). Returns
    float32 arrays: full outputs of ``shape``, col outputs of ``shape[:-1] + (1,)``."""
    step_kinds = kinds(recipe, matmul=mm is not None)
    shape = tuple(int(s) for s in shape)
    d = shape[-1]

    def operand(i: int) -> np.ndarray:
        a = np.asarray(operands[i], np.float64)
        lay = recipe.layouts[i]
        if lay == "row":
            return np.broadcast_to(a.reshape(-1), shape)
        if lay == "scalar":
            return np.broadcast_to(a.reshape(-1)[:1], shape[:-1] + (1,))
        return a

    values: list[Any] = []
    for j, step in enumerate(recipe.steps):
        args = [operand(a.index) if a.kind == "in" else values[a.index] if a.kind == "step"
                else np.asarray(mm, np.float64) if a.kind == "mm" else np.float64(a.value) for a in step.args]
        v = _round(np.asarray(_step_ref(step, args, d), np.float64), step_dtype(step))
        if step_kinds[j] == "full":
            v = np.broadcast_to(v, shape)
        values.append(v)
    return [np.ascontiguousarray(values[k], dtype=np.float32) for k in recipe.outputs]


# -- tracing a recipe on one tile ------------------------------------------------------

class Balance:
    """Which lane engine takes the next instruction that either can run: the one with
    less work given so far (counted in nanoseconds of elements, at trace time, at the
    clocks of the chip being traced for)."""

    def __init__(self, chip: ChipSpec | None = None) -> None:
        chip = chip if chip is not None else _e.tracer().chip
        self.ns = {Engine.VECTOR: 0.0, Engine.SCALAR: 0.0}
        self.per_element = {Engine.VECTOR: 1 / chip.vector_engine.clock_ghz,
                            Engine.SCALAR: 1 / chip.scalar_engine.clock_ghz}
        # the scalar engine's reciprocal takes this many cycles an element
        self.reciprocal_cycles = chip.scalar_engine.reciprocal_cycle_factor

    def charge(self, engine: Engine, elements: int) -> Engine:
        self.ns[engine] += elements * self.per_element[engine]
        return engine

    def pick(self, elements: int) -> Engine:
        engine = min(self.ns, key=lambda e: (self.ns[e], e is Engine.SCALAR))
        return self.charge(engine, elements)


def _fused_sums(recipe: Recipe, step_kinds: list[str]) -> dict[int, int]:
    """Unary steps on full values whose result a later sum or mean reduces: the scalar
    engine's activation sums what it writes, so the reduction costs nothing more."""
    fused: dict[int, int] = {}
    for r, step in enumerate(recipe.steps):
        a = step.args[0]
        if step.op in ("sum", "mean") and a.kind == "step" and a.index not in fused:
            src = recipe.steps[a.index]
            if src.op in UNARY_OPS and step_kinds[a.index] == "full":
                fused[a.index] = r
    return fused


def _const(step: Step, args: list[float]) -> float:
    """A step of constants, folded when tracing with the reference's numerics."""
    return float(_round(np.asarray(_step_ref(step, [np.float64(a) for a in args], 1), np.float64),
                        step_dtype(step)).reshape(-1)[0])


def _full_tile(v: Any, p: int, w: int) -> Any:
    """A number or a [p, 1] tile spread to a [p, w] tile."""
    if isinstance(v, float):
        return nl.full((p, w), v, nl.float32)
    if tuple(v.shape) != (p, w):
        return nl.broadcast_to(v, (p, w))
    return v


@dataclass
class Tile:
    """One tile a recipe runs on: ``p`` rows by ``w`` columns; ``operand(i)`` loads operand
    i's tile ([p, w] or [p, 1]); ``store(o, value)`` stores output ``o``; ``mm`` is the
    product tile of a matmul epilogue."""

    p: int
    w: int
    operand: Callable[[int], Any]
    store: Callable[[int, Any], None]
    mm: Any = None


def trace_steps(recipe: Recipe, step_kinds: list[str], tiles: Sequence[Tile], d: int, balance: Balance) -> None:
    """Emit the recipe's steps for a group of tiles of a domain ``d`` wide, step by step
    (step j of every tile, then step j + 1), so that while one engine works on a tile
    the other has the next tile's step to do. Each output is stored as soon as it is
    computed, and a tile is let go after its last use, so its SBUF space can take the
    next group's loads."""
    fused = _fused_sums(recipe, step_kinds)
    last: dict[tuple[str, int], int] = {}
    for j, step in enumerate(recipe.steps):
        for a in step.args:
            if a.kind in ("in", "step"):
                last[(a.kind, a.index)] = j
    loaded: list[dict[int, Any]] = [{} for _ in tiles]
    values: list[dict[int, Any]] = [{} for _ in tiles]
    sums: list[dict[int, Any]] = [{} for _ in tiles]
    for j, step in enumerate(recipe.steps):
        for t, tile in enumerate(tiles):
            for a in step.args:
                if a.kind == "in" and a.index not in loaded[t]:
                    loaded[t][a.index] = tile.operand(a.index)
            args = [loaded[t][a.index] if a.kind == "in" else values[t][a.index] if a.kind == "step"
                    else tile.mm if a.kind == "mm" else float(a.value) for a in step.args]
            value = _step(step, step_kinds[j], args, tile, d, balance, sums[t], j, fused.get(j))
            for o, k in enumerate(recipe.outputs):
                if k == j:
                    tile.store(o, value)
            if ("step", j) in last:
                values[t][j] = value
            for a in step.args:
                if last.get((a.kind, a.index)) == j:
                    (loaded[t] if a.kind == "in" else values[t]).pop(a.index, None)
            del args, value


def _step(step: Step, kind: str, args: list[Any], tile: Tile, d: int, balance: Balance, sums: dict[int, Any],
          j: int, sum_step: int | None) -> Any:
    """Emit one step of one tile; returns its value."""
    dt = step_dtype(step)
    if kind == "const":
        return _const(step, args)
    if step.op in UNARY_OPS:
        return _unary(step.op, args[0], dt, balance, sums, sum_step)
    if step.op in BINARY_OPS:
        return _binary(step.op, args[0], args[1], dt, balance)
    if step.op == "where":
        return _where(args, dt, tile.p, tile.w if kind == "full" else 1, balance)
    return _reduce(step.op, args[0], dt, d, sums.pop(j, None), balance)


def _elements(t: Any) -> int:
    return t.view.free_size


def _unary(op: str, x: Any, dt: Any, balance: Balance, sums: dict[int, Any], sum_step: int | None) -> Any:
    """neg, reciprocal and copy on whichever lane engine is freer (as exact there), other
    functions on the scalar engine; a sum of the result rides on the activation."""
    n = _elements(x)
    if sum_step is None and op in ("neg", "reciprocal"):
        engine = balance.pick(n)
        if op == "neg":
            return nisa.tensor_scalar(x, op0=nl.multiply, operand0=-1.0, dtype=dt, engine=engine)
        return nisa.tensor_scalar(x, op0=nl.divide, operand0=1.0, reverse0=True, dtype=dt, engine=engine)
    if sum_step is None and op == "copy":
        return nisa.tensor_copy(x, dtype=dt, engine=balance.pick(n))
    balance.charge(Engine.SCALAR, n * (balance.reciprocal_cycles if op == "reciprocal" else 1))
    func = "identity" if op in ("neg", "copy") else op
    scale = -1.0 if op == "neg" else 1.0
    if sum_step is None:
        return nisa.activation(op=func, data=x, scale=scale, dtype=dt)
    total = nl.ndarray((x.shape[0], 1), nl.float32)
    sums[sum_step] = total
    return nisa.activation(op=func, data=x, scale=scale, reduce_op=nl.add, reduce_res=total, dtype=dt)


def _binary(op: str, a: Any, b: Any, dt: Any, balance: Balance) -> Any:
    """Two tiles of one shape: tensor_tensor (vector engine); a tile and a column or a
    number: tensor_scalar on whichever lane engine is freer."""
    alu = _ALU[op]
    if not isinstance(a, float) and not isinstance(b, float) and tuple(a.shape) == tuple(b.shape):
        balance.charge(Engine.VECTOR, 2 * _elements(a))
        return nisa.tensor_tensor(a, b, op=alu, dtype=dt)
    wide_first = not isinstance(a, float) and (isinstance(b, float) or _elements(a) >= _elements(b))
    tile, other = (a, b) if wide_first else (b, a)
    return nisa.tensor_scalar(tile, op0=alu, operand0=other, reverse0=not wide_first, dtype=dt,
                              engine=balance.pick(_elements(tile)))


def _where(args: list[Any], dt: Any, p: int, w: int, balance: Balance) -> Any:
    """One vector-engine select; a column or number as condition or first branch is
    spread to a [p, w] tile first (the select takes a number only as its second)."""
    cond, on_true, on_false = args
    cond, on_true = _full_tile(cond, p, w), _full_tile(on_true, p, w)
    if not isinstance(on_false, float):
        on_false = _full_tile(on_false, p, w)
    out = nl.ndarray((p, w), dt)
    balance.charge(Engine.VECTOR, 2 * w)
    _e.emit(Select(out.view, cond.view, on_true.view, on_false if isinstance(on_false, float) else on_false.view,
                   engine=Engine.VECTOR))
    return out


def _reduce(op: str, x: Any, dt: Any, d: int, total: Any, balance: Balance) -> Any:
    """tensor_reduce on the vector engine, unless an activation already summed ``x`` into
    ``total``; a mean divides the fp32 sum by ``d``."""
    if total is None:
        balance.charge(Engine.VECTOR, _elements(x))
        total = nisa.tensor_reduce(op=_REDUCE[op], data=x, axis=1, dtype=nl.float32 if op == "mean" else dt)
        if op != "mean":
            return total
    elif op == "sum" and dt is nl.float32:
        return total
    if op == "mean":
        return nisa.tensor_scalar(total, op0=nl.divide, operand0=float(d), dtype=dt)
    return nisa.tensor_copy(total, dtype=dt)


# -- the row kernel ---------------------------------------------------------------------

def chunk_columns(recipe: Recipe, d: int) -> int:
    """Columns per tile: whole rows when the recipe reduces, else at most FREE_CHUNK."""
    return d if has_reductions(recipe) else min(d, FREE_CHUNK)


def _aligned(nbytes: int) -> int:
    return (nbytes + 3) // 4 * 4


def _tile_bytes(recipe: Recipe, step_kinds: list[str], w: int, operand_itemsizes: Sequence[int]) -> tuple[int, int]:
    """(bytes per partition, largest tile) of one row tile: the most its live tiles take
    at any step (operand tiles from their first use to their last, step values from
    their step to their last use, the scratch tiles of where and mean while the step
    runs, and the sums an activation makes on the side)."""
    def width(kind: str) -> int:
        return w if kind == "full" else 1

    in_bytes = {i: _aligned(width("full" if lay == "full" else "col") * operand_itemsizes[i])
                for i, lay in enumerate(recipe.layouts) if lay in ("full", "col")}
    first: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    for j, step in enumerate(recipe.steps):
        first[("step", j)] = j
        last.setdefault(("step", j), j)
        for a in step.args:
            if a.kind in ("in", "step"):
                first.setdefault((a.kind, a.index), j)
                last[(a.kind, a.index)] = j
    size = {("in", i): b for i, b in in_bytes.items()}
    size |= {("step", j): _aligned(width(k) * step_dtype(s).itemsize) for j, (s, k) in enumerate(zip(recipe.steps, step_kinds))
             if k != "const"}
    sums = 4 * len(_fused_sums(recipe, step_kinds))
    peak = 0
    for j, step in enumerate(recipe.steps):
        scratch = 3 * _aligned(width(step_kinds[j]) * 4) if step.op == "where" else 4 if step.op == "mean" else 0
        live = sum(b for key, b in size.items() if first.get(key, -1) <= j <= last.get(key, -1) and key in first)
        peak = max(peak, live + scratch + sums)
    return peak, max(size.values(), default=4)


def group_size(tile_bytes: int, shared_bytes: int, partition_bytes: int) -> int:
    """How many row tiles go through the steps together: as many as fit beside the shared
    tiles in GROUP_SHARE of the partition, at most GROUP_MAX, at least one. With two or
    more, the group, the shared tiles and one more tile take at most 15/16 of it."""
    budget = int(partition_bytes * GROUP_SHARE) - shared_bytes
    return max(1, min(GROUP_MAX, budget // max(tile_bytes, 1)))


def _shared_bytes(recipe: Recipe, w: int, operand_itemsizes: Sequence[int]) -> list[int]:
    """The row operands' [1, w] and [128, w] tiles and the scalar operands' two tiles."""
    return [2 * _aligned((w if lay == "row" else 1) * operand_itemsizes[i])
            for i, lay in enumerate(recipe.layouts) if lay in ("row", "scalar")]


def sbuf_bytes(recipe: Recipe, shape: Sequence[int], operand_itemsizes: Sequence[int], chip: ChipSpec | str | None = None) -> int:
    """An upper bound of the SBUF bytes per partition :func:`fused_rows_kernel` has placed
    at any one time for ``recipe`` over the domain ``shape`` [N, D] on ``chip`` (a
    ChipSpec or chip name; ``$TRNSIM_CHIP`` or the default when None), with operand i
    stored in HBM with ``operand_itemsizes[i]`` bytes per element. The fusion fits when
    this is at most ``chip.sbuf.partition_bytes``.

    It counts the row operands' [1, w] and [128, w] tiles and the scalar operands'
    tiles, which stay for a whole column chunk; a group of row tiles with every operand
    tile and step value live at once; and the largest tile once more, for the space
    next-fit placement can leave unused where it wraps around."""
    step_kinds = kinds(recipe)
    w = chunk_columns(recipe, int(shape[1]))
    shared = _shared_bytes(recipe, w, operand_itemsizes)
    per_tile, largest = _tile_bytes(recipe, step_kinds, w, operand_itemsizes)
    spec = load_chip(chip)
    group = group_size(per_tile, sum(shared), spec.sbuf.partition_bytes)
    return sum(shared) + group * per_tile + max(shared + [largest])


@nki.jit
def fused_rows_kernel(*operands, recipe: Recipe, shape: Sequence[int]):
    """The fusion ``recipe`` over the domain ``shape`` [N, D], rows on partitions.

    Args:
        operands: in HBM, any chip float dtypes, laid out as ``recipe.layouts``: "full"
            [N, D], "row" [D], "col" [N, 1], "scalar" [1].
        recipe: the steps (see the module docstring).
        shape: (N, D), any sizes.

    Returns:
        A tuple with one HBM tensor per ``recipe.outputs`` entry, in that order: [N, D]
        for a full value, [N, 1] for a col value, of the step's dtype.

    Memories: rows go 128 at a time (the last tile as many as are left); a recipe with
    reductions keeps whole rows in SBUF, one without works on [128, <= 2048] tiles.
    Row operands are loaded once per column chunk ([1, w]) and broadcast to a
    [128, w] SBUF tile; scalar operands once, as [128, 1]; full and col operands per
    tile. Each step is one instruction into a fresh SBUF tile of its dtype: activations
    on the scalar engine (a sum or mean of one rides on it), tensor-tensor ops and
    reductions on the vector engine, ops with a column or a number as one side as
    ``tensor_scalar`` on whichever of the two is less loaded. Only the outputs are
    stored. PSUM is not used.
    """
    step_kinds = kinds(recipe)
    n, d = (int(s) for s in shape)
    if len(operands) != len(recipe.layouts):
        raise nki.KernelError(f"fused_rows_kernel: {len(operands)} operands for the recipe's {len(recipe.layouts)} "
                              "layouts; pass one operand per layout")
    check_operand_shapes(operands, recipe.layouts, {"full": (n, d), "row": (d,), "col": (n, 1), "scalar": (1,)})
    outs = [nl.ndarray((n, d) if step_kinds[k] == "full" else (n, 1), step_dtype(recipe.steps[k]), buffer=nl.shared_hbm)
            for k in recipe.outputs]
    used = {a.index for s in recipe.steps for a in s.args if a.kind == "in"}
    scalars = {i: nl.broadcast_to(nl.load(operands[i].reshape((1, 1))), (TILE_P, 1))
               for i in sorted(used) if recipe.layouts[i] == "scalar"}
    w = chunk_columns(recipe, d)
    itemsizes = [t.dtype.itemsize for t in operands]
    group = group_size(_tile_bytes(recipe, step_kinds, w, itemsizes)[0], sum(_shared_bytes(recipe, w, itemsizes)),
                       _e.tracer().chip.sbuf.partition_bytes)
    balance = Balance()
    for c0 in nl.affine_range(0, d, w):
        cw = min(w, d - c0)
        rows = {i: nl.broadcast_to(nl.load(operands[i].reshape((1, d))[:, c0:c0 + cw]), (TILE_P, cw))
                for i in sorted(used) if recipe.layouts[i] == "row"}
        for g0 in nl.affine_range(0, n, group * TILE_P):
            tiles = [_row_tile(recipe, step_kinds, operands, outs, rows, scalars, r0, min(TILE_P, n - r0), c0, cw)
                     for r0 in range(g0, min(n, g0 + group * TILE_P), TILE_P)]
            trace_steps(recipe, step_kinds, tiles, d, balance)
        del rows
    return tuple(outs)


def check_operand_shapes(operands: Sequence[Any], layouts: Sequence[str], want: dict[str, tuple[int, ...]]) -> None:
    """Raise :class:`nki.KernelError` naming the first operand whose shape is not ``want``'s
    for its layout (a scalar may be any one-element shape)."""
    for i, (t, lay) in enumerate(zip(operands, layouts)):
        if tuple(t.shape) != want[lay] and not (lay == "scalar" and int(np.prod(t.shape)) == 1):
            raise nki.KernelError(f"fused kernel: operand {i} ({lay}) is {list(t.shape)}, expected {list(want[lay])}")


def _row_tile(recipe: Recipe, step_kinds: list[str], operands: Sequence[Any], outs: list[Any], rows: dict[int, Any],
              scalars: dict[int, Any], r0: int, p: int, c0: int, cw: int) -> Tile:
    """The tile of rows r0..r0+p, columns c0..c0+cw: where its operands come from and
    its outputs go."""

    def operand(i: int) -> Any:
        lay = recipe.layouts[i]
        if lay == "full":
            return nl.load(operands[i][r0:r0 + p, c0:c0 + cw])
        if lay == "col":
            return nl.load(operands[i][r0:r0 + p, :])
        return (rows if lay == "row" else scalars)[i][0:p, :]

    def store(o: int, value: Any) -> None:
        if step_kinds[recipe.outputs[o]] == "full":
            nl.store(outs[o][r0:r0 + p, c0:c0 + cw], value=value)
        elif c0 == 0:
            nl.store(outs[o][r0:r0 + p, :], value=value)

    return Tile(p, cw, operand, store)
