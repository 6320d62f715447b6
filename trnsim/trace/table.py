"""A small table of rows: what the trace analysis functions return.

trnsim does not need pandas, so its analysis tables are plain: a :class:`Table` is a
list of rows (dicts keyed by column name) with the column order kept. It prints as
aligned text, sorts, filters, writes CSV whole or not at all, and converts to a
``pandas.DataFrame`` where pandas is installed.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from trnsim.atomic import write_atomic
from trnsim.errors import TrnSimError

Row = dict[str, Any]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) >= 1e6 or abs(value) < 1e-3:
            return f"{value:.4g}"
        return f"{value:,.3f}"
    if value is None:
        return ""
    return str(value)


class Table:
    """Rows with named columns, in order.

    ``table[i]`` is row ``i`` (a dict), ``table["col"]`` the list of a column's values;
    ``len(table)`` counts rows and iterating gives the rows. ``str(table)`` is aligned
    text, one line per row under a header.
    """

    def __init__(self, columns: Iterable[str], rows: Iterable[Row] = ()) -> None:
        self.columns = list(columns)
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
        return Table(self.columns, sorted(self.rows, key=lambda r: r[column], reverse=descending))

    def where(self, test: Callable[[Row], bool] | None = None, **equal: Any) -> Table:
        """A copy holding the rows that pass ``test`` and whose columns equal ``equal``
        (``table.where(bound="memory")``)."""
        for column in equal:
            self._check(column)
        return Table(self.columns, [r for r in self.rows
                                    if all(r[c] == v for c, v in equal.items()) and (test is None or test(r))])

    def head(self, n: int = 10) -> Table:
        """A copy of the first ``n`` rows."""
        return Table(self.columns, self.rows[:n])

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
        cells = [[_cell(r[c]) for c in self.columns] for r in self.rows]
        widths = [max([len(c)] + [len(row[k]) for row in cells]) for k, c in enumerate(self.columns)]
        numeric = [all(isinstance(r[c], (int, float)) and not isinstance(r[c], bool)
                       for r in self.rows if r[c] is not None) for c in self.columns]

        def line(values: list[str]) -> str:
            return "  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric)).rstrip()

        return "\n".join([line(self.columns)] + [line(row) for row in cells])

    def __repr__(self) -> str:
        return f"Table({len(self.rows)} rows: {', '.join(self.columns)})"
