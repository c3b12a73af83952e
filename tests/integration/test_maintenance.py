"""Table maintenance (issue 32): compaction and expiry between an import's batches and by
`lagless maintain`, on real Delta, Iceberg and Parquet tables, local and on the suite's S3
server. Every expectation comes from the topic, read back with a plain consumer; the tables are
read by their own readers (polars, deltalake, pyiceberg, pyarrow), while the import writes and
compacts them.

Kill -9 inside compaction and expiry (failpoints `mid-compaction`, `mid-expiry`), then a rerun,
runs with the matrix (scripts/test); CI keeps one case per store (~2 min).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from lagless.gen import explicit, produce_profile
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.sinks import maintenance_of, sink_from_url
from lagless.sinks.maintenance import MOST_SMALL_FILES, Health, Policy
from tests.integration.test_crash_safety import (
    Record,
    cli_args,
    read_topic,
    rerun,
    run_import_process,
    sink_url,
    stored,
)
from tests.integration.test_delta import newest_per_key

pytestmark = pytest.mark.spark

PARTITIONS = 2
COLUMNS = ("partition", "offset", "key", "value", "timestamp")
# Small batches: each adds files and a version, so compaction and expiry have work in seconds.
BATCH_RECORDS = 50
POLICY = Policy(target_file_size=1024 * 1024, keep_history_s=1.0)
MAINTAIN_EVERY_S = 0.5
# A continuous import's records: CHUNKS produced a moment apart, CHUNK per partition each.
CHUNKS, CHUNK = 12, 25
TOTAL = CHUNKS * CHUNK * PARTITIONS
WAIT_S = 150.0


def rows_of(records: list[Record]) -> list[tuple[Any, ...]]:
    return sorted((r.partition, r.offset, r.key, r.value, r.timestamp) for r in records)


def spec_for(kafka: KafkaConfig, topic: str, url: str, folder: Path, **over: Any) -> ImportSpec:
    values: dict[str, Any] = {
        "kafka": kafka,
        "topics": (topic,),
        "sink_url": url,
        "checkpoint": str(folder / "ckpt"),
        "max_records_per_batch": BATCH_RECORDS,
        "target_file_size": POLICY.target_file_size,
        "keep_history_s": POLICY.keep_history_s,
        "maintain_every_s": MAINTAIN_EVERY_S,
    }
    values.update(over)
    return ImportSpec(**values)


def health(url: str, table: str) -> Health:
    with sink_from_url(url) as sink:
        maintenance = maintenance_of(sink)
        assert maintenance is not None
        found = maintenance.health(table, POLICY)
    assert found is not None
    return found


class Reader(threading.Thread):
    """Reads the table again and again while the import writes and compacts it: every read
    must hold each partition's offsets once, from the first on, without a gap (batches become
    visible whole, in order; compaction moves rows, never adds or drops one)."""

    def __init__(self, url: str, table: str, first: dict[int, int]) -> None:
        super().__init__(name="table-reader", daemon=True)
        self.url, self.table, self.first = url, table, first
        self.stop = threading.Event()
        self.reads = 0
        self.wrong: list[str] = []
        # Reads that failed: a file removed between a reader's listing and its read. With the
        # one-second history of these tests a slow read outlives the window; it never returns
        # wrong rows.
        self.failed: list[str] = []

    def run(self) -> None:
        # Not before the import made the table: a pyiceberg reader opening the catalog would
        # make its tables, racing the import's own making of them.
        while not self.stop.is_set() and not self._table_exists():
            time.sleep(0.1)
        while not self.stop.is_set():
            try:
                found = stored(self.url, self.table, ("partition", "offset"))
            except Exception as exc:
                self.failed.append(str(exc)[:300])
                continue
            by_partition: dict[int, list[int]] = defaultdict(list)
            for partition, offset in found:
                by_partition[partition].append(offset)
            for partition, offsets in by_partition.items():
                start = self.first[partition]
                if offsets != list(range(start, start + len(offsets))):
                    self.wrong.append(f"partition {partition}: {offsets[:5]}... {len(offsets)}")
            self.reads += 1

    def _table_exists(self) -> bool:
        with sink_from_url(self.url) as sink:
            maintenance = maintenance_of(sink)
            assert maintenance is not None
            return bool(maintenance.tables(self.table))


def import_while_producing(
    spec: ImportSpec, spark: Any, kafka: KafkaConfig, table: str, keys: int
) -> tuple[Reader, Any, list[Record]]:
    """The import, continuous, while a producer adds CHUNKS of records a moment apart and a
    Reader reads the table; stopped (SIGINT, its usual end) once the table holds every record.
    Returns the reader, the summary and the topic's records."""
    reader = Reader(spec.sink_url, table, dict.fromkeys(range(PARTITIONS), 0))
    ended = threading.Event()
    produced = threading.Event()

    def produce_then_stop() -> None:
        for chunk in range(CHUNKS):
            if ended.wait(0.4):
                return
            produce_profile(kafka, table, explicit([CHUNK] * PARTITIONS), keys=keys, seed=chunk)
        produced.set()
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not ended.is_set():
            time.sleep(0.5)
            try:
                if len(stored(spec.sink_url, table, ("partition", "offset"))) >= TOTAL:
                    break
            except Exception:
                continue
        if not ended.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=produce_then_stop, daemon=True)
    reader.start()
    helper.start()
    try:
        summary = run_import(spec, spark=spark)
    finally:
        ended.set()
        helper.join()
        reader.stop.set()
        reader.join()
    assert produced.is_set()
    return reader, summary, read_topic(kafka, table, PARTITIONS)


# CI runs one case per store: Delta here, Iceberg and Parquet (on S3) by `maintain` below; the
# rest with the matrix (scripts/test).
APPEND_STORES = [
    "delta",
    pytest.param("iceberg", marks=pytest.mark.matrix),
    pytest.param("parquet", marks=pytest.mark.matrix),
    pytest.param("delta+s3", marks=pytest.mark.matrix),
    pytest.param("iceberg+s3", marks=pytest.mark.matrix),
    pytest.param("parquet+s3", marks=pytest.mark.matrix),
]


@pytest.mark.parametrize("store", APPEND_STORES)
def test_a_continuous_append_compacted_and_expired_as_it_runs_keeps_every_record_once(
    store, request, broker, kafka, topic_name, tmp_path, spark
):
    """Records arriving in small batches, a maintenance round every half second with a
    one-second history: the readers never see a record missing or doubled, the table ends
    exact with a few files where the batches wrote dozens, its old versions expired; and an
    import from a fresh checkpoint finds everything held (the ledger survived every rewrite)."""
    broker.create_topic(topic_name, PARTITIONS)
    url = sink_url(store, tmp_path, request)
    spec = spec_for(kafka, topic_name, url, tmp_path, mode="continuous", trigger_seconds=0.2)

    reader, summary, records = import_while_producing(spec, spark, kafka, topic_name, keys=12)

    assert not reader.wrong, reader.wrong[:3]
    assert reader.reads > 3 * len(reader.failed), reader.failed[:3]
    assert stored(url, topic_name, COLUMNS) == rows_of(records)
    assert summary.batches >= CHUNKS
    found = health(url, topic_name)
    assert found.data_files <= 4, found  # the batches wrote a file or two each
    assert found.live_bytes > 0
    if not store.startswith("parquet"):
        assert found.versions < found.extra["commits"], found  # the oldest expired

    again = run_import(spec_for(kafka, topic_name, url, tmp_path / "fresh"), spark=spark)

    assert again.records == 0
    assert stored(url, topic_name, COLUMNS) == rows_of(records)


def upsert_topic(
    store: str, request, broker, kafka, topic_name: str, tmp_path: Path, **options: Any
) -> tuple[list[Any], str, ImportSpec]:
    """A topic of 300 records in each partition over 300 keys (enough that batches add files,
    new keys, and replace rows, keys seen before), and an upsert import of it with a round
    after every batch."""
    broker.create_topic(topic_name, PARTITIONS)
    produce_profile(kafka, topic_name, explicit([300] * PARTITIONS), keys=300)
    records = read_topic(kafka, topic_name, PARTITIONS)
    url = sink_url(store, tmp_path, request)
    spec = spec_for(
        kafka, topic_name, url, tmp_path, write="upsert", maintain_every_s=0.001, **options
    )
    return records, url, spec


@pytest.mark.matrix
@pytest.mark.parametrize("store", ["delta", "iceberg"])
def test_an_upsert_compacted_between_batches_keeps_the_newest_row_per_key(
    store, request, broker, kafka, topic_name, tmp_path, spark, caplog
):
    """Upserts rewrite the files they touch; maintenance between batches merges small files (a
    target of 8 KiB, so that this small table has some) and removes the replaced ones: the table
    ends as the newest record per key in a few files, and a fresh checkpoint imports nothing
    twice."""
    records, url, spec = upsert_topic(
        store, request, broker, kafka, topic_name, tmp_path, target_file_size=8192
    )

    with caplog.at_level(logging.INFO, logger="lagless.importer.maintenance"):
        summary = run_import(spec, spark=spark)

    newest = newest_per_key(records)
    assert stored(url, topic_name, COLUMNS) == rows_of(list(newest.values()))
    assert summary.batches >= 600 // BATCH_RECORDS
    # Delta's MERGE rewrites what it touches into one file: its rounds remove the files
    # replaced. Iceberg's upserts add a data file and a delete file a batch: its rounds merge
    # the files as an append's (tiers of a 8 KiB target: at most MOST_SMALL_FILES left, where
    # the batches wrote more), fold the deletes into them and keep one delete file at most.
    rounds = [r.getMessage() for r in caplog.records if r.getMessage().startswith("maintenance")]
    assert any(f"maintenance: {topic_name}: " in line for line in rounds), rounds
    assert any("files removed" in line for line in rounds), rounds
    found = health(url, topic_name)
    assert found.data_files <= (4 if store.startswith("delta") else MOST_SMALL_FILES), found
    assert found.extra.get("delete_files", 0) <= 1, found
    again = run_import(
        spec_for(kafka, topic_name, url, tmp_path / "fresh", write="upsert"), spark=spark
    )
    assert again.records == 0


@pytest.mark.parametrize("store", ["iceberg", pytest.param("iceberg+s3", marks=pytest.mark.matrix)])
def test_kill_9_as_a_fold_beside_the_batches_commits_then_a_rerun_ends_exact(
    store, request, broker, kafka, topic_name, tmp_path, spark
):
    """An Iceberg upsert's round folds beside the batches (fold.py); the import killed as a
    fold commits, its files and the deletes it moved written, in no snapshot: the table holds
    each key once, and the rerun (and a `maintain` after it) ends with the newest record per
    key. Reaching the point proves an import's fold ran beside its batches and got to its
    commit."""
    records, url, spec = upsert_topic(
        store, request, broker, kafka, topic_name, tmp_path, keep_history_s=0
    )
    args = [*cli_args(spec), "--maintain-every", "0.001", "--keep-history", "0"]

    code, _, stderr = run_import_process(args, tmp_path, "mid-fold:1")

    assert code == -signal.SIGKILL, stderr[-3000:]
    left = stored(url, topic_name, ("key",))
    assert left and len(left) == len(set(left))
    rerun(spec, spark)
    newest = rows_of(list(newest_per_key(records).values()))
    assert stored(url, topic_name, COLUMNS) == newest
    done = maintain(url, "--table", topic_name, "--keep-history", "0")
    assert done.returncode == 0, done.stderr
    assert stored(url, topic_name, COLUMNS) == newest


def maintain(url: str, *args: str, failpoint: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LAGLESS_FAILPOINT"}
    if failpoint:
        env["LAGLESS_FAILPOINT"] = failpoint
    return subprocess.run(
        [sys.executable, "-m", "lagless", "maintain", "--sink", url, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


MAINTAIN_STORES = [
    pytest.param("delta", marks=pytest.mark.matrix),
    "iceberg",
    pytest.param("parquet", marks=pytest.mark.matrix),
    pytest.param("delta+s3", marks=pytest.mark.matrix),
    pytest.param("iceberg+s3", marks=pytest.mark.matrix),
    "parquet+s3",
]


@pytest.mark.parametrize("store", MAINTAIN_STORES)
def test_maintain_compacts_a_table_a_bulk_import_filled_and_lag_shows_it(
    store, request, broker, kafka, topic_name, tmp_path, spark
):
    """`lagless maintain` once on a table of many small files: the same rows in a few files,
    the files only old versions read removed once out of the window; `lag --sink --json` shows
    the files, the small ones and the bytes before and after."""
    broker.create_topic(topic_name, PARTITIONS)
    produce_profile(kafka, topic_name, explicit([300] * PARTITIONS), keys=12)
    records = read_topic(kafka, topic_name, PARTITIONS)
    url = sink_url(store, tmp_path, request)
    run_import(spec_for(kafka, topic_name, url, tmp_path, maintain_every_s=0), spark=spark)
    before = table_health(kafka, url, topic_name)
    assert before["data_files"] >= 600 // BATCH_RECORDS
    assert before["small_file_share"] == 1.0

    rounds = []
    for wait_s in (0, 1.5):  # the second once the first's replaced files left the window
        time.sleep(wait_s)
        done = maintain(url, "--table", topic_name, "--keep-history", "1", "--json")
        assert done.returncode == 0, done.stderr
        rounds += [each for each in json.loads(done.stdout) if each["table"] == topic_name]

    assert stored(url, topic_name, COLUMNS) == rows_of(records)
    after = table_health(kafka, url, topic_name)
    assert after["data_files"] <= 2, after
    assert rounds[0]["compacted_files"] >= before["data_files"] - 2
    assert sum(each["removed_files"] for each in rounds) >= before["data_files"] - 2
    assert after["bytes_on_disk"] < before["bytes_on_disk"]
    assert after["live_bytes"] <= after["bytes_on_disk"]


def table_health(kafka: KafkaConfig, url: str, topic: str) -> dict[str, Any]:
    args = ["--bootstrap", kafka.bootstrap, "--sink", url, "--topic", topic, "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "lagless", "lag", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert {row["held"] for row in shown["partitions"]} == {300}
    return {each["table"]: each for each in shown["tables"]}[topic]


KILLS = [
    pytest.param("delta", "mid-compaction:1", marks=pytest.mark.matrix),
    pytest.param("delta", "mid-expiry:1", marks=pytest.mark.matrix),
    pytest.param("delta+s3", "mid-compaction:2", marks=pytest.mark.matrix),
    pytest.param("iceberg", "mid-compaction:1", marks=pytest.mark.matrix),
    pytest.param("iceberg", "mid-expiry:1", marks=pytest.mark.matrix),
    pytest.param("iceberg+s3", "mid-compaction:1", marks=pytest.mark.matrix),
    pytest.param("parquet", "mid-compaction:1", marks=pytest.mark.matrix),
    pytest.param("parquet", "mid-expiry:1", marks=pytest.mark.matrix),
    pytest.param("parquet+s3", "mid-compaction:1", marks=pytest.mark.matrix),
]


@pytest.mark.parametrize(("store", "failpoint"), KILLS)
def test_kill_9_inside_maintenance_then_a_rerun_ends_exact(
    store, failpoint, request, broker, kafka, topic_name, tmp_path, spark
):
    """The import killed inside compaction or expiry: the table is readable and holds whole
    batches once; the rerun (and a `maintain` after it) ends with every record once."""
    broker.create_topic(topic_name, PARTITIONS)
    produce_profile(kafka, topic_name, explicit([300] * PARTITIONS), keys=12)
    records = read_topic(kafka, topic_name, PARTITIONS)
    url = sink_url(store, tmp_path, request)
    spec = spec_for(kafka, topic_name, url, tmp_path, maintain_every_s=0.001, keep_history_s=0)
    args = [*cli_args(spec), "--maintain-every", "0.001", "--keep-history", "0"]
    args += ["--target-file-size", "1M"]

    code, _, stderr = run_import_process(args, tmp_path, failpoint)

    assert code == -signal.SIGKILL, stderr[-3000:]
    left = stored(url, topic_name, ("partition", "offset"))
    assert len(left) == len(set(left))
    assert left  # compaction had batches to merge
    rerun(spec, spark)
    assert stored(url, topic_name, COLUMNS) == rows_of(records)
    done = maintain(url, "--table", topic_name, "--keep-history", "0")
    assert done.returncode == 0, done.stderr
    assert stored(url, topic_name, COLUMNS) == rows_of(records)
