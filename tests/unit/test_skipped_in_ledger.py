"""The records a batch skipped (deleted before they were read, --skip-lost-offsets) travel with
its ranges (Batch.skipped) into every store's ledger; here the parts that need no Spark: the
batch's JSON (Parquet manifests, Iceberg and Delta commit summaries), a table's part of a
routed batch, and the SQL ledger (a real SQLite file, through SqliteSink)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from lagless.sinks.base import Target
from lagless.sinks.ledger import Batch, skipped_listed
from lagless.sinks.sql import create_table, ledger_layout, record_ranges
from lagless.sinks.sqlite import SqliteSink

TARGET = Target("t", "append", "raw")
PARTITIONS = [("a", 0), ("a", 1), ("b", 0)]


@given(
    st.dictionaries(
        st.sampled_from(PARTITIONS),
        st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)),
    )
)
def test_the_skipped_records_of_covered_ranges_survive_the_batchs_json(ranges) -> None:
    batch = Batch(7, {tp: (s, s + n) for tp, (s, n, _) in ranges.items()})
    batch.skipped.update({tp: k for tp, (_, _, k) in ranges.items()})
    expected = {tp: k for tp, (_, n, k) in ranges.items() if n and k}
    assert skipped_listed(json.loads(batch.to_json())) == expected
    assert Batch.ranges_from_json(batch.to_json()) == batch.covered


def test_a_tables_part_keeps_the_skipped_records_of_its_partitions_only() -> None:
    batch = Batch(3, {("a", 0): (0, 5), ("b", 0): (2, 9)}, skipped={("a", 0): 4, ("b", 0): 2})
    part = batch.part({("b", 0): (2, 9)})
    assert (part.id, part.covered, part.skipped) == (3, {("b", 0): (2, 9)}, {("b", 0): 2})


def _ledger(path: Path, statements: list[str]) -> None:
    with sqlite3.connect(path) as conn:
        for statement in statements:
            conn.execute(statement)


def test_the_sql_ledger_sums_each_partitions_skipped_records_and_a_replay_adds_none(
    tmp_path: Path,
) -> None:
    path = tmp_path / "m.db"
    layout = ledger_layout(TARGET, "sqlite")
    first = Batch(0, {("a", 0): (0, 10), ("a", 1): (5, 8)}, skipped={("a", 1): 5})
    second = Batch(1, {("a", 0): (14, 20), ("a", 1): (8, 9)}, skipped={("a", 0): 4})
    statements = [create_table(layout), *record_ranges(layout, first)]
    statements += record_ranges(layout, second) + record_ranges(layout, second)  # a replay
    _ledger(path, statements)
    sink = SqliteSink(f"sqlite:///{path}", str(path))
    assert sink.skipped(TARGET, PARTITIONS) == {("a", 0): 4, ("a", 1): 5}
    assert sink.ledger(TARGET, PARTITIONS) == {("a", 0): 20, ("a", 1): 9}


def test_an_sql_ledger_an_earlier_lagless_made_skipped_nothing(tmp_path: Path) -> None:
    """A ledger without the column (made before it): nothing skipped, nothing refused."""
    path = tmp_path / "m.db"
    _ledger(
        path,
        [
            'CREATE TABLE "t_ledger" ("topic" TEXT NOT NULL, "partition" INTEGER NOT NULL, '
            '"start_offset" INTEGER NOT NULL, "end_offset" INTEGER, "log_time" INTEGER, '
            'PRIMARY KEY ("topic", "partition", "start_offset"))',
            "INSERT INTO \"t_ledger\" VALUES ('a', 0, 0, 10, NULL)",
        ],
    )
    sink = SqliteSink(f"sqlite:///{path}", str(path))
    assert sink.skipped(TARGET, PARTITIONS) == {}
    assert sink.ledger(TARGET, PARTITIONS) == {("a", 0): 10}
