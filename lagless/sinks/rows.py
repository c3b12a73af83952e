"""Turning an Arrow table into rows for DB-API executemany, column-wise (no per-cell calls)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa


def arrow_rows(table: pa.Table, names: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    return zip(*(table.column(name).to_pylist() for name in names), strict=True)
