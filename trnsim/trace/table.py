"""A small table of rows: what the trace analysis functions return.

trnsim does not need pandas, so its analysis tables are plain: a :class:`Table` is a
list of rows (dicts keyed by column name) with the column order kept. It prints as
aligned text (each column in one format, its unit in the header), sorts, filters,
writes CSV whole or not at all, and converts to a ``pandas.DataFrame`` where pandas is
installed.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from trnsim.atomic import write_atomic
from trnsim.errors import TrnSimError

Row = dict[str, Any]


@dataclass(frozen=True)
class Unit:
    """How a numeric column prints: its values times the ``scale`` of the largest of
    ``steps`` (name, scale; smallest first) that still shows the column's largest value
    as 1 or more (else the smallest), with ``digits`` decimals, under a header naming
    that step."""

    steps: tuple[tuple[str, float], ...]
    digits: int

    def pick(self, largest: float) -> tuple[str, float]:
        for name, scale in reversed(self.steps):
            if largest * scale >= 1:
                return name, scale
        return self.steps[0]


NS_AS_US = Unit((("us", 1e-3),), 3)
FRACTION = Unit((("%", 100.0),), 1)
FLOPS = Unit((("MFLOP", 1e-6), ("GFLOP", 1e-9), ("TFLOP", 1e-12)), 3)
BYTES = Unit((("KiB", 2.0 ** -10), ("MiB", 2.0 ** -20), ("GiB", 2.0 ** -30)), 3)
FLOP_RATE = Unit((("GFLOP/s", 1e-9), ("TFLOP/s", 1e-12)), 3)
PER_BYTE = Unit((("FLOP/B", 1.0),), 2)
#: the units of the columns trnsim's tables share; a column ``X_ns`` prints as ``X us``
UNITS = {"share": FRACTION, "flops": FLOPS, "bytes": BYTES, "intensity": PER_BYTE, "flops_per_s": FLOP_RATE}


def unit_of(column: str) -> Unit | None:
    """The unit a column prints in by its name, or None (printed as it is)."""
    return NS_AS_US if column.endswith("_ns") else UNITS.get(column)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    return _number(v) and v == v and abs(v) != float("inf")


def _column(column: str, values: list[Any], unit: Unit | None) -> tuple[str, list[str]]:
    """A column's header and cells, in one format: a unit's (scaled, its digits), else
    integers with thousands separators, else numbers with three decimals; text as it is."""
    if any(v is not None and not _number(v) for v in values):
        return column, ["" if v is None else str(v) for v in values]
    numbers = [v for v in values if _finite(v)]
    header, scale, digits = column, 1.0, 3
    if unit is not None:
        name, scale = unit.pick(max((abs(v) for v in numbers), default=0.0))
        header, digits = f"{column.removesuffix('_ns')} {name}", unit.digits
    elif all(isinstance(v, int) for v in numbers):
        digits = 0

    def cell(v: Any) -> str:
        if v is None:
            return ""
        if not _finite(v):
            return str(float(v))
        return f"{(round(v * scale, digits) or 0.0):,.{digits}f}"   # -0.0 prints as 0

    return header, [cell(v) for v in values]


class Table:
    """Rows with named columns, in order.

    ``table[i]`` is row ``i`` (a dict), ``table["col"]`` the list of a column's values;
    ``len(table)`` counts rows and iterating gives the rows. ``str(table)`` is aligned
    text, one line per row under a header, each column in one format with its unit in
    the header: a column ``X_ns`` in us (``X us``), ``share`` in %, ``flops`` in MFLOP,
    GFLOP or TFLOP, ``bytes`` in KiB, MiB or GiB, ``intensity`` in FLOP/B, ``flops_per_s`` in
    GFLOP/s or TFLOP/s (by the column's largest value), ``units`` giving other columns
    theirs; other integer columns with thousands separators, other numbers with three
    decimals. The rows keep the values as they are (ns, fractions, FLOPs, bytes).
    """

    def __init__(self, columns: Iterable[str], rows: Iterable[Row] = (), *, units: dict[str, Unit] | None = None) -> None:
        self.columns = list(columns)
        self.units = dict(units or {})
        self.rows: list[Row] = []
        for row in rows:
            missing = [c for c in self.columns if c not in row]
            if missing:
                raise TrnSimError(f"table row {row!r:.80} lacks columns {missing}; give every row all of "
                                  f"{self.columns}")
            self.rows.append({c: row[c] for c in self.columns})

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def _check(self, column: str) -> None:
        if column not in self.columns:
            raise KeyError(f"table has no column {column!r}; its columns: {', '.join(self.columns)}")

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, str):
            self._check(key)
            return [r[key] for r in self.rows]
        return self.rows[key]

    def sort(self, column: str, *, descending: bool = True) -> Table:
        """A copy sorted by ``column`` (largest first unless ``descending=False``)."""
        self._check(column)
        return Table(self.columns, sorted(self.rows, key=lambda r: r[column], reverse=descending), units=self.units)

    def where(self, test: Callable[[Row], bool] | None = None, **equal: Any) -> Table:
        """A copy holding the rows that pass ``test`` and whose columns equal ``equal``
        (``table.where(bound="memory")``)."""
        for column in equal:
            self._check(column)
        return Table(self.columns, [r for r in self.rows
                                    if all(r[c] == v for c, v in equal.items()) and (test is None or test(r))],
                     units=self.units)

    def head(self, n: int = 10) -> Table:
        """A copy of the first ``n`` rows."""
        return Table(self.columns, self.rows[:n], units=self.units)

    def to_pandas(self) -> Any:
        """The table as a ``pandas.DataFrame`` (pandas must be installed)."""
        try:
            import pandas
        except ImportError:
            raise TrnSimError("Table.to_pandas needs pandas, which is not installed; pip install pandas, or use "
                              "the table's rows (a list of dicts) directly") from None
        return pandas.DataFrame(self.rows, columns=self.columns)

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Write the table to ``path`` as CSV with a header line, whole or not at all."""
        def write(f: Any) -> None:
            out = csv.writer(f, lineterminator="\n")
            out.writerow(self.columns)
            for r in self.rows:
                out.writerow(["" if r[c] is None else r[c] for c in self.columns])

        return write_atomic(path, write)

    def __str__(self) -> str:
        columns = [_column(c, [r[c] for r in self.rows], self.units.get(c, unit_of(c))) for c in self.columns]
        widths = [max(len(h), *map(len, cells)) if cells else len(h) for h, cells in columns]
        numeric = [all(_number(r[c]) for r in self.rows if r[c] is not None) for c in self.columns]

        def line(values: list[str]) -> str:
            return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric)).rstrip()

        rows = [[cells[k] for _, cells in columns] for k in range(len(self.rows))]
        return "\n".join([line([h for h, _ in columns])] + [line(row) for row in rows])

    def __repr__(self) -> str:
        return f"Table({len(self.rows)} rows: {', '.join(self.columns)})"
