"""The statistics a Delta commit carries for a file (sinks/delta footer_stats): JSON the log's
readers take, whatever the numbers in the file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lagless.sinks.delta import footer_stats


def test_a_column_with_an_infinite_bound_has_no_bounds(tmp_path: Path) -> None:
    """A DOUBLE field may hold infinity (Spark's from_json reads "-Infinity"): its bounds
    would be written as the token Infinity, which is not JSON, and delta-rs then refuses to
    read the table's log. Such a column keeps its null count; the others keep their bounds."""
    path = tmp_path / "part.parquet"
    table = pa.table(
        {
            "offset": pa.array([3, 9, 5], pa.int64()),
            "x": pa.array([1.5, -math.inf, None], pa.float64()),
            "y": pa.array([0.25, 2.0, math.nan], pa.float64()),
        }
    )
    pq.write_table(table, path)

    stats = footer_stats(pq.read_metadata(path))

    assert json.loads(json.dumps(stats, allow_nan=False)) == stats
    assert stats["minValues"] == {"offset": 3, "y": 0.25}
    assert stats["maxValues"] == {"offset": 9, "y": 2.0}
    assert stats["nullCount"] == {"offset": 0, "x": 1, "y": 0}
    assert stats["numRecords"] == 3


def test_numbers_of_another_logical_type_have_no_bounds(tmp_path: Path) -> None:
    """polars stores a decimal as an INT64 and a date as an INT32, whose footer bounds pyarrow
    gives as Decimal and date: JSON cannot hold them, and Delta writes them otherwise (a
    decimal's bound as a number of its scale, a date's as text). They keep their null counts."""
    import datetime
    import decimal

    import polars as pl

    path = tmp_path / "part.parquet"
    pl.DataFrame(
        {
            "id": [1, 7],
            "balance": [decimal.Decimal("1.25"), None],
            "day": [datetime.date(2026, 1, 2), datetime.date(2026, 3, 4)],
            "at": [datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC)] * 2,
        },
        schema_overrides={"balance": pl.Decimal(12, 2)},
    ).write_parquet(path)

    stats = footer_stats(pq.read_metadata(path))

    assert json.loads(json.dumps(stats)) == stats
    assert stats["minValues"] == {"id": 1} and stats["maxValues"] == {"id": 7}
    assert stats["nullCount"] == {"id": 0, "balance": 1, "day": 0, "at": 0}
