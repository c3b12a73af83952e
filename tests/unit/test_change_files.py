"""A mirror's change events decoded by the source's tasks and coalesced on the driver
(lagless/importer/change_files.py): the task's writer, `coalesce`'s rules (each record's log
time, UNAVAILABLE carried in the batch, each key's newest event, rejections), then the whole
path as a property on a real SQLite store: whatever batches the import cuts, whatever it
replays and whatever Debezium sends again, the table ends equal to the source."""

from __future__ import annotations

import decimal
import json
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

from lagless.cdc.connect_types import UNAVAILABLE
from lagless.cdc.envelope import KEY_MISSING, NOT_JSON
from lagless.exceptions import BadInput
from lagless.importer import change_files
from lagless.importer.routing import Destination
from lagless.importer.rows import NULL_KEY
from lagless.importer.spec import ImportSpec
from lagless.importer.write_path import Way, change_files_writer, decide
from lagless.kafka.config import KafkaConfig
from lagless.planner.ranges import OffsetRange
from lagless.sinks import sink_from_url
from lagless.sinks.base import TOMBSTONE, Target
from lagless.sinks.delta import DeltaSink
from lagless.sinks.ledger import Batch
from lagless.sinks.sqlite import SqliteSink
from lagless.sinks.upsert_order import LOG_TIME
from lagless.source.executor_write import TASK_WRITERS
from lagless.source.schema import ARROW_SCHEMA
from tests.unit.test_cdc_envelope import (
    FIELDS,
    PARTITIONS,
    ROW,
    ROW_FIELDS,
    TOPIC,
    debezium_events,
    event,
    histories,
    kafka_log,
    key,
)

TARGET = Target("t", "upsert", "debezium", FIELDS, ("id",))


def records(
    partition: int, start: int, values: list[tuple[bytes | None, bytes | None]], stamps=None
) -> pa.RecordBatch:
    """Records as the source's task reads them (source.schema.ARROW_SCHEMA)."""
    count = len(values)
    stamps = stamps or [start + i for i in range(count)]
    return pa.RecordBatch.from_pydict(
        {
            "key": [k for k, _ in values],
            "value": [v for _, v in values],
            "topic": [TOPIC] * count,
            "partition": [partition] * count,
            "offset": list(range(start, start + count)),
            "timestamp": [ms * 1000 for ms in stamps],
            "timestampType": [1] * count,
            "headers": [[] for _ in range(count)],
        },
        schema=ARROW_SCHEMA,
    )


def task_file(folder: Path, batches: list[pa.RecordBatch], target: Target = TARGET) -> str:
    config = change_files.task_config(str(folder), {TOPIC: target})
    writer = change_files.writer(json.loads(config))
    pieces = [OffsetRange(TOPIC, b.column("partition")[0].as_py(), 0, 1) for b in batches[:1]]
    path, left = writer.write(pieces or [OffsetRange(TOPIC, 0, 0, 0)], iter(batches))
    assert left is None
    return path


def coalesced(tmp_path: Path, batches, carried=None, target: Target = TARGET):
    changes = change_files.read_changes([task_file(tmp_path, batches, target)])
    return change_files.coalesce(changes, target, carried or {})


def test_each_key_ends_with_its_newest_event_and_a_delete_is_a_tombstone_row(tmp_path):
    done = coalesced(
        tmp_path,
        [
            records(
                0,
                0,
                [
                    (key(1), event("c", {**ROW, "id": 1}, lsn=1)),
                    (key(2), event("c", {**ROW, "id": 2}, lsn=2)),
                    (key(1), event("u", {**ROW, "id": 1, "n": 9}, lsn=3)),
                    (key(2), event("d", None, before={"id": 2}, lsn=4)),
                    (key(2), None),
                ],
            )
        ],
    )
    rows = {r["id"]: r for r in done.rows.to_pylist()}
    assert rows[1]["n"] == 9 and rows[1]["offset"] == 2 and not rows[1][TOMBSTONE]
    assert rows[2][TOMBSTONE] and rows[2]["offset"] == 4  # the tombstone after the delete
    assert rows[1]["price"] == decimal.Decimal("1.50")
    assert done.rows.column_names == list(TARGET.row_columns)
    assert done.newest == {(TOPIC, 0): 4}


def test_log_time_is_each_partitions_running_maximum_from_where_it_stood(tmp_path):
    """Timestamps that go back: the later offset still wins its partition, and a partition's
    log time starts from the one carried from the batch before."""
    done = coalesced(
        tmp_path,
        [
            records(
                0,
                10,
                [
                    (key(1), event("c", {**ROW, "id": 1, "n": 1}, lsn=1)),
                    (key(1), event("u", {**ROW, "id": 1, "n": 2}, lsn=2)),
                ],
                stamps=[500, 100],
            )
        ],
        carried={(TOPIC, 0): 300},
    )
    (row,) = done.rows.to_pylist()
    assert row["n"] == 2 and row[LOG_TIME] == 500 and row["timestamp"] == 100
    assert done.newest == {(TOPIC, 0): 500}


def test_across_partitions_the_later_log_time_wins(tmp_path):
    older = records(0, 0, [(key(1), event("c", {**ROW, "id": 1, "n": 1}, lsn=1))], [900])
    newer = records(1, 0, [(key(1), event("u", {**ROW, "id": 1, "n": 2}, lsn=2))], [200])
    done = coalesced(tmp_path, [older, newer], carried={(TOPIC, 1): 1000})
    (row,) = done.rows.to_pylist()
    assert (row["partition"], row["n"], row[LOG_TIME]) == (1, 2, 1000)


def test_an_unavailable_value_takes_the_keys_earlier_value_of_the_batch(tmp_path):
    toasted = {**ROW, "id": 1, "name": UNAVAILABLE, "n": 5}
    done = coalesced(
        tmp_path,
        [
            records(
                0,
                0,
                [
                    (key(1), event("c", {**ROW, "id": 1, "name": "long"}, lsn=1)),
                    (key(1), event("u", toasted, lsn=2)),
                    (key(2), event("u", {**toasted, "id": 2}, lsn=3)),
                ],
            )
        ],
    )
    rows = {r["id"]: r for r in done.rows.to_pylist()}
    assert (rows[1]["name"], rows[1]["n"]) == ("long", 5)
    assert rows[2]["name"] == UNAVAILABLE  # no earlier value here: the store keeps its own


def test_rejected_events_become_dead_letters_with_the_event_as_read(tmp_path):
    done = coalesced(
        tmp_path,
        [
            records(
                0,
                0,
                [
                    (key(1), b"not json"),
                    (None, event("d", None, lsn=2)),  # no key, none in `before`
                    (key(2), event("c", {**ROW, "id": 2}, lsn=3)),
                ],
            )
        ],
    )
    assert [r["id"] for r in done.rows.to_pylist()] == [2]
    letters = done.rejected.to_pylist()
    assert [(r["offset"], r["error"], r["value"]) for r in letters] == [
        (0, NOT_JSON, b"not json"),
        (1, KEY_MISSING, event("d", None, lsn=2)),
    ]


RAW_TARGET = Target("t", "upsert", "raw")


def test_a_raw_upsert_keeps_each_keys_newest_record_a_null_value_deletes_a_null_key_is_rejected(
    tmp_path,
):
    done = coalesced(
        tmp_path,
        [
            records(0, 0, [(b"a", b"1"), (b"b", b"2"), (None, b"lost"), (b"a", b"3")]),
            records(1, 0, [(b"b", None), (b"c", b"4")], stamps=[9, 9]),
        ],
        target=RAW_TARGET,
    )

    rows = {r["key"]: r for r in done.rows.to_pylist()}
    assert rows[b"a"]["value"] == b"3" and not rows[b"a"][TOMBSTONE]
    assert rows[b"b"][TOMBSTONE] and rows[b"b"]["partition"] == 1  # the later log time wins
    assert rows[b"c"]["value"] == b"4" and rows[b"c"][LOG_TIME] == 9
    assert done.rows.column_names == list(RAW_TARGET.row_columns)
    letters = done.rejected.to_pylist()
    assert [(r["offset"], r["error"], r["value"]) for r in letters] == [(2, NULL_KEY, b"lost")]


TOPICS = ("orders.b", "orders.a", "orders.c")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(TOPICS),
            st.integers(0, 2),
            st.sampled_from([b"a", b"b", b"c"]),
            st.integers(0, 50),  # timestamps go back as often as forward
        ),
        min_size=1,
        max_size=40,
    ),
    st.dictionaries(st.tuples(st.sampled_from(TOPICS), st.integers(0, 2)), st.integers(0, 50)),
)
def test_across_topics_each_key_takes_the_record_of_the_highest_rank(
    tmp_path_factory, sent, carried
):
    """Several topics routed into one table: each key's row is its record of the highest
    (log time, topic, partition, offset), the log time each partition's running maximum from
    where it stood, ties between topics going by name."""
    folder = tmp_path_factory.mktemp("changes")
    offsets: dict[tuple[str, int], int] = {}
    placed = []  # (topic, partition, offset, key, timestamp)
    for topic, partition, key_, stamp in sent:
        offset = offsets.get((topic, partition), 0)
        offsets[(topic, partition)] = offset + 1
        placed.append((topic, partition, offset, key_, stamp))
    config = json.loads(change_files.task_config(str(folder), dict.fromkeys(TOPICS, RAW_TARGET)))
    files = []
    for topic, partition in sorted(offsets):
        mine = [r for r in placed if r[:2] == (topic, partition)]
        batch = records(partition, 0, [(r[3], b"v%d" % r[2]) for r in mine], [r[4] for r in mine])
        batch = batch.set_column(2, "topic", pa.array([topic] * len(mine), pa.string()))
        pieces = [OffsetRange(topic, partition, 0, len(mine))]
        path, _ = change_files.writer(config).write(pieces, iter([batch]))
        files.append(path)

    # The tasks' files in any order: here the topics' last by name first.
    changes = pa.concat_tables(change_files.read_changes([path]) for path in reversed(files))
    done = change_files.coalesce(changes, RAW_TARGET, carried)

    expected, newest = {}, {}
    for topic, partition in offsets:
        log_time = carried.get((topic, partition), 0)
        for _, _, offset, key_, stamp in (r for r in placed if r[:2] == (topic, partition)):
            log_time = max(log_time, stamp)
            rank = (log_time, topic, partition, offset)
            expected[key_] = max(expected.get(key_, rank), rank)
        newest[(topic, partition)] = max(r[4] for r in placed if r[:2] == (topic, partition))
    got = {
        r["key"]: (r[LOG_TIME], r["topic"], r["partition"], r["offset"])
        for r in done.rows.to_pylist()
    }
    assert got == expected
    assert done.newest == newest


def test_a_truncate_keeps_only_the_rows_of_the_events_after_it(tmp_path):
    """In its partition by offset; in another by log time (a row of the same millisecond is
    kept); the rows before it are left out, and the batch says the table is emptied."""
    truncate = event("t", None, lsn=3)
    mine = records(
        0,
        0,
        [
            (key(1), event("c", {**ROW, "id": 1}, lsn=1)),
            (None, truncate),
            (key(2), event("c", {**ROW, "id": 2}, lsn=4)),
        ],
        [100, 200, 200],
    )
    other = records(
        1,
        0,
        [
            (key(3), event("c", {**ROW, "id": 3}, lsn=2)),
            (key(4), event("c", {**ROW, "id": 4}, lsn=5)),
        ],
        [150, 200],
    )
    done = coalesced(tmp_path, [mine, other])
    assert done.truncated and done.rejected.num_rows == 0
    assert sorted(r["id"] for r in done.rows.to_pylist()) == [2, 4]
    assert not coalesced(tmp_path / "none", [other]).truncated


def test_a_column_added_upstream_is_decoded_and_noted_for_the_driver(tmp_path):
    grown = [*ROW_FIELDS, {"type": "string", "optional": True, "field": "note"}]
    added = event("c", {**ROW, "id": 2, "note": "x"}, lsn=2, row_fields=grown)
    before = (key(1), event("c", {**ROW, "id": 1}, lsn=1))
    changes = change_files.read_changes(
        [task_file(tmp_path, [records(0, 0, [before, (key(2), added)])])]
    )
    (schema,) = change_files.new_schemas(changes)
    fields = change_files.grown_fields(FIELDS, [schema], "t")
    assert fields.fieldNames()[-1] == "note"
    done = change_files.coalesce(changes, Target("t", "upsert", "debezium", fields, ("id",)), {})
    assert {r["id"]: r["note"] for r in done.rows.to_pylist()} == {1: None, 2: "x"}


def test_a_column_whose_type_changed_is_refused_before_anything_commits(tmp_path):
    changed = [ROW_FIELDS[0], {"type": "int32", "optional": True, "field": "name"}]
    value = event("c", {"id": 1, "name": 5}, lsn=1, row_fields=changed)
    changes = change_files.read_changes([task_file(tmp_path, [records(0, 0, [(key(1), value)])])])
    with pytest.raises(BadInput, match="column 'name' is string in the table, the change events"):
        change_files.grown_fields(FIELDS, change_files.new_schemas(changes), "t")


def test_a_task_without_records_writes_an_empty_file(tmp_path):
    changes = change_files.read_changes([task_file(tmp_path, [])])
    assert changes.num_rows == 0
    done = change_files.coalesce(changes, TARGET, {})
    assert done.rows.num_rows == 0 and done.rows.column_names == list(TARGET.row_columns)


# --- which imports take this path (write_path.decide) ---


@pytest.mark.parametrize(
    ("over", "target_over", "taken"),
    [
        ({}, {}, True),
        ({"shared_disk": True, "master": "spark://host:7077"}, {}, True),
        ({"master": "spark://host:7077"}, {}, False),  # executors without the checkpoint
        ({"max_record_bytes": 1000}, {}, False),  # rejections by size: Spark's rows
        ({}, {"deletes": "soft"}, False),
        ({}, {"mode": "append"}, False),  # the change log
        ({}, {"value_format": "json"}, False),
        ({}, {"value_format": "raw", "fields": None, "key_fields": ()}, True),
        ({}, {"value_format": "raw", "fields": None, "mode": "append"}, False),
        ({}, {"value_format": "json", "fields": None, "key_fields": ()}, False),
    ],
)
def test_a_mirror_upserting_with_hard_deletes_is_decoded_by_the_tasks(
    tmp_path, over, target_over, taken
):
    spec = ImportSpec(
        kafka=KafkaConfig("127.0.0.1:1"),
        topics=(TOPIC,),
        sink_url=f"sqlite:///{tmp_path}/m.db",
        checkpoint=str(tmp_path / "ckpt"),
        write="upsert",
        value_format="debezium",
        **over,
    )
    destination = Destination(replace(TARGET, **target_over), (TOPIC,), [], "t")
    sink = sink_from_url(spec.sink_url)
    path = decide(spec.write_options, sink, [destination])
    assert (path.way is Way.CHANGE_FILES) == taken
    assert change_files_writer(spec.write_options, sink, [destination]) == (
        path.writer if taken else None
    )
    if taken:
        writer = path.writer
        assert writer is not None and writer.name in TASK_WRITERS  # the source loads it
        config = json.loads(writer.config)
        assert config["folder"] == str(tmp_path / "ckpt" / "changes")
        assert config["tables"][TOPIC]["key_fields"] == list(destination.target.key_fields)


def test_nested_columns_go_through_spark_into_sql_stores_only(tmp_path):
    """SQLite and PostgreSQL take nested values as JSON text, which Spark makes."""
    nested = T.StructType([*FIELDS.fields, T.StructField("tags", T.ArrayType(T.StringType()))])
    target = replace(TARGET, fields=nested)
    assert not SqliteSink(f"sqlite:///{tmp_path}/m.db", str(tmp_path / "m.db")).takes_upsert_rows(
        target
    )
    assert DeltaSink(f"delta:///{tmp_path}/lake", str(tmp_path / "lake")).takes_upsert_rows(target)


# --- the property: the real path into a real SQLite store gives the source's table ---


def write(sink: SqliteSink, folder: Path, batch_id: int, ranges, log, log_times) -> None:
    """One batch as the import runs it: a task per partition writes its change file, the
    driver coalesces them and the store upserts the rows with the batch's ranges."""
    files = []
    for partition, (start, end) in ranges.items():
        if end > start:
            batch = records(partition, start, log[partition][start:end])
            files.append(task_file(folder / f"b{batch_id}", [batch]))
    changes = change_files.read_changes(files)
    done = change_files.coalesce(changes, TARGET, log_times)
    batch = Batch(batch_id, {(TOPIC, p): r for p, r in ranges.items()})
    batch.log_times.update({tp: max(ms, log_times.get(tp, ms)) for tp, ms in done.newest.items()})
    assert done.rejected.num_rows == 0
    sink.upsert_rows(done.rows, TARGET, batch)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=histories(),
    restarts=st.lists(st.integers(0, 60), max_size=2),
    cuts=st.lists(st.integers(1, 6), min_size=1, max_size=8),
    replays=st.lists(st.integers(0, 20), max_size=4),
)
def test_any_batches_replays_and_debezium_restarts_give_the_source_table(
    tmp_path_factory, history, restarts, cuts, replays
):
    events, source = debezium_events(history)
    log = kafka_log(events, restarts)
    folder: Path = tmp_path_factory.mktemp("mirror")
    sink = SqliteSink(f"sqlite:///{folder / 'm.db'}", str(folder / "m.db"))
    sink.prepare(TARGET)
    positions = dict.fromkeys(range(PARTITIONS), 0)
    batches: list[dict[int, tuple[int, int]]] = []
    step = 0
    while any(positions[p] < len(log[p]) for p in positions):
        size = cuts[step % len(cuts)]
        ranges = {}
        for p in positions:
            end = min(len(log[p]), positions[p] + size)
            ranges[p] = (positions[p], end)
            positions[p] = end
        batches.append(ranges)
        step += 1
    # A batch's log times start where the batches before it in the log ended (a replay's
    # are those it had: its ranges are read from the same offsets).
    starts: list[dict[Any, int]] = []
    for ranges in batches:
        starts.append({(TOPIC, p): start - 1 for p, (start, _) in ranges.items() if start})
    order = list(range(len(batches)))
    for replay in replays:
        if batches:
            at = min(replay, len(order))
            order.insert(at, order[min(replay, len(order) - 1)] if at else 0)
    for index in [*order, *range(len(batches))]:
        write(sink, folder, index, batches[index], log, starts[index])
    with sqlite3.connect(folder / "m.db") as conn:
        mirrored = {
            row[0]: {"id": row[0], "name": row[1], "n": row[2], "price": decimal.Decimal(row[3])}
            for row in conn.execute("SELECT id, name, n, price FROM t")
        }
    assert mirrored == source
