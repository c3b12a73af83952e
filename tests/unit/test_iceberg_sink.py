"""The Iceberg sink without Spark: what check refuses (and that it writes nothing), namespaced
table names, the newer-wins plan of an upsert, and a commit that loses a race to another
import deciding again on the table that import left. Real pyiceberg, real SQLite catalog."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType

from lagless.exceptions import BadInput
from lagless.sinks import Target, sink_from_url
from lagless.sinks.base import TOMBSTONE
from lagless.sinks.iceberg import IcebergSink
from lagless.sinks.ledger import Batch
from lagless.sinks.newer_wins import plan
from lagless.sinks.upsert_order import LOG_TIME
from tests.unit.test_ledger_stores import PARTITIONS, TOPIC, commit, iceberg_rows


def typed(*fields: StructField, mode: str = "append") -> Target:
    return Target("deals", mode, "json", StructType(list(fields)))  # type: ignore[arg-type]


def test_check_writes_nothing_and_refuses_what_the_table_cannot_take(tmp_path: Path) -> None:
    sink = sink_from_url(f"iceberg:///{tmp_path}/lake")
    first = typed(StructField("id", LongType()))
    sink.check(first)
    assert not (tmp_path / "lake").exists()  # not even an empty catalog
    sink.prepare(first)

    sink.check(typed(StructField("id", LongType()), StructField("region", StringType())))
    with pytest.raises(BadInput) as changed:
        sink.check(typed(StructField("id", StringType())))
    assert "incompatible schema change" in str(changed.value)
    assert "\n" not in str(changed.value)
    with pytest.raises(BadInput, match="another layout"):
        sink.check(typed(StructField("id", LongType()), mode="upsert"))
    with pytest.raises(BadInput, match="another layout"):
        sink.check(typed(StructField("region", StringType())))  # would drop a column


def test_a_file_that_is_not_a_catalog_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "lake").mkdir()
    (tmp_path / "lake" / "catalog.db").write_text("not SQLite")
    with pytest.raises(BadInput, match="is not an Iceberg SQL catalog") as refused:
        sink_from_url(f"iceberg:///{tmp_path}/lake").check(typed(StructField("id", LongType())))
    assert "\n" not in str(refused.value)
    assert (tmp_path / "lake" / "catalog.db").read_text() == "not SQLite"


def test_a_field_the_schema_added_becomes_a_column(tmp_path: Path) -> None:
    sink = IcebergSink.from_url(f"iceberg:///{tmp_path}/lake")
    sink.prepare(typed(StructField("id", LongType())))
    sink.prepare(typed(StructField("id", LongType()), StructField("region", StringType())))
    catalog = sink._catalog(create=False)
    assert catalog is not None
    columns = [f.name for f in catalog.load_table("default.deals").schema().fields]
    assert columns[-2:] == ["id", "region"]
    sink.close()


def test_only_iceberg_takes_a_namespace_in_the_table_name(tmp_path: Path) -> None:
    iceberg = sink_from_url(f"iceberg:///{tmp_path}/lake")
    assert iceberg.table_name("sales.deals") == "sales.deals"
    assert iceberg.table_name("deals") == "deals"
    for bad in ("a.b.c", "sales.1x", ".deals", "sales."):
        with pytest.raises(BadInput):
            iceberg.table_name(bad)
    for other in (f"sqlite:///{tmp_path}/x.db", f"delta:///{tmp_path}/d", f"parquet:///{tmp_path}"):
        with pytest.raises(BadInput):
            sink_from_url(other).table_name("sales.deals")


def rows(*spec: tuple[bytes, int, int, int, int | None, bool]) -> pa.Table:
    """(key, partition, offset, timestamp, log time, tombstone) of topic t."""
    keys, partitions, offsets, stamps, log_times, dead = zip(*spec, strict=True)
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "topic": pa.array(["t"] * len(keys), pa.string()),
            "partition": pa.array(partitions, pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "timestamp": pa.array(stamps, pa.int64()),
            LOG_TIME: pa.array(log_times, pa.int64()),
            TOMBSTONE: pa.array(dead, pa.bool_()),
        }
    )


def test_the_upsert_plan_is_newer_wins_and_remembers_tombstones() -> None:
    """The rank (upsert_order.py): the log time, then topic, partition and offset."""
    held = rows(
        (b"same-partition", 0, 10, 500, 500, False),
        (b"older-elsewhere", 1, 99, 900, 900, False),
        (b"newer-elsewhere", 1, 5, 100, 100, False),
        (b"deleted", 0, 3, 50, 50, False),
        (b"legacy", 1, 3, 300, None, False),  # an earlier lagless's row: its timestamp ranks
    ).drop_columns([TOMBSTONE])
    graves = rows((b"buried", 0, 40, 400, 400, True)).drop_columns([TOMBSTONE])
    batch = rows(
        (b"same-partition", 0, 11, 1, 500, False),  # a later offset: its log time is as late
        (b"older-elsewhere", 0, 7, 800, 800, False),  # another partition: an older one loses
        (b"newer-elsewhere", 0, 7, 200, 200, False),  # a newer log time wins
        (b"deleted", 0, 4, 60, 60, True),  # a newer tombstone deletes
        (b"buried", 0, 39, 10, 390, False),  # older than its key's tombstone: dropped
        (b"legacy", 0, 8, 250, 320, False),
        (b"fresh", 1, 0, 5, 5, False),
    )

    planned = plan(batch, held, ("key",), graves)

    assert sorted(planned.replaced.column("key").to_pylist()) == [
        b"deleted",
        b"legacy",
        b"newer-elsewhere",
        b"same-partition",
    ]
    assert sorted(planned.added.column("key").to_pylist()) == [
        b"fresh",
        b"legacy",
        b"newer-elsewhere",
        b"same-partition",
    ]
    assert TOMBSTONE not in planned.added.column_names


@pytest.mark.parametrize("other_batch", ["other topic", "same offsets"])
def test_a_commit_that_loses_a_race_decides_again(
    other_batch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Import A loads the table, import B commits, A's commit is refused by the catalog: A
    reads the ledger again. B's batch of another topic: A's is still new, committed on top.
    B's batch of the same offsets: A's is a replay, and its files are dropped."""
    url = f"iceberg:///{tmp_path}/lake"
    a, b = IcebergSink.from_url(url), IcebergSink.from_url(url)
    target_a = Target("t", "append", "raw", run_id="import-a")
    target_b = Target("t", "append", "raw", run_id="import-b")
    a.prepare(target_a)
    mine = Batch(0, {(TOPIC, 0): (0, 10)})
    theirs = Batch(0, {("refunds", 0): (0, 4)}) if other_batch == "other topic" else mine
    loads = []
    loaded = IcebergSink._table

    def racing(self: IcebergSink, table: str):  # type: ignore[no-untyped-def]
        found = loaded(self, table)
        if self is a:
            loads.append(table)
            if len(loads) == 2:  # A's first commit attempt has its table: B commits now
                commit(b, target_b, theirs)
        return found

    monkeypatch.setattr(IcebergSink, "_table", racing)

    commit(a, target_a, mine)

    expected = [(TOPIC, 0, o) for o in range(10)]
    if other_batch == "other topic":
        expected += [("refunds", 0, o) for o in range(4)]
        assert len(loads) == 3  # the pre-check, the lost attempt, the one that won
    else:
        assert len(loads) == 3  # the pre-check, the lost attempt, the replay found
    assert iceberg_rows(str(tmp_path / "lake"), "t") == sorted(expected)
    assert a.ledger(target_a, [*PARTITIONS, ("refunds", 0)]) == {
        tp: end for tp, (_, end) in {**theirs.covered, **mine.covered}.items()
    }
    data = tmp_path / "lake" / "default" / "t" / "data"
    assert len(list(data.glob("*.parquet"))) == (2 if other_batch == "other topic" else 1)


def test_the_ledger_passes_over_other_writers_snapshots_and_follows_a_rollback(
    tmp_path: Path,
) -> None:
    """Another tool's commit (no lagless summary) changes nothing the ledger says; rolling the
    table back to an earlier snapshot makes the later batches count as not held, their rows
    being gone with them."""
    sink = IcebergSink.from_url(f"iceberg:///{tmp_path}/lake")
    target = Target("t", "append", "raw", run_id="import-a")
    sink.prepare(target)
    commit(sink, target, Batch(0, {(TOPIC, 0): (0, 10), (TOPIC, 1): (0, 4)}))
    catalog = sink._catalog(create=False)
    assert catalog is not None
    first = catalog.load_table("default.t").current_snapshot()
    assert first is not None
    commit(sink, target, Batch(1, {(TOPIC, 0): (10, 15)}))
    table = catalog.load_table("default.t")
    table.append(table.scan().to_arrow().slice(0, 0))  # another writer, no lagless summary
    assert sink.ledger(target, PARTITIONS) == {(TOPIC, 0): 15, (TOPIC, 1): 4}

    catalog.load_table("default.t").manage_snapshots().rollback_to_snapshot(
        first.snapshot_id
    ).commit()

    assert sink.ledger(target, PARTITIONS) == {(TOPIC, 0): 10, (TOPIC, 1): 4}
    assert iceberg_rows(str(tmp_path / "lake"), "t") == sorted(
        [(TOPIC, 0, o) for o in range(10)] + [(TOPIC, 1, o) for o in range(4)]
    )
    sink.close()


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    held=st.lists(st.integers(-50, 50), unique=True, max_size=40),
    batch=st.lists(st.integers(-60, 60), min_size=1, max_size=20),
    kind=st.sampled_from(["long", "string", "binary"]),
)
def test_the_held_rows_of_a_batch_are_those_of_its_keys_whatever_their_type(
    tmp_path: Path, held: list[int], batch: list[int], kind: str
) -> None:
    """An upsert reads the rows the table holds for the batch's keys: a scan of the keys'
    range (text and numbers), or of each key (other types), then the exact keys."""
    from pyiceberg.catalog.sql import SqlCatalog

    from lagless.sinks.iceberg import _held_rows
    from lagless.sinks.iceberg.row_delta import FILE, POS

    def column(keys: list[int]) -> pa.Array:
        if kind == "long":
            return pa.array(keys, pa.int64())
        texts = [f"k{k:+04d}" for k in keys]
        if kind == "string":
            return pa.array(texts, pa.string())
        return pa.array([t.encode() for t in texts], pa.binary())

    lake = tmp_path / f"lake-{uuid.uuid4().hex[:8]}"
    lake.mkdir()
    catalog = SqlCatalog("t", uri=f"sqlite:///{lake}/catalog.db", warehouse=f"file://{lake}")
    catalog.create_namespace("default")
    stored = pa.table({"id": column(held), "n": pa.array(held, pa.int64())})
    table = catalog.create_table("default.t", schema=stored.schema)
    for part in (stored.slice(0, len(held) // 2), stored.slice(len(held) // 2)):
        table.append(part)  # two files, their bounds apart or overlapping
    rows = pa.table({"id": column(batch)})

    def read(location: str, columns: list[str] | None) -> pa.Table:
        return pq.read_table(location.removeprefix("file://"), columns=columns)

    found = _held_rows(catalog.load_table("default.t"), rows, ("id",), ["id", "n"], read)

    assert sorted(found.column("n").to_pylist()) == sorted(set(held) & set(batch))
    # Each row's place names it in its file (a merge-on-read upsert deletes it there).
    for n, path, pos in zip(*(found.column(c).to_pylist() for c in ("n", FILE, POS)), strict=True):
        assert read(path, ["n"]).column("n")[pos].as_py() == n
    catalog.engine.dispose()


def test_a_transactions_metadata_is_built_once_per_state_and_follows_what_it_stages(
    tmp_path: Path,
) -> None:
    """row_delta.transaction: the metadata its reads see is one object until an update is
    staged or the table changes, and then shows the update (as pyiceberg's own would)."""
    from lagless.sinks.iceberg.row_delta import transaction

    sink = IcebergSink.from_url(f"iceberg:///{tmp_path}/lake")
    target = typed(StructField("id", LongType()))
    sink.prepare(target)
    table = sink._table(target.table)
    tx = transaction(table)
    first = tx.table_metadata
    assert tx.table_metadata is first
    tx.set_properties({"lagless.test": "staged"})
    staged = tx.table_metadata
    assert staged is not first
    assert staged.properties["lagless.test"] == "staged"
    assert "lagless.test" not in first.properties
    tx.commit_transaction()
    assert sink._table(target.table).properties["lagless.test"] == "staged"
    assert transaction(sink._table(target.table)).table_metadata.properties["lagless.test"] == (
        "staged"
    )


def offsets_chunk(sink: IcebergSink, table: str) -> tuple[int, int]:
    """The bytes of the offset column's dictionary page and of its whole chunk, in the one
    data file of `table` (one row group)."""
    (task,) = sink._table(table).scan().plan_files()
    metadata = pq.ParquetFile(task.file.file_path.removeprefix("file://")).metadata
    assert metadata.num_row_groups == 1
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    chunk = metadata.row_group(0).column(names.index("offset"))
    assert chunk.has_dictionary_page
    return chunk.data_page_offset - chunk.dictionary_page_offset, chunk.total_compressed_size


def test_a_column_of_distinct_values_gives_up_its_dictionary_early(tmp_path: Path) -> None:
    """Tables lagless makes cap a column's Parquet dictionary at DICTIONARY_BYTES (Iceberg's
    default: 2 MB): 60,000 distinct offsets give up theirs after the first 20,000 (pyarrow
    checks the cap every 20,000 rows, pyiceberg's page row limit) and are written plain and
    smaller than into a table of the default, whose dictionary takes all of them."""
    from lagless.sinks.iceberg import DICTIONARY_BYTES

    property_name = next(iter(DICTIONARY_BYTES))
    count = 60_000
    batch = rows(*[(b"k%d" % n, 0, n, n, n, False) for n in range(count)])
    sizes = {}
    for name in ("capped", "default"):
        sink = IcebergSink.from_url(f"iceberg:///{tmp_path}/{name}")
        target = Target("deals", "upsert", "raw")
        sink.prepare(target)
        assert sink._table(target.table).properties[property_name] == str(64 * 1024)
        if name == "default":
            with sink._table(target.table).transaction() as tx:
                tx.set_properties({property_name: str(2 * 1024 * 1024)})
        sink.upsert_rows(batch, target, Batch(0, {("t", 0): (0, count)}))
        sizes[name] = offsets_chunk(sink, target.table)

    (capped_dictionary, capped), (full_dictionary, full) = sizes["capped"], sizes["default"]
    assert capped_dictionary * 2 < full_dictionary
    assert capped < full
