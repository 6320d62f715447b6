"""Kernel-side tensors: HBM arguments and SBUF/PSUM tiles, and index expressions.

A :class:`NkiTensor` is a view of a placed tensor. Slicing it (with integers,
slices, :func:`ds` or ``nl.arange`` expressions) gives another view of the same
memory. A tile's space is given back when the last Python reference to it goes
away, so a tile made inside a loop body is reused by a later iteration (after
the hazard tracker has ordered the reuse behind the old accesses).
"""

from __future__ import annotations

import dis
import itertools
import sys
from numbers import Real
from typing import Any

from trnsim import isa as _isa
from trnsim.dtypes import DType, as_dtype
from trnsim.errors import ProgramError
from trnsim.isa import Memory, Tensor, View, row_major_dims
from trnsim.nki import indirect as _indirect
from trnsim.nki import operators
from trnsim.nki.tracer import KernelError, current
from trnsim.nki.views import ViewMethods

_ids = itertools.count()


class Affine:
    """An affine index expression: ``const + sum(coeff * base)`` over ``nl.arange`` bases.

    ``nl.arange(n)`` is a base ranging over 0..n-1; ``[:, None]`` puts it on the
    partition axis of an index grid and ``[None, :]`` on the free axis (NKI's
    numpy-style spelling). Comparisons give a :class:`Mask`.
    """

    __slots__ = ("terms", "const", "sizes", "axes")

    def __init__(self, terms: dict[int, int], const: int, sizes: dict[int, int], axes: dict[int, int]) -> None:
        self.terms = terms
        self.const = const
        self.sizes = sizes
        self.axes = axes

    @classmethod
    def base(cls, n: int) -> Affine:
        b = next(_ids)
        return cls({b: 1}, 0, {b: n}, {})

    def __getitem__(self, key: object) -> Affine:
        key = key if isinstance(key, tuple) else (key,)
        axis = next((i for i, k in enumerate(key) if isinstance(k, slice)), 0)
        return Affine(dict(self.terms), self.const, dict(self.sizes), {b: axis for b in self.terms})

    def _combine(self, other: object, sign: int) -> Affine:
        if isinstance(other, Affine):
            terms = dict(self.terms)
            for b, c in other.terms.items():
                terms[b] = terms.get(b, 0) + sign * c
            return Affine({b: c for b, c in terms.items() if c}, self.const + sign * other.const,
                          {**self.sizes, **other.sizes}, {**self.axes, **other.axes})
        if isinstance(other, int):
            return Affine(dict(self.terms), self.const + sign * other, self.sizes, self.axes)
        return NotImplemented

    def __add__(self, other: object) -> Affine:
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other: object) -> Affine:
        return self._combine(other, -1)

    def __rsub__(self, other: object) -> Affine:
        return (-self)._combine(other, 1)

    def __neg__(self) -> Affine:
        return Affine({b: -c for b, c in self.terms.items()}, -self.const, self.sizes, self.axes)

    def __mul__(self, k: object) -> Affine:
        if not isinstance(k, int):
            return NotImplemented
        return Affine({b: c * k for b, c in self.terms.items()}, self.const * k, self.sizes, self.axes)

    __rmul__ = __mul__

    def _cmp(self, op: str, value: object) -> Mask:
        if not isinstance(value, (int, Affine)):
            return NotImplemented
        return _and_pending(Mask(((self - value, op),)), sys._getframe(2))

    def __lt__(self, v: object) -> Mask:
        return self._cmp("lt", v)

    def __le__(self, v: object) -> Mask:
        return self._cmp("le", v)

    def __gt__(self, v: object) -> Mask:
        return self._cmp("gt", v)

    def __ge__(self, v: object) -> Mask:
        return self._cmp("ge", v)

    def single(self) -> tuple[int, int, int] | None:
        """(base, coeff, size) when the expression walks one base, else None."""
        if len(self.terms) != 1:
            return None
        (b, c), = self.terms.items()
        return b, c, self.sizes[b]


class Mask:
    """A conjunction of ``affine (lt|le|gt|ge) 0`` conditions."""

    __slots__ = ("conds",)

    def __init__(self, conds: tuple[tuple[Affine, str], ...]) -> None:
        self.conds = conds

    def __and__(self, other: object) -> Mask | bool:
        """Both conditions; a Python bool (a condition on loop counters, which are numbers
        while a kernel is traced) keeps this mask (True) or masks everything off (False)."""
        if isinstance(other, bool):
            return self if other else False
        if not isinstance(other, Mask):
            return NotImplemented
        return Mask(self.conds + other.conds)

    __rand__ = __and__

    def __bool__(self) -> bool:
        """``m and c`` (NKI's examples write ``mask=(ix < n and iy < m)``) is both
        conditions, as NKI's compiler reads the kernel's source: the comparison that
        follows ``and`` takes this mask in. Any other truth test (``if``, ``or``,
        ``not``) is refused, as NKI refuses control flow on ``nl.arange`` indices."""
        frame = sys._getframe(1)
        end = _and_end(frame)
        if end is None:
            raise KernelError("a mask has no truth value: control flow depending on nl.arange indices is not "
                              "supported (NKI's err_control_flow_condition_depending_on_arange); combine "
                              "conditions with & (as in (i_p >= 64) & (i_p < 128)) and pass them as mask=")
        _pending_and[:] = [(frame, frame.f_lasti, end, self)]
        return True

    def grid_axes(self) -> dict[int, int]:
        """For each base: the axis of the index grid it sits on (``[:, None]`` axis 0,
        ``[None, :]`` axis 1, ...; a bare ``nl.arange(n)`` axis 0)."""
        return {b: expr.axes.get(b, 0) for expr, _ in self.conds for b in expr.terms}

    def ranges(self) -> dict[int, tuple[int, int]]:
        """For each base a condition constrains alone: the [lo, hi) of its values that pass.

        An affine condition on one base passes on an interval of it, so each base
        keeps the intersection of its intervals."""
        tests = {"lt": lambda v: v < 0, "le": lambda v: v <= 0, "gt": lambda v: v > 0, "ge": lambda v: v >= 0}
        out: dict[int, tuple[int, int]] = {}
        for expr, op in self.conds:
            one = expr.single()
            if one is None:
                continue
            b, c, n = one
            passing = [k for k in range(n) if tests[op](c * k + expr.const)]
            lo, hi = (passing[0], passing[-1] + 1) if passing else (0, 0)
            old_lo, old_hi = out.get(b, (0, n))
            lo, hi = max(lo, old_lo), min(hi, old_hi)
            out[b] = (lo, max(lo, hi))
        return out


#: The mask before an ``and`` whose right side is being evaluated: (frame, offset of
#: the truth test, offset where the ``and`` ends, mask).
_pending_and: list[tuple[Any, int, int, Mask]] = []


def _and_end(frame: Any) -> int | None:
    """Where the ``and`` ends whose truth test is running in ``frame``, or None when the
    truth test is not the left side of an ``and`` (Python 3.11's JUMP_IF_FALSE_OR_POP;
    COPY, TO_BOOL and POP_JUMP_IF_FALSE from 3.12)."""
    code = list(dis.get_instructions(frame.f_code))
    at = next((i for i, ins in enumerate(code) if ins.offset == frame.f_lasti), None)
    if at is None:
        return None
    ins = code[at]
    if ins.opname == "JUMP_IF_FALSE_OR_POP":
        return ins.argval
    if ins.opname == "TO_BOOL" and at + 1 < len(code):
        at, ins = at + 1, code[at + 1]
    if ins.opname == "POP_JUMP_IF_FALSE" and at >= 1 and code[at - 1].opname in ("COPY", "TO_BOOL") and \
            any(c.opname == "COPY" for c in code[max(0, at - 2):at]):
        return ins.argval
    return None


def _and_pending(mask: Mask, frame: Any) -> Mask:
    """``mask`` and the mask an ``and`` being evaluated in ``frame`` started with."""
    if not _pending_and:
        return mask
    pframe, start, end, left = _pending_and[0]
    if pframe is frame and start < frame.f_lasti < end:
        return left & mask  # type: ignore[return-value]
    _pending_and.clear()
    return mask


class tile_size:
    """Tile limits (NKI's ``nl.tile_size``), as NKI documents them for a NeuronCore
    with 128 partitions of 192 KiB SBUF and 16 KiB PSUM (8 banks of 2 KiB)."""

    pmax = 128
    psum_fmax = 512
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8
    sbuf_fmax_bytes = 192 * 1024
    sbuf_fmax = sbuf_fmax_bytes // 4
    sbuf_size_bytes = 128 * sbuf_fmax_bytes
    total_available_sbuf_size = sbuf_fmax_bytes
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4
    sbuf_min_align = 1


def ds(start: int, size: int) -> slice:
    """A slice of ``size`` elements from ``start`` (NKI's ``nl.ds``)."""
    start = int(start)
    return slice(start, start + int(size))


class IndexGrid(tuple):  # type: ignore[type-arg]
    """What ``nl.mgrid[...]`` of several axes gives: the index expressions, one per axis,
    which unpack as a tuple (``i_p, i_f = nl.mgrid[0:128, 0:512]``) or are read by name as
    NKI names them: ``.p`` the partition axis, then ``.x``, ``.y``, ``.z`` the free axes
    (``grid = nl.mgrid[0:128, 0:512]; a[grid.p, grid.x]``)."""

    def _axis(self, axis: int, name: str) -> Any:
        if axis >= len(self):
            raise AttributeError(f"this nl.mgrid has {len(self)} axes, so no .{name}: "
                                 f"its axes are {', '.join('.' + n for n in 'pxyz'[:len(self)])}")
        return self[axis]

    p = property(lambda self: self._axis(0, "p"))
    x = property(lambda self: self._axis(1, "x"))
    y = property(lambda self: self._axis(2, "y"))
    z = property(lambda self: self._axis(3, "z"))


class _MGrid:
    """``nl.mgrid[0:128, 0:512]``: one ``nl.arange`` expression per axis, each on its own
    axis of the index grid (``i_p, i_f = nl.mgrid[0:128, 0:512]``, or ``grid.p`` and
    ``grid.x``: :class:`IndexGrid`), as numpy's mgrid."""

    def __getitem__(self, key: object) -> Any:
        keys = key if isinstance(key, tuple) else (key,)
        out = []
        for axis, k in enumerate(keys):
            if not isinstance(k, slice) or k.stop is None:
                raise TypeError(f"nl.mgrid takes slices with a stop, as in nl.mgrid[0:128, 0:512]; got {k!r}")
            r = range(k.start or 0, k.stop, k.step or 1)
            base = Affine.base(len(r)) * r.step + r.start
            out.append(Affine(base.terms, base.const, base.sizes, {b: axis for b in base.terms}))
        return IndexGrid(out) if isinstance(key, tuple) else out[0]


mgrid = _MGrid()


def reinterpret(view: View, dtype: Any) -> NkiTensor:
    """NKI's ``t.view(dtype)``: the bytes of the tensor ``view`` covers read as ``dtype``,
    the last dimension scaled by the ratio of the sizes (no data moves). ``view`` must
    be its whole tensor."""
    tr = current()
    t = view.tensor
    try:
        new = as_dtype(dtype)
    except (ProgramError, TypeError, ValueError) as e:
        raise tr.fail(f"{t.name}.view({dtype!r}): {e}") from None
    if view.offset or view.dims != row_major_dims(t.shape):
        raise tr.fail(f"{t.name}{list(view.shape)}.view({new.name}): reinterpret the whole tensor "
                      f"{t.name}{list(t.shape)}, then index or .ap() the result")
    row_bytes = t.shape[-1] * t.dtype.itemsize
    if row_bytes % new.itemsize:
        raise tr.fail(f"{t.name}{list(t.shape)} {t.dtype.name}.view({new.name}): the last dimension's {row_bytes} "
                      f"bytes do not divide into {new.itemsize}-byte elements")
    shape = t.shape[:-1] + (row_bytes // new.itemsize,)
    name = tr.fresh_name(f"{t.name}_as_{new.name}")
    program = tr.program
    try:
        alias = (program.hbm_alias if t.memory is Memory.HBM else program.on_chip_alias)(t, shape, new, name)
    except ProgramError as e:
        raise tr.fail(str(e)) from None
    if t.memory is Memory.HBM:
        tr.hazards.register(program.aliases[id(alias)])
    root = program.aliases[id(alias)]
    return NkiTensor(_AliasPlacement(tr, alias, tr.placements.get(id(root))), alias.view())


class _Placement:
    """Owns a placed tensor; an on-chip tile's space goes back when this object dies."""

    __slots__ = ("tracer", "tensor", "__weakref__")

    def __init__(self, tracer: Any, tensor: Tensor) -> None:
        self.tracer = tracer
        self.tensor = tensor
        if tensor.on_chip:
            tracer.placements[id(tensor)] = self

    def __del__(self) -> None:
        if self.tensor.on_chip and self.tracer.live:
            self.tracer.release(self.tensor)


class _AliasPlacement(_Placement):
    """A tensor read as another dtype (:func:`reinterpret`): it keeps its base's
    placement, so the base's space stays while the alias is named."""

    __slots__ = ("base",)

    def __init__(self, tracer: Any, tensor: Tensor, base: _Placement | None) -> None:
        self.tracer = tracer
        self.tensor = tensor
        self.base = base

    def __del__(self) -> None:
        pass


def _operand(o: object) -> bool:
    """Whether ``o`` is something a tile compares with elementwise (a tile or a number)."""
    return isinstance(o, (NkiTensor, Real)) and not isinstance(o, bool)


class NkiTensor(ViewMethods):
    """A tensor a kernel works on: an HBM argument or output, or an SBUF/PSUM tile.

    Besides indexing it has NKI's view methods (``permute``, ``slice``, ``select``,
    ``reshape_dim``, ``ap``, ... in :mod:`trnsim.nki.views`)."""

    __slots__ = ("_placement", "view", "bases", "overrun", "indirect")

    def __init__(self, placement: _Placement, view: View, bases: tuple[int | None, ...] | None = None,
                 overrun: tuple[int, ...] | None = None, indirect: _indirect.Indirection | None = None) -> None:
        self._placement = placement
        self.view = view
        self.bases = bases if bases is not None else (None,) * len(view.shape)
        #: Per axis, how many elements an ``nl.arange`` index asked for past the end of an
        #: HBM tensor (the last tile of a masked loop); the view stops at the end.
        self.overrun = overrun if overrun is not None else (0,) * len(view.shape)
        #: How an index tile chooses the rows of an indirect access (``x[idx_tile, :]``),
        #: or None (see :mod:`trnsim.nki.indirect`).
        self.indirect = indirect

    @property
    def tensor(self) -> Tensor:
        return self.view.tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return self.view.shape

    @property
    def dtype(self) -> DType:
        return self.view.dtype

    @property
    def ndim(self) -> int:
        return len(self.view.shape)

    @property
    def buffer(self) -> Memory:
        return self.view.memory

    @property
    def name(self) -> str:
        return self.view.tensor.name

    def _expand(self, index: object) -> tuple[object, ...]:
        """``index`` as a tuple with ``...`` spelled out as full slices."""
        index = index if isinstance(index, tuple) else (index,)
        if any(idx is Ellipsis for idx in index):
            at = next(i for i, idx in enumerate(index) if idx is Ellipsis)
            fill = len(self.view.shape) - (len(index) - 1)
            index = index[:at] + (slice(None),) * fill + index[at + 1:]
        return index

    def _grid_axes(self, index: tuple[object, ...]) -> list[int] | None:
        """The index-grid axis each ``nl.arange`` index walks, when the indices need the
        general path: an index with several bases, or bases whose grid axes are not in
        the tensor's axis order (``out[i_f, i_p]`` stores a transpose)."""
        affines = [idx for idx in index if isinstance(idx, Affine) and idx.terms]
        if not affines:
            return None
        if any(len(a.terms) > 1 for a in affines):
            return []
        axes = [next(iter(a.axes.values()), None) for a in affines]
        if None in axes or axes == sorted(axes):
            return None
        return axes

    def _general(self, index: tuple[object, ...]) -> NkiTensor:
        """Index with ``nl.arange`` expressions walking the index grid in its own axis
        order: each base adds a (stride, count) dim on its grid axis, so ``x[i_f, i_p]``
        is ``x`` walked transposed and ``x[i_p, 32 * i_a + i_b]`` splits one axis in two."""
        tr = self._placement.tracer
        v = self.view
        if len(index) > len(v.dims):
            raise tr.fail(f"too many indices ({len(index)}) for {self.name}{list(v.shape)}")
        offset = v.offset
        grid: dict[int, tuple[int, int, int]] = {}
        over_at: dict[int, int] = {}   # grid axis -> elements asked past the end of the tensor
        for axis, idx in enumerate(index):
            stride, count = v.dims[axis]
            if isinstance(idx, int):
                idx = Affine({}, idx, {}, {})
            if not isinstance(idx, Affine):
                raise tr.fail(f"index {axis} of {self.name}: mix nl.arange expressions only with integers here "
                              "(not slices) when an index combines several nl.arange terms or transposes axes")
            sizes = dict(idx.sizes)
            lo = idx.const + sum(min(0, c * (sizes[b] - 1)) for b, c in idx.terms.items())
            hi = idx.const + sum(max(0, c * (sizes[b] - 1)) for b, c in idx.terms.items())
            if lo < 0 or hi >= count:
                cut = self._overrun_cut(idx, hi - (count - 1)) if lo >= 0 else None
                if cut is None:
                    raise tr.fail(f"index {axis} of {self.name}{list(v.shape)} reaches {lo if lo < 0 else hi}, "
                                  f"outside 0..{count - 1}")
                b, keep = cut
                over_at[idx.axes.get(b, axis)] = sizes[b] - keep
                sizes[b] = keep
            offset += idx.const * stride
            for b, c in idx.terms.items():
                g = idx.axes.get(b, axis)
                if g in grid:
                    raise tr.fail(f"two nl.arange terms indexing {self.name} sit on the same grid axis {g}; "
                                  "give each its own axis ([:, None], [None, :], ...)")
                grid[g] = (c * stride, sizes[b], b)
        rest = [(d, None) for d in v.dims[len(index):]]
        ordered = [(grid[g][:2], grid[g][2]) for g in sorted(grid)] + rest
        overrun = tuple(over_at.get(g, 0) for g in sorted(grid)) + (0,) * len(rest)
        if v.tensor.on_chip and (not ordered or ordered[0][0][0] % v.tensor.row_elems or
                                 any(s_ % v.tensor.row_elems == 0 and s_ and n > 1 for (s_, n), _ in ordered[1:])):
            raise tr.fail(f"index of tile {self.name} moves its partition axis off the first grid axis; engines "
                          "read a tile partition by partition, so transpose it with nl.transpose or nisa.nc_transpose")
        view = View(v.tensor, offset, tuple(d for d, _ in ordered))
        return NkiTensor(self._placement, view, tuple(b for _, b in ordered), overrun)

    def _overrun_cut(self, idx: Affine, over: int) -> tuple[int, int] | None:
        """How an index of an HBM tensor that runs ``over`` elements past its end stops at
        the end, as a masked access does (``x[i_h + i_k]`` under ``mask=i_h < n``): the
        base on the lowest grid axis whose range alone can absorb the overrun keeps its
        first ``keep`` values; the access then needs a mask (see ``check_overrun``). None
        when no base can, or the tensor is on chip (tiles have no masked tail)."""
        if self.view.tensor.on_chip:
            return None
        for b in sorted((b for b, c in idx.terms.items() if c > 0), key=lambda b: idx.axes.get(b, 0)):
            keep = idx.sizes[b] - -(-over // idx.terms[b])
            if keep >= 1:
                return b, keep
        return None

    def __getitem__(self, index: object) -> NkiTensor:
        keys = index if index.__class__ is tuple else (index,)
        for k in keys:
            if k.__class__ is not slice and k.__class__ is not int:
                break
        else:
            if self.indirect is None:
                return self._plain(keys)
        _indirect.direct(self, "indexing it again")
        index = self._expand(index)
        if any(isinstance(k, NkiTensor) or type(k).__name__ == "MatmulResult" for k in index):
            return _indirect.subscript(self, index)
        if self._grid_axes(index) is not None:
            return self._general(index)
        plain: list[object] = []
        bases: list[int | None] = []
        over: list[int] = []
        for axis, idx in enumerate(index):
            over.append(0)
            if isinstance(idx, Affine):
                one = idx.single()
                if one is None and idx.terms:
                    raise self._placement.tracer.fail(f"index {axis} of {self.name} mixes several nl.arange bases; "
                                                      "index each axis with one")
                if one is None:
                    plain.append(idx.const)
                    bases.append(None)
                    continue
                b, c, n = one
                if c <= 0:
                    raise self._placement.tracer.fail(f"index {axis} of {self.name} steps by {c}; only positive steps "
                                                      "are supported")
                if idx.const < 0:
                    raise self._placement.tracer.fail(
                        f"index {axis} of {self.name} starts at {idx.const}, before the start of the axis; "
                        "shift the nl.arange expression so it starts at 0 or more")
                stop = idx.const + c * (n - 1) + 1
                end = self.view.shape[axis] if axis < len(self.view.shape) else stop
                start = idx.const
                if not self.view.tensor.on_chip and end < stop:
                    # a mask on the load or store keeps the access inside (they check it has
                    # one); an access wholly past the end is one a mask turns off
                    over[axis] = n - max(0, (end - start + c - 1) // c)
                    start, stop = min(start, end), end
                plain.append(slice(start, stop, c))
                bases.append(b)
            else:
                if isinstance(idx, slice) and not self.view.tensor.on_chip and axis < len(self.view.shape):
                    idx, over[axis] = _clamp(idx, self.view.shape[axis])
                plain.append(idx)
                if isinstance(idx, slice):
                    bases.append(None)
                elif not isinstance(idx, int):
                    raise self._placement.tracer.fail(f"index {idx!r} on axis {axis} of {self.name}: use integers, "
                                                      "slices, nl.ds or nl.arange expressions")
        try:
            view = self.view[tuple(plain)]
        except Exception as e:  # noqa: BLE001 - a bad index is the kernel line's error
            raise self._placement.tracer.fail(f"{self.name}: {e}") from None
        if self.view.tensor.on_chip and len(view.dims) == 1 and len(self.view.dims) > 1:
            view = _keep_free_axis(view)
        kept = [b for idx, b in zip(plain, bases) if not isinstance(idx, int)]
        if self.view.tensor.on_chip and plain and isinstance(plain[0], int):
            kept.insert(0, None)  # the partition axis stays
        kept += list(self.bases[len(index):])
        kept += [None] * len(view.shape)
        overrun = [o for idx, o in zip(plain, over) if not isinstance(idx, int)] + [0] * len(view.shape)
        return NkiTensor(self._placement, view, tuple(kept[: len(view.shape)]), tuple(overrun[: len(view.shape)]))

    def _plain(self, keys: tuple[slice | int, ...]) -> NkiTensor:
        """``self[keys]`` for an index of Python ints and slices only (the common case):
        no ``nl.arange`` bases to carry and nothing to overrun."""
        over: list[int] = []
        if not self.view.tensor.on_chip:
            clamped = [_clamp(k, size) for k, size in zip(keys, self.view.shape)]
            keys = tuple(k for k, _ in clamped) + keys[len(clamped):]
            over = [o for k, o in clamped if k.__class__ is slice]
        try:
            view = self.view[keys]
        except Exception as e:  # noqa: BLE001 - a bad index is the kernel line's error
            raise self._placement.tracer.fail(f"{self.name}: {e}") from None
        if self.view.tensor.on_chip and len(view.dims) == 1 and len(self.view.dims) > 1:
            view = _keep_free_axis(view)
        kept: list[int | None] = [None for k in keys if k.__class__ is slice]
        if keys and keys[0].__class__ is int and self.view.tensor.on_chip:
            kept.append(None)  # the partition axis stays
        kept += self.bases[len(keys):]
        n = len(view.shape)
        return NkiTensor(self._placement, view, tuple(kept[:n]), tuple((over + [0] * n)[:n]))

    def reshape(self, shape: tuple[int, ...] | list[int]) -> NkiTensor:
        """The same elements under a new shape; the view must be contiguous (past the
        partition axis for tiles, which keep their partitions)."""
        _indirect.direct(self, "reshape")
        shape = tuple(int(s) for s in shape)
        v = self.view
        tr = self._placement.tracer
        total = 1
        for s_ in shape:
            total *= s_
        if total != v.size:
            raise tr.fail(f"cannot reshape {self.name}{list(v.shape)} ({v.size} elements) to {list(shape)}")
        body = shape[1:] if v.tensor.on_chip else shape
        if v.tensor.on_chip and shape[0] != v.partitions:
            raise tr.fail(f"reshape of tile {self.name} must keep its {v.partitions} partitions, got {list(shape)}")
        inner = v.free_size if v.tensor.on_chip else v.size
        if v.contiguous_run() != inner:
            raise tr.fail(f"reshape of {self.name}{list(v.shape)} needs a contiguous view; copy it first")
        dims = list(row_major_dims(tuple(body)))
        if v.tensor.on_chip:
            dims.insert(0, v.dims[0])
        return NkiTensor(self._placement, View(v.tensor, v.offset, tuple(dims)))

    def broadcast_to(self, shape: tuple[int, ...] | list[int]) -> NkiTensor:
        """This tile copied to ``shape`` (see ``nl.broadcast_to``)."""
        return operators.language().broadcast_to(self, shape)

    def ap(self, pattern: list[list[int]] | tuple[tuple[int, int], ...], offset: int = 0, **kwargs: Any) -> NkiTensor:
        """An explicit access pattern: ``[[step, count], ...]`` in elements, partitions first
        for a tile, starting ``offset`` elements past this view's start."""
        tr = self._placement.tracer
        _indirect.direct(self, "ap")
        dims = tuple((int(step), int(count)) for step, count in pattern)
        if kwargs.get("scalar_offset") is not None or kwargs.get("vector_offset") is not None:
            return _indirect.ap(self, dims, offset, kwargs.get("vector_offset"), kwargs.get("scalar_offset"),
                                int(kwargs.get("indirect_dim", 0)))
        dtype = kwargs.get("dtype")
        if dtype is not None and as_dtype(dtype) is not self.dtype:
            # the pattern is in elements of the new dtype, from this view's start in bytes
            start = self.view.offset * self.dtype.itemsize
            whole = reinterpret(self.view.tensor.view(), dtype)
            if start % whole.dtype.itemsize:
                raise tr.fail(f"{self.name}.ap(dtype={whole.dtype.name}): this view starts at byte {start}, not at a "
                              f"{whole.dtype.itemsize}-byte element")
            return whole.ap(pattern, start // whole.dtype.itemsize + int(offset))
        view = View(self.view.tensor, self.view.offset + int(offset), dims)
        if view.offset < 0:
            raise tr.fail(f"{self.name}.ap({[list(d) for d in dims]}, offset={offset}) starts at element "
                          f"{view.offset}, before the tensor's first")
        # one reaching past the end is refused by the instruction that uses it: kernels make
        # such views for iterations a condition then skips (output_projection_tkg)
        return NkiTensor(self._placement, view)

    def __repr__(self) -> str:
        return f"NkiTensor({self.view!r})"

    # Expressions in the value-returning style: ``a * b + 1.0``.
    def _op(self, name: str, other: object, reverse: bool = False) -> NkiTensor:
        fn = getattr(operators.language(), name)
        return fn(other, self) if reverse else fn(self, other)

    def __add__(self, o: object) -> NkiTensor:
        return self._op("add", o)

    def __radd__(self, o: object) -> NkiTensor:
        return self._op("add", o, True)

    def __sub__(self, o: object) -> NkiTensor:
        return self._op("subtract", o)

    def __rsub__(self, o: object) -> NkiTensor:
        return self._op("subtract", o, True)

    def __mul__(self, o: object) -> NkiTensor:
        return self._op("multiply", o)

    def __rmul__(self, o: object) -> NkiTensor:
        return self._op("multiply", o, True)

    def __truediv__(self, o: object) -> NkiTensor:
        return self._op("divide", o)

    def __rtruediv__(self, o: object) -> NkiTensor:
        return self._op("divide", o, True)

    def __neg__(self) -> NkiTensor:
        return operators.language().negative(self)

    def __pow__(self, o: object) -> NkiTensor:
        return self._op("power", o)

    def __mod__(self, o: object) -> NkiTensor:
        return self._op("mod", o)

    # comparisons give 1/0 tiles, as in NKI; a tile stays hashable by identity
    __hash__ = object.__hash__

    def __eq__(self, o: object) -> Any:   # type: ignore[override]
        return self._op("equal", o) if _operand(o) else NotImplemented

    def __ne__(self, o: object) -> Any:   # type: ignore[override]
        return self._op("not_equal", o) if _operand(o) else NotImplemented

    def __gt__(self, o: object) -> NkiTensor:
        return self._op("greater", o)

    def __ge__(self, o: object) -> NkiTensor:
        return self._op("greater_equal", o)

    def __lt__(self, o: object) -> NkiTensor:
        return self._op("less", o)

    def __le__(self, o: object) -> NkiTensor:
        return self._op("less_equal", o)

    def __bool__(self) -> bool:
        if self.buffer is Memory.HBM:
            # an HBM tensor is a handle, true as any object is (``x = nl.load(t) if t else None``
            # tests whether an optional tensor was passed); its values are never tested here
            return True
        raise current().fail("a tile has no truth value while the kernel is traced (its values are not known yet); "
                            "select with nl.where or a mask= instead of an if on a tile")

    def __iadd__(self, other: object) -> NkiTensor:
        nl = operators.language()
        if _masked_off(self, other):
            return self
        if isinstance(other, nl.MatmulResult):
            other.accumulate_into(self)
            return self
        nl.add(self, other, out=self)
        return self

    def __setitem__(self, index: object, value: object) -> None:
        temporary = sys.getrefcount(value) <= _TEMPORARY_REFS   # before the call below holds it too
        self.assign(index, value, temporary)

    def assign(self, index: object, value: object, temporary: bool) -> None:
        """``self[index] = value``; ``temporary``: nothing but the assignment holds
        ``value`` (its instruction may then write ``self[index]`` itself)."""
        nl = operators.language()
        target = self[index]
        if _masked_off(target, value):
            return
        if isinstance(value, nl.MatmulResult):
            value.write_into(target, accumulate=False)
        elif isinstance(value, NkiTensor) and value.view.tensor is target.view.tensor and \
                value.view.offset == target.view.offset and value.view.dims == target.view.dims:
            return  # ``t[i] += x`` already wrote t[i] in place; Python only stores it back
        elif temporary and isinstance(value, NkiTensor) and sys.getrefcount(value._placement) <= _SOLE_REFS and \
                current().retarget(value, target):
            return  # ``t[i] = nl.exp(x)``: the instruction that made the temporary writes t[i] itself
        else:
            nl.copy_into(target, value)
            if isinstance(value, NkiTensor):
                current().running_assigned(value, target)


class _Probe:
    """Counts the references a value assigned with ``probe[key] = value`` has inside
    ``__setitem__`` when nothing else names it: the interpreter's own, which differ
    between Python versions."""

    refs = 0

    def __setitem__(self, key: object, value: object) -> None:
        _Probe.refs = sys.getrefcount(value)


_Probe()[0] = object()
#: references to a value in ``NkiTensor.__setitem__`` that is a temporary (``t[i] = f(x)``):
#: one more means a name or a container holds it, and it may be read again
_TEMPORARY_REFS = _Probe.refs
#: references to an object held by one attribute, seen by ``sys.getrefcount``
_HELD = [_Probe()]
_SOLE_REFS = sys.getrefcount(_HELD[0])
del _HELD


def _keep_free_axis(view: View) -> View:
    """A tile keeps a free axis: ``t[:, i]`` of a [P, F] tile is [P, 1], as on the chip
    (NKI's kernels go on to index it as ``t[:, 0]``)."""
    return View(view.tensor, view.offset, (view.dims[0], (1, 1)))


def _clamp(key: object, size: int) -> tuple[object, int]:
    """A slice of an HBM axis that runs past its end (the last tile of a loop whose
    load or store is masked, as NKI lets a kernel write ``t[k * 128:(k + 1) * 128]``):
    the slice up to the end and how many elements it asked for past it; the load or
    store checks a mask keeps the access inside. Anything else passes unchanged."""
    if key.__class__ is not slice or key.step not in (None, 1) or key.stop is None:
        return key, 0
    start = 0 if key.start is None else key.start
    if not (0 <= start and size < key.stop):
        return key, 0
    return slice(min(start, size), size), key.stop - max(start, size)


def _masked_off(target: NkiTensor, value: object) -> bool:
    """Whether ``value`` came from a call under ``mask=False`` (so ``target = value`` or
    ``target += value`` does nothing, as NKI's compiler skips the instruction that would
    have written ``target``); ``target`` then reads as its old contents."""
    if not isinstance(value, NkiTensor):
        return False
    tr = current()
    if id(value.view.tensor) not in tr.masked_off or tr.written(value.view):
        return False
    tr.masked_off[id(target.view.tensor)] = target.view.tensor
    return True


class ParDim(int):
    """A shape entry marked as the partition dimension (``nl.par_dim(128)``)."""


class BlockedTile:
    """A tile with block dimensions before its partition dimension, as NKI's legacy
    ``nl.ndarray((4, nl.par_dim(128), 512), buffer=nl.sbuf)``: four [128, 512] tiles.

    Its memory is one tile with the partition axis first (here [128, 4, 512]).
    Indexing the block dimensions with integers gives an ordinary tile
    (``t[i]``, ``t[i, :, 0:256]``); ``t[i] = value`` and ``t[i] += nl.matmul(...)`` write
    block ``i``.
    """

    __slots__ = ("whole", "blocks", "shape")

    def __init__(self, whole: NkiTensor, blocks: int, shape: tuple[int, ...]) -> None:
        self.whole = whole
        self.blocks = blocks
        self.shape = shape

    @property
    def view(self) -> View:
        """The whole memory, partition axis first."""
        return self.whole.view

    @property
    def tensor(self) -> Tensor:
        return self.whole.tensor

    @property
    def dtype(self) -> DType:
        return self.whole.dtype

    @property
    def buffer(self) -> Memory:
        return self.whole.buffer

    @property
    def name(self) -> str:
        return self.whole.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def _split(self, index: object) -> tuple[NkiTensor, tuple[object, ...]]:
        index = index if isinstance(index, tuple) else (index,)
        head, rest = index[: self.blocks], index[self.blocks:]
        tr = self.whole._placement.tracer
        if len(head) < self.blocks or not all(isinstance(i, int) for i in head):
            raise tr.fail(f"index the block dimensions of {self.name}{list(self.shape)} with integers first "
                          f"(as in {self.name}[i]); got {index!r}")
        for axis, (i, n) in enumerate(zip(head, self.shape)):
            if not -n <= i < n:
                raise tr.fail(f"block index {i} is out of range for dimension {axis} of size {n} of {self.name}")
        block = self.whole[(slice(None),) + tuple(i % n for i, n in zip(head, self.shape))]
        return block, rest

    def __getitem__(self, index: object) -> NkiTensor | BlockedTile:
        key = index if isinstance(index, tuple) else (index,)
        if 0 < len(key) < self.blocks and all(isinstance(i, int) for i in key):
            # the leading block dimensions only: the tiles of the rest, still blocked
            tr = self.whole._placement.tracer
            for axis, (i, n) in enumerate(zip(key, self.shape)):
                if not -n <= i < n:
                    raise tr.fail(f"block index {i} is out of range for dimension {axis} of size {n} of {self.name}")
            sub = self.whole[(slice(None),) + tuple(i % n for i, n in zip(key, self.shape))]
            return BlockedTile(sub, self.blocks - len(key), self.shape[len(key):])
        block, rest = self._split(index)
        return block[rest] if rest else block

    def __setitem__(self, index: object, value: object) -> None:
        temporary = sys.getrefcount(value) <= _TEMPORARY_REFS
        block, rest = self._split(index)
        block.assign(rest if rest else (slice(None),), value, temporary)

    def __repr__(self) -> str:
        return f"BlockedTile({self.name}{list(self.shape)}, {self.blocks} block dims)"


# ``t.view(dtype)``: a kernel's tensor keeps its access pattern (a View) as ``t.view``,
# so calling it is NKI's reinterpretation
_isa.VIEW_CALL[:] = [reinterpret]
