"""The view methods of NKI's tensor class (``t.permute``, ``t.slice``, ``t.select``, ...).

Each returns a new :class:`~trnsim.nki.tiles.NkiTensor` over the same memory with
a different ``(stride, count)`` access pattern; no data moves. A tile keeps its
partition axis first, as the engines read tiles partition by partition.
"""

from __future__ import annotations

import math
from typing import Any

from trnsim.isa import View
from trnsim.nki import operators


class ViewMethods:
    """Mixed into NkiTensor: views built from ``self.view`` and ``self.bases``."""

    __slots__ = ()

    def _derive(self, dims: list[tuple[int, int]], bases: list[int | None], offset: int | None = None) -> Any:
        v = self.view  # type: ignore[attr-defined]
        if self.indirect is not None:  # type: ignore[attr-defined]
            raise self._placement.tracer.fail(  # type: ignore[attr-defined]
                f"{self.name} is indexed through a tile (indirect DMA); take views of the tensor before indexing "  # type: ignore[attr-defined]
                "it with the tile")
        return type(self)(self._placement, View(v.tensor, v.offset if offset is None else offset, tuple(dims)),  # type: ignore[attr-defined]
                          tuple(bases))

    def _dim(self, dim: int, what: str) -> int:
        n = len(self.view.dims)  # type: ignore[attr-defined]
        if not -n <= dim < n:
            raise self._placement.tracer.fail(f"{what}: dim {dim} is out of range for {n} dimensions")  # type: ignore[attr-defined]
        return dim % n

    def _keep_partitions(self, dim: int, what: str) -> None:
        if dim == 0 and self.view.tensor.on_chip:  # type: ignore[attr-defined]
            raise self._placement.tracer.fail(  # type: ignore[attr-defined]
                f"{what} would change the partition axis of tile {self.name}; engines read a tile partition by "  # type: ignore[attr-defined]
                "partition, so move data across partitions with nl.transpose or a DMA")

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.view.dtype.itemsize  # type: ignore[attr-defined]

    def assert_shape(self, shape: tuple[int, ...] | list[int]) -> Any:
        """This tensor, after checking that its shape is ``shape``."""
        if tuple(self.view.shape) != tuple(shape):  # type: ignore[attr-defined]
            raise self._placement.tracer.fail(f"{self.name} has shape {list(self.view.shape)}, expected {list(shape)}")  # type: ignore[attr-defined]
        return self

    def astype(self, dtype: Any) -> Any:
        """A copy converted to ``dtype`` (``nl.copy(x, dtype=dtype)``)."""
        return operators.language().copy(self, dtype=dtype)

    def expand_dims(self, axis: int) -> Any:
        """A view with a new size-1 axis at ``axis`` (``nl.expand_dims``)."""
        return operators.language().expand_dims(self, axis)

    def is_contiguous(self) -> bool:
        """Whether the view covers its elements in row-major order with no gaps."""
        run = 1
        for stride, count in reversed(self.view.dims):  # type: ignore[attr-defined]
            if count != 1 and stride != run:
                return False
            run *= count
        return True

    def get_pattern(self) -> list[list[int]]:
        """The view's access pattern as ``[[stride, count], ...]`` (see ``ap``)."""
        return [list(d) for d in self.view.dims]  # type: ignore[attr-defined]

    def is_indirect(self) -> bool:
        """Whether an index tile chooses this access's rows (``x[idx_tile, :]``, ``x.ap(vector_offset=...)``)."""
        return self.indirect is not None  # type: ignore[attr-defined]

    def permute(self, dims: tuple[int, ...] | list[int]) -> Any:
        """The same elements with axes in the order ``dims``."""
        n = len(self.view.dims)  # type: ignore[attr-defined]
        order = [self._dim(d, "permute") for d in dims]
        if sorted(order) != list(range(n)):
            raise self._placement.tracer.fail(f"permute({list(dims)}) is not a permutation of {n} axes")  # type: ignore[attr-defined]
        if order[0] != 0:
            self._keep_partitions(0, f"permute({list(dims)})")
        return self._derive([self.view.dims[d] for d in order], [self.bases[d] for d in order])  # type: ignore[attr-defined]

    def broadcast(self, dim: int, size: int) -> Any:
        """A size-1 axis ``dim`` repeated ``size`` times (stride 0)."""
        d = self._dim(dim, "broadcast")
        stride, count = self.view.dims[d]  # type: ignore[attr-defined]
        if count != 1:
            raise self._placement.tracer.fail(f"broadcast: dim {dim} has size {count}, not 1")  # type: ignore[attr-defined]
        self._keep_partitions(d, "broadcast")
        dims = list(self.view.dims)  # type: ignore[attr-defined]
        dims[d] = (0, int(size))
        return self._derive(dims, list(self.bases))  # type: ignore[attr-defined]

    def expand_dim(self, dim: int) -> Any:
        """A new axis of size 1 at position ``dim``."""
        n = len(self.view.dims)  # type: ignore[attr-defined]
        d = dim % (n + 1)
        self._keep_partitions(d, "expand_dim")
        dims, bases = list(self.view.dims), list(self.bases)  # type: ignore[attr-defined]
        dims.insert(d, (1, 1))
        bases.insert(d, None)
        return self._derive(dims, bases)

    def squeeze_dim(self, dim: int) -> Any:
        """Axis ``dim`` (of size 1) removed."""
        d = self._dim(dim, "squeeze_dim")
        if self.view.dims[d][1] != 1:  # type: ignore[attr-defined]
            raise self._placement.tracer.fail(f"squeeze_dim: dim {dim} has size {self.view.dims[d][1]}, not 1")  # type: ignore[attr-defined]
        self._keep_partitions(d, "squeeze_dim")
        dims, bases = list(self.view.dims), list(self.bases)  # type: ignore[attr-defined]
        del dims[d], bases[d]
        return self._derive(dims, bases)

    def reshape_dim(self, dim: int, shape: tuple[int, ...] | list[int]) -> Any:
        """Axis ``dim`` split into axes of ``shape`` (one entry may be -1)."""
        d = self._dim(dim, "reshape_dim")
        stride, count = self.view.dims[d]  # type: ignore[attr-defined]
        sizes = [int(s) for s in shape]
        if sizes.count(-1) == 1:
            sizes[sizes.index(-1)] = count // math.prod(s for s in sizes if s != -1)
        if math.prod(sizes) != count:
            raise self._placement.tracer.fail(f"reshape_dim: {list(shape)} does not hold the {count} elements of dim {dim}")  # type: ignore[attr-defined]
        if d == 0 and self.view.tensor.on_chip and len(sizes) > 1:  # type: ignore[attr-defined]
            self._keep_partitions(0, "reshape_dim")
        split, acc = [], stride
        for s in reversed(sizes):
            split.append((acc, s))
            acc *= s
        dims, bases = list(self.view.dims), list(self.bases)  # type: ignore[attr-defined]
        dims[d:d + 1] = list(reversed(split))
        bases[d:d + 1] = [None] * len(sizes)
        return self._derive(dims, bases)

    def flatten_dims(self, start_dim: int, end_dim: int) -> Any:
        """Axes ``start_dim`` to ``end_dim`` (inclusive, contiguous) merged into one."""
        a, b = self._dim(start_dim, "flatten_dims"), self._dim(end_dim, "flatten_dims")
        if a == 0 and b > 0:
            self._keep_partitions(0, "flatten_dims")
        dims = list(self.view.dims)  # type: ignore[attr-defined]
        for (outer, _), (inner, count) in zip(dims[a:b], dims[a + 1:b + 1]):
            if outer != inner * count:
                raise self._placement.tracer.fail(f"flatten_dims({start_dim}, {end_dim}): the dims are not "
                                                  "contiguous; copy first")  # type: ignore[attr-defined]
        merged = (dims[b][0], math.prod(c for _, c in dims[a:b + 1]))
        bases = list(self.bases)  # type: ignore[attr-defined]
        return self._derive(dims[:a] + [merged] + dims[b + 1:], bases[:a] + [None] + bases[b + 1:])

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> Any:
        """Elements ``start:end:step`` of axis ``dim``."""
        d = self._dim(dim, "slice")
        index: list[Any] = [slice(None)] * len(self.view.dims)  # type: ignore[attr-defined]
        index[d] = slice(int(start), int(end), int(step))
        return self[tuple(index)]  # type: ignore[index]

    def select(self, dim: int, index: int) -> Any:
        """Element ``index`` of axis ``dim``, the axis removed (kept for a tile's partition axis)."""
        if not isinstance(index, int):
            raise self._placement.tracer.fail(  # type: ignore[attr-defined]
                "select with a tile or register index (indirect, data-dependent addressing) is not supported by "
                "trnsim yet: the address would depend on values the tracer does not know")
        d = self._dim(dim, "select")
        key: list[Any] = [slice(None)] * len(self.view.dims)  # type: ignore[attr-defined]
        key[d] = index
        return self[tuple(key)]  # type: ignore[index]

    def _unsupported(self, what: str, why: str) -> Any:
        raise self._placement.tracer.fail(f"NkiTensor.{what} is not supported by trnsim: {why}")  # type: ignore[attr-defined]

    def vector_select(self, dim: int, vector_offset: Any) -> Any:
        """Refused: per-partition offsets read from a tile are data-dependent addresses."""
        return self._unsupported("vector_select", "the addresses would depend on values the tracer does not know")

    def indirect(self, index: Any, num_elem: int | None = None) -> Any:
        """Refused: indirect addressing through a tile of indices."""
        return self._unsupported("indirect", "the addresses would depend on values the tracer does not know")

    def rearrange(self, src_pattern: tuple, dst_pattern: tuple, fixed_sizes: dict[str, int] | None = None) -> Any:
        """Refused: spell the view with permute, reshape_dim and flatten_dims."""
        return self._unsupported("rearrange", "spell it with permute, reshape_dim and flatten_dims")
