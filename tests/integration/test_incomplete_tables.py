"""A table that lacks records for good says so (issue 56: "a mirror is complete or says it is
not"): records the broker deleted before they were read, skipped under --skip-lost-offsets,
are counted in the table's ledger with the batch that went past them, in every store, and
`lagless lag --sink` calls the table incomplete from then on, in one line.

Real parts: the embedded broker over TCP (its DeleteRecords stands for retention), real Spark
(the session shared, in process), each store on disk, and `lagless lag` as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Producer

from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.importer.table_lag import table_lag
from tests.harness.mirror_workload import mirror_rows
from tests.unit.test_cdc_envelope import ROW, event, key, partition_of

pytestmark = pytest.mark.spark

TOPIC = "db.public.t"


def produce_changes(kafka, ids: range) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for id_ in ids:
        value = event("c", {**ROW, "id": id_, "name": f"n{id_}"}, lsn=id_, table="t")
        producer.produce(TOPIC, key=key(id_), value=value, partition=partition_of(id_))
    producer.flush(30)


def lag_of(kafka, sink: str, table: str) -> tuple[dict, str]:
    """`lagless lag --sink` as a user runs it: its JSON, and its text."""
    args = [sys.executable, "-m", "lagless", "lag", "--bootstrap", kafka.bootstrap]
    args += ["--sink", sink, "--topic", TOPIC, "--table", table]
    shown = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    text = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    return json.loads(shown.stdout), text.stdout


@pytest.mark.parametrize("store", ["sqlite", "postgresql", "delta", "iceberg"])
def test_a_mirror_that_skipped_deleted_events_is_incomplete_until_made_anew(
    broker, kafka, tmp_path: Path, spark, store: str, request
) -> None:
    """The first events of partition 0 deleted before any run read them, accepted with
    --skip-lost-offsets: 2 skipped. Then, under the checkpoint, events of partition 1 past
    what the table holds deleted: 2 more skipped, in that partition. The ledger keeps both
    counts; a mirror made anew of what the log still holds is complete."""
    broker.create_topic(TOPIC, 2)
    produce_changes(kafka, range(1, 9))  # ids 2, 4, 6, 8 in partition 0; odd ones in 1
    broker.delete_records(TOPIC, 0, 2)
    sink = f"{store}:///{tmp_path}/m" + (".db" if store == "sqlite" else "")
    if store == "postgresql":
        sink = request.getfixturevalue("postgres").url
    spec = ImportSpec(
        kafka=kafka,
        topics=(TOPIC,),
        sink_url=sink,
        checkpoint=str(tmp_path / "ckpt"),
        table="mirrored",
        write="upsert",
        value_format="debezium",
        fail_on_data_loss=False,
    )
    run_import(spec, spark=spark)
    assert {int(row[0]) for row in mirror_rows(sink, "mirrored", ["id"])} == {1, 3, 5, 6, 7, 8}
    rows = {row.partition: row for row in table_lag(kafka, sink, "mirrored", [TOPIC])}
    assert (rows[0].skipped, rows[1].skipped) == (2, 0)

    produce_changes(kafka, range(9, 17))  # offsets 4..7 of each partition
    broker.delete_records(TOPIC, 1, 6)  # ids 9 and 11 of partition 1, never read
    run_import(spec, spark=spark)
    held = {int(row[0]) for row in mirror_rows(sink, "mirrored", ["id"])}
    assert held == {1, 3, 5, 6, 7, 8, 10, 12, 13, 14, 15, 16}

    shown, text = lag_of(kafka, sink, "mirrored")
    by_partition = {row["partition"]: row for row in shown["partitions"]}
    assert [(by_partition[p]["skipped"], by_partition[p]["incomplete"]) for p in (0, 1)] == [
        (2, True),
        (2, True),
    ]
    line = next(line for line in text.splitlines() if "incomplete" in line)
    assert line.startswith(
        f"table mirrored is incomplete: 4 records of {TOPIC}[0], {TOPIC}[1] were deleted by the "
        "broker before they were read and skipped (--skip-lost-offsets)"
    ), text

    # Events past what the table holds deleted before any import read them: lacking too.
    produce_changes(kafka, range(18, 22, 2))  # offsets 8 and 9 of partition 0
    broker.delete_records(TOPIC, 0, 10)
    shown, text = lag_of(kafka, sink, "mirrored")
    (row,) = [row for row in shown["partitions"] if row["partition"] == 0]
    assert (row["deleted_unread"], row["behind"], row["incomplete"]) == (2, 0, True)
    assert f"2 records of {TOPIC}[0] it lacks are no longer in the log" in text

    # Made anew (a new --table and --checkpoint) of what the log holds: complete, said so by
    # saying nothing.
    anew = replace(spec, table="mirrored_v2", checkpoint=str(tmp_path / "ckpt-v2"))
    snapshot_at_ms = int(time.time() * 1000)
    produce_changes(kafka, range(1, 17))  # the re-snapshot's events (op r in life)
    run_import(
        replace(anew, fail_on_data_loss=True, starting_timestamp=snapshot_at_ms), spark=spark
    )
    shown, text = lag_of(kafka, sink, "mirrored_v2")
    assert not any(row["incomplete"] for row in shown["partitions"]), shown
    assert "incomplete" not in text


@pytest.mark.parametrize("store", ["parquet", "delta"])
def test_an_import_that_skipped_records_under_its_checkpoint_is_incomplete(
    broker, kafka, tmp_path: Path, spark, store: str
) -> None:
    """A plain import: records deleted before its first run are the log's start, not a gap
    (complete); records deleted past what the table holds, skipped under the checkpoint,
    are counted, and the count survives the store's maintenance."""
    broker.create_topic(TOPIC, 1)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(10):
        producer.produce(TOPIC, value=f"r{i}".encode(), partition=0)
    producer.flush(30)
    broker.delete_records(TOPIC, 0, 3)
    sink = f"{store}:///{tmp_path}/t"
    spec = ImportSpec(
        kafka=kafka,
        topics=(TOPIC,),
        sink_url=sink,
        checkpoint=str(tmp_path / "ckpt"),
        table="t",
        fail_on_data_loss=False,
    )
    run_import(spec, spark=spark)
    assert [row.incomplete for row in table_lag(kafka, sink, "t", [TOPIC])] == [False]

    for i in range(10, 20):
        producer.produce(TOPIC, value=f"r{i}".encode(), partition=0)
    producer.flush(30)
    broker.delete_records(TOPIC, 0, 14)  # 10..13 never read
    summary = run_import(spec, spark=spark)
    assert summary.skipped == 4
    (row,) = table_lag(kafka, sink, "t", [TOPIC])
    assert (row.skipped, row.incomplete, row.held) == (4, True, 20)

    # The two batches' files merged, the history kept (--keep-history): the count stays.
    maintain = [sys.executable, "-m", "lagless", "maintain", "--sink", sink, "--table", "t"]
    done = subprocess.run([*maintain, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)[0]["compacted_files"] >= 2, done.stdout
    (row,) = table_lag(kafka, sink, "t", [TOPIC])
    assert (row.skipped, row.incomplete, row.held) == (4, True, 20)
