"""Turning an Arrow table into rows for DB-API executemany, column-wise (no per-cell calls)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lagless.sinks.base import COLUMNS


def arrow_rows(table: Any) -> Iterator[tuple[Any, ...]]:
    columns = []
    for name in COLUMNS:
        column = table.column(name)
        if name == "timestamp":
            column = column.cast("int64")
        columns.append(column.to_pylist())
    return zip(*columns, strict=True)
