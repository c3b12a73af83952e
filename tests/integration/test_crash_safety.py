"""Nothing lost, nothing doubled (issue 4): kill -9 of the import process at each failpoint then
a rerun, poison records, the consumer group's offsets after every batch, and the broker going
away mid-import.

Every expectation is computed from the topic itself, read back with a plain consumer, and the
rules the sinks promise (checked against what the producer says it wrote), never from another
lagless run.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import psycopg
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from psycopg.types.string import TextLoader

from lagless.exceptions import LaglessError
from lagless.gen import ProducedSummary, RecordKind, explicit, produce_profile
from lagless.importer.checkpoint import batch_end_offsets, journaled_batches
from lagless.importer.job import run_import
from lagless.importer.rows import INVALID_JSON, INVALID_UTF8, NULL_KEY, VALIDATE, too_large
from lagless.importer.spec import ImportSpec
from lagless.kafka import Offsets
from lagless.kafka.config import KafkaConfig
from lagless.progress import Collector, Summary
from lagless.sinks.base import WriteMode
from lagless.sinks.url import parse_local
from tests.harness import sqlite_elsewhere
from tests.harness.plans import tasks_writer
from tests.harness.s3 import committed_parquet_files, reader_filesystem, reader_options

pytestmark = pytest.mark.spark

PARTITIONS = 2
RECORDS_PER_PARTITION = 300
BATCH_RECORDS = 200  # 600 records: three batches, so a crash in the 1st or 2nd leaves work
READ_TIMEOUT_S = 60.0
PROCESS_TIMEOUT_S = 300.0
SAMPLE_EVERY_S = 0.05
DOWN_S = 4.0

TARGET_COLUMNS = ("partition", "offset", "key", "value", "timestamp")
DEAD_LETTER_COLUMNS = ("partition", "offset", "key", "value", "timestamp", "stage", "error")


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int


def read_topic(kafka: KafkaConfig, topic: str, partitions: int) -> list[Record]:
    """Every record of the topic, read with an assigned consumer (no lagless code involved)."""
    consumer = Consumer(kafka.reader())
    try:
        ranges = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in range(partitions)
        }
        consumer.assign([TopicPartition(topic, p, low) for p, (low, high) in ranges.items()])
        remaining = sum(high - low for low, high in ranges.values())
        records: list[Record] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while remaining and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=1):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    continue
                partition, offset, value = message.partition(), message.offset(), message.value()
                assert partition is not None and offset is not None  # value None: a tombstone
                records.append(
                    Record(partition, offset, message.key(), value, message.timestamp()[1])
                )
                remaining -= 1
        assert remaining == 0, f"{remaining} records of {topic!r} not read back"
        return records
    finally:
        consumer.close()


def rejection(record: Record, write: WriteMode, max_record_bytes: int | None) -> str | None:
    """Why a `--format json` import must dead-letter the record, checks in the documented order:
    null key (upsert only), size, UTF-8, JSON."""
    assert record.value is not None  # the topics here hold no tombstones
    if write == "upsert" and record.key is None:
        return NULL_KEY
    if max_record_bytes is not None and len(record.value) > max_record_bytes:
        return too_large(max_record_bytes)
    try:
        json.loads(record.value.decode("utf-8"))
    except UnicodeDecodeError:
        return INVALID_UTF8
    except ValueError:
        return INVALID_JSON
    return None


def is_newer(record: Record, held: Record) -> bool:
    """The order-proof rule, stated independently of the sinks' SQL."""
    if record.partition == held.partition:
        return record.offset > held.offset
    return (record.timestamp, record.partition) > (held.timestamp, held.partition)


@dataclass(frozen=True)
class Tables:
    target: list[tuple[Any, ...]]
    dead_letters: list[tuple[Any, ...]]


def clean_run(
    records: list[Record], write: WriteMode, max_record_bytes: int | None = None
) -> Tables:
    """The target and `_dlq` tables a clean `--format json` import of `records` produces."""
    accepted: list[Record] = []
    letters: list[tuple[Any, ...]] = []
    for r in records:
        error = rejection(r, write, max_record_bytes)
        if error is None:
            accepted.append(r)
        else:
            letters.append((r.partition, r.offset, r.key, r.value, r.timestamp, VALIDATE, error))
    if write == "upsert":
        newest: dict[bytes | None, Record] = {}
        for r in accepted:
            if r.key not in newest or is_newer(r, newest[r.key]):
                newest[r.key] = r
        accepted = list(newest.values())
    rows = [
        (r.partition, r.offset, r.key, same_json(r.value.decode()), r.timestamp)
        for r in accepted
        if r.value is not None
    ]
    return Tables(sorted(rows), sorted(letters))


def same_json(text: str) -> str:
    """JSON text in one spelling (keys sorted, no spaces): PostgreSQL's jsonb keeps a value's
    meaning, not its spelling, so values are compared as parsed JSON."""
    return json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


def below(records: list[Record], ends: Offsets, topic: str) -> list[Record]:
    return [r for r in records if r.offset < ends.get((topic, r.partition), 0)]


def agrees_with_producer(expected: Tables, produced: ProducedSummary, write: WriteMode) -> None:
    """The oracle finds exactly the poison the producer wrote and the newest value it sent."""
    rejected = {RecordKind.INVALID_UTF8, RecordKind.INVALID_JSON}
    if write == "upsert":
        rejected.add(RecordKind.NULL_KEY)
    poison = {(p, o) for p, o, kind in produced.poison if kind in rejected}
    assert {(row[0], row[1]) for row in expected.dead_letters} == poison != set()
    if write == "upsert":
        newest = {k.encode(): (n.partition, n.offset) for k, n in produced.newest_by_key().items()}
        assert {row[2]: (row[0], row[1]) for row in expected.target} == newest
    else:
        assert len(expected.target) + len(poison) == produced.records


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def stored(sink_url: str, table: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """A table of any sink, as sorted tuples of plain Python values (duplicates kept)."""
    if "+s3://" in sink_url:
        return stored_on_s3(sink_url, table, columns)
    if sink_url.startswith("parquet:"):
        folder = os.path.join(parse_local(sink_url, "parquet").path, table)
        if not any(
            name.endswith(".parquet")
            for path, _, names in os.walk(folder)
            if not any(part.startswith(("_", ".")) for part in Path(path).relative_to(folder).parts)
            for name in names
        ):
            return []  # nothing visible: a batch still gathering is hidden, as from any reader
        data = pq.read_table(folder, columns=list(columns)).to_pylist()
        return sorted(tuple(row[c] for c in columns) for row in data)
    if sink_url.startswith("delta:"):
        folder = os.path.join(parse_local(sink_url, "delta").path, table)
        if not os.path.isdir(os.path.join(folder, "_delta_log")):
            return []
        return sorted(pl.read_delta(folder, columns=list(columns)).iter_rows())
    if sink_url.startswith("iceberg:"):
        return iceberg_rows(parse_local(sink_url, "iceberg").path, table, columns)
    names = ", ".join(f'"{c}"' for c in columns)
    select = f'SELECT {names} FROM "{table}"'
    if sink_url.startswith("sqlite:"):
        found = sqlite_elsewhere.rows(parse_local(sink_url, "sqlite").path, select)
    else:
        with psycopg.connect(sink_url) as conn:
            conn.adapters.register_loader("jsonb", TextLoader)  # as text, like the other sinks
            found = conn.execute(select).fetchall()
    return sorted(tuple(_plain(v) for v in row) for row in found)


def stored_on_s3(sink_url: str, table: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """A table on S3 (the `s3_env` fixture's server), through the store's own reader: pyarrow's
    S3 filesystem for Parquet (the committed batches' folders), deltalake for Delta."""
    store, _, place = sink_url.partition("+s3://")
    folder = f"{place.split('?')[0]}/{table}"
    if store == "parquet":
        filesystem = reader_filesystem()
        files = committed_parquet_files(filesystem, folder)
        if not files:
            return []
        data = pq.read_table(files, columns=list(columns), filesystem=filesystem).to_pylist()
        return sorted(tuple(row[c] for c in columns) for row in data)
    if store == "iceberg":
        catalog = place.split("?catalog=")[1]
        return iceberg_rows(None, table, columns, catalog=catalog, s3=f"s3://{place.split('?')[0]}")
    assert store == "delta", sink_url
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        found = DeltaTable(f"s3://{folder}", storage_options=reader_options())
    except TableNotFoundError:
        return []
    data = found.to_pyarrow_table(columns=list(columns)).to_pylist()
    return sorted(tuple(row[c] for c in columns) for row in data)


def iceberg_rows(
    warehouse: str | None,
    table: str,
    columns: tuple[str, ...],
    catalog: str | None = None,
    s3: str | None = None,
) -> list[tuple[Any, ...]]:
    """Through pyiceberg's SQL catalog, as README tells a reader to open the warehouse (on S3:
    the catalog file on the driver, the `s3_env` server's AWS variables as FileIO's)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    if s3 is None:
        assert warehouse is not None
        warehouse = os.path.abspath(warehouse)
        catalog, location, io = os.path.join(warehouse, "catalog.db"), f"file://{warehouse}", {}
    else:
        options = reader_options()
        location = s3
        io = {
            "s3.endpoint": options["endpoint"],
            "s3.access-key-id": options["access_key_id"],
            "s3.secret-access-key": options["secret_access_key"],
            "s3.region": options["region"],
        }
    assert catalog is not None
    if not os.path.exists(catalog):
        return []
    opened = SqlCatalog("lagless", uri=f"sqlite:///{catalog}", warehouse=location, **io)
    try:
        found = opened.load_table(f"default.{table}")
    except NoSuchTableError:
        return []
    finally:
        opened.engine.dispose()
    data = found.scan(selected_fields=columns).to_arrow().to_pylist()
    return sorted(tuple(row[c] for c in columns) for row in data)


def sink_tables(sink_url: str, table: str) -> Tables:
    """The target (values as parsed JSON, see same_json) and dead-letter tables of a
    `--format json` import."""
    value = TARGET_COLUMNS.index("value")
    target = [
        (*row[:value], same_json(row[value]), *row[value + 1 :])
        for row in stored(sink_url, table, TARGET_COLUMNS)
    ]
    return Tables(
        target,
        stored(sink_url, f"{table}_dlq", DEAD_LETTER_COLUMNS),
    )


def committed(kafka: KafkaConfig, group: str, topic: str) -> Offsets:
    """The group's committed offsets, read as any lag tool would (no subscription)."""
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    try:
        found = consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10
        )
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}


@dataclass
class GroupSampler:
    """Samples the group's offsets, then the sink, in a loop while an import runs.

    Reading the sink after the offsets means a record below a sampled offset must already be
    there if the import commits the group only after the sink."""

    kafka: KafkaConfig
    group: str
    topic: str
    sink_url: str
    samples: list[tuple[Offsets, Tables]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _failure: BaseException | None = None

    def __enter__(self) -> GroupSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()
        if self._failure is not None:
            raise self._failure

    def _run(self) -> None:
        try:
            while not self._stop.wait(SAMPLE_EVERY_S):
                offsets = committed(self.kafka, self.group, self.topic)
                # The table may not exist yet, or be locked by the writer beyond the timeout.
                with suppress(sqlite3.OperationalError, psycopg.errors.UndefinedTable):
                    self.samples.append((offsets, sink_tables(self.sink_url, self.topic)))
        except BaseException as failure:
            self._failure = failure

    def check(self, records: list[Record], write: WriteMode, floor: Offsets) -> None:
        """No sample runs ahead of the sink, and none goes back (from `floor` on)."""
        assert self.samples
        previous = dict(floor)
        for offsets, tables in self.samples:
            for tp, offset in offsets.items():
                assert offset >= previous.get(tp, -1), f"{tp} went back to {offset}"
            previous = offsets
            assert covers(tables, clean_run(below(records, offsets, self.topic), write), write)


def covers(tables: Tables, prefix: Tables, write: WriteMode) -> bool:
    """The sink holds at least everything of `prefix` (for upsert: each key at least as new;
    keys here never move between partitions, so the offset ranks them)."""
    if not set(prefix.dead_letters) <= set(tables.dead_letters):
        return False
    if write == "append":
        return set(prefix.target) <= set(tables.target)
    held = {row[2]: row for row in tables.target}
    return all(row[2] in held and held[row[2]][1] >= row[1] for row in prefix.target)


class BatchProbe(Collector):
    """Calls `probe(batch_id)` after each batch: the import has then written the sink and
    committed the group."""

    def __init__(self, probe: Callable[[int], None]) -> None:
        self.probe = probe

    def batch(self, summary: Summary, lag: int) -> None:
        self.probe(summary.batches - 1)


def small_batches(
    kafka: KafkaConfig, topic: str, url: str, folder: Path, **options: Any
) -> ImportSpec:
    """An import of BATCH_RECORDS per batch (a kill leaves work), checkpoint in `folder`."""
    return ImportSpec(
        kafka=kafka,
        topics=(topic,),
        sink_url=url,
        checkpoint=str(folder / "ckpt"),
        max_records_per_batch=BATCH_RECORDS,
        **options,
    )


def cli_args(spec: ImportSpec) -> list[str]:
    args = ["--bootstrap", spec.kafka.bootstrap, "--sink", spec.sink_url]
    args += ["--checkpoint", spec.checkpoint, "--write", spec.write, "--format", spec.value_format]
    args += [part for topic in spec.topics for part in ("--topic", topic)]
    options = {
        "--max-records-per-batch": spec.max_records_per_batch,
        "--group": spec.group,
        "--max-record-bytes": spec.max_record_bytes,
        "--value-schema": spec.value_schema,
    }
    return args + [part for k, v in options.items() if v is not None for part in (k, str(v))]


# A rerun on the test session's Spark that takes longer is stopped: see rerun().
RERUN_TIMEOUT_S = 240.0


def rerun(spec: ImportSpec, spark: Any) -> Summary:
    """run_import on the test run's shared Spark session, stopped if it takes longer than
    RERUN_TIMEOUT_S: every thread's stack goes to stderr, the session's queries and jobs are
    stopped, and the import's error fails this test alone. (Once, a rerun after kill -9 hung
    for 10 minutes until pytest-timeout ended it, and every later test of the run failed on
    the session it left busy.)"""
    import faulthandler

    done, fired = threading.Event(), threading.Event()

    def watchdog() -> None:
        if done.wait(RERUN_TIMEOUT_S):
            return
        fired.set()
        print(f"the rerun took over {RERUN_TIMEOUT_S:.0f} s; stopping it", file=sys.stderr)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for query in spark.streams.active:
            with suppress(Exception):
                query.stop()
        spark.sparkContext.cancelAllJobs()

    threading.Thread(target=watchdog, name="rerun-watchdog", daemon=True).start()
    try:
        summary = run_import(spec, spark=spark)
    finally:
        done.set()
        if fired.is_set():
            pytest.fail(f"the rerun took over {RERUN_TIMEOUT_S:.0f} s (stacks on stderr)")
    return summary


def run_import_process(
    args: list[str], folder: Path, failpoint: str | None = None
) -> tuple[int, str, str]:
    """`python -m lagless import ARGS` in its own process group; returns code, stdout, stderr."""
    env = {k: v for k, v in os.environ.items() if k != "LAGLESS_FAILPOINT"}
    if failpoint:
        env["LAGLESS_FAILPOINT"] = failpoint
    # A hung import is aborted: its Python stacks (faulthandler) and its JVM's threads (SIGQUIT)
    # go to its stderr and stdout, which the failure shows.
    env["PYTHONFAULTHANDLER"] = "1"
    out, err = folder / "import.out", folder / "import.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "lagless", "import", *args],
            stdout=stdout,
            stderr=stderr,
            env=env,
            start_new_session=True,
        )
        try:
            code = process.wait(timeout=PROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"the import ran over {PROCESS_TIMEOUT_S:.0f} s:\n{_stacks(process, out, err)}"
            )
        finally:
            # A killed import's JVM and Python workers would otherwise outlive it.
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return code, out.read_text(), err.read_text()


def _stacks(process: subprocess.Popen[bytes], out: Path, err: Path) -> str:
    """The hung import's JVM thread dump and Python stacks, and the end of its output."""
    for pid in _children(process.pid):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)  # a JVM prints its threads; the Python workers ignore it
    time.sleep(3)
    with suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGABRT)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    tails = [
        f"--- {path.name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-400:])
        for path in (err, out)
    ]
    return "\n".join(tails)


def _children(pid: int) -> list[int]:
    """Every process under `pid` (from /proc), deepest first."""
    parents: dict[int, int] = {}
    for status in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, ValueError, IndexError):
            fields = status.read_text().rsplit(")", 1)[1].split()
            parents[int(status.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        below = [child for child, parent in parents.items() if parent in frontier]
        found += below
        frontier = below
    return found[::-1]


@dataclass(frozen=True)
class Crash:
    sink: str
    write: WriteMode
    failpoint: str

    def __str__(self) -> str:
        return f"{self.sink}-{self.write}-{self.failpoint}"

    @property
    def name(self) -> str:
        return self.failpoint.partition(":")[0]

    @property
    def nth(self) -> int:
        return int(self.failpoint.partition(":")[2] or 1)

    def batch_killed(self, has_dead_letters: Callable[[int], bool]) -> int:
        """The batch the nth hit of the failpoint falls in. A sink reaches mid-write once in
        the write of a batch's rows and once in that of its dead letters, if any."""
        if self.name != "mid-write":
            return self.nth - 1
        hits = 0
        batch_id = 0
        while True:
            hits += 1 + int(has_dead_letters(batch_id))
            if hits >= self.nth:
                return batch_id
            batch_id += 1

    def check_left_behind(self, left: Tables, before: Tables, through: Tables) -> None:
        """What the kill left in the sink, given the tables of the batches before the killed one
        and through it: whole batches only, never part of one."""
        assert left.target in (before.target, through.target)
        assert left.dead_letters in (before.dead_letters, through.dead_letters)
        if self.name == "before-write":
            assert left == before
        elif self.name in ("after-write", "after-group-commit"):
            assert left == through
        else:
            # The write killed, of the rows or of the dead letters, left nothing visible; the
            # order of the two writes is the importer's choice.
            assert left != through

    def group_committed_batch_killed(self) -> bool:
        return self.name == "after-group-commit"


def in_matrix(*crashes: Crash) -> list[Any]:
    return [pytest.param(crash, marks=pytest.mark.matrix) for crash in crashes]


# Each failpoint at least once, each sink and write mode at least once, the 2nd batch for some;
# in every run (CI), each failpoint once and each local sink and write mode once (~35 s a
# case), the rest in the matrix.
CRASHES = [
    Crash("sqlite", "upsert", "before-write:1"),
    Crash("postgresql", "append", "after-write:2"),
    Crash("postgresql", "upsert", "after-group-commit:2"),
    Crash("parquet", "append", "mid-write:2"),
    # Delta: each failpoint once across its two write modes (the suite's time is bounded; the
    # raw appends its tasks write are killed at three more points below).
    Crash("delta", "upsert", "mid-write:3"),
    *in_matrix(
        Crash("sqlite", "append", "mid-write:3"),
        Crash("delta", "append", "before-write:2"),
        Crash("postgresql", "upsert", "mid-write:2"),
        Crash("delta", "append", "after-group-commit:2"),
        Crash("delta", "upsert", "after-write:2"),
    ),
    # Iceberg: each failpoint once across its two write modes, the other way round from Delta;
    # the files moved beside the table's but not yet in a snapshot (mid-write) in every run,
    # the rest in the matrix (35 s each).
    Crash("iceberg", "append", "mid-write:3"),
    *in_matrix(
        Crash("iceberg", "upsert", "before-write:2"),
        Crash("iceberg", "upsert", "after-group-commit:2"),
        Crash("iceberg", "append", "after-write:2"),
    ),
    # On S3 (a real server, tests/harness/s3.py): the files copied into the table's folder but
    # not yet committed (mid-write): Delta's in every run (its commit on S3 is delta-rs's
    # conditional put); Parquet's (lagless's lock object), Iceberg's (~2 min: its commit is the
    # catalog file on the driver, as locally) and the rest in the matrix.
    Crash("delta+s3", "append", "mid-write:2"),
    *in_matrix(
        Crash("parquet+s3", "append", "mid-write:2"),
        Crash("iceberg+s3", "append", "mid-write:3"),
        Crash("parquet+s3", "append", "after-write:2"),
        Crash("parquet+s3", "append", "before-write:1"),
        Crash("delta+s3", "upsert", "mid-write:3"),
        Crash("delta+s3", "append", "after-group-commit:2"),
        Crash("iceberg+s3", "upsert", "mid-write:3"),
        Crash("iceberg+s3", "append", "after-write:2"),
    ),
]


def sink_url(sink: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if sink.endswith("+s3"):
        s3 = request.getfixturevalue("s3_env")  # its AWS variables reach the import's process
        store = sink.removesuffix("+s3")
        catalog = f"?catalog={tmp_path}/catalog.db" if store == "iceberg" else ""
        return str(s3.url(store, f"{tmp_path.name}/lake")) + catalog
    if sink == "postgresql":
        return str(request.getfixturevalue("postgres").url)
    return f"{sink}:///{tmp_path}/{'out.db' if sink == 'sqlite' else 'lake'}"


def in_batches(
    records: list[Record], checkpoint: str, first: int, stop: int, topic: str
) -> list[Record]:
    """The records of batches first..stop-1, by the offsets Spark journaled for them."""
    start = batch_end_offsets(checkpoint, first - 1) if first else {}
    end = batch_end_offsets(checkpoint, stop - 1) if stop else {}
    return [
        r
        for r in records
        if start.get((topic, r.partition), 0) <= r.offset < end.get((topic, r.partition), 0)
    ]


@pytest.mark.parametrize("crash", CRASHES, ids=str)
def test_kill_9_at_a_failpoint_then_a_rerun_ends_like_a_clean_run(
    crash, request, broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, PARTITIONS)
    produced = produce_profile(
        kafka, topic_name, explicit([RECORDS_PER_PARTITION] * PARTITIONS), keys=12, poison=0.03
    )
    records = read_topic(kafka, topic_name, PARTITIONS)
    expected = clean_run(records, crash.write)
    agrees_with_producer(expected, produced, crash.write)
    url = sink_url(crash.sink, tmp_path, request)
    group = f"{topic_name}-importer"
    spec = ImportSpec(
        kafka=kafka,
        topics=(topic_name,),
        sink_url=url,
        checkpoint=str(tmp_path / "ckpt"),
        write=crash.write,
        value_format="json",
        max_records_per_batch=BATCH_RECORDS,
        group=group,
    )

    code, _, stderr = run_import_process(cli_args(spec), tmp_path, crash.failpoint)

    assert code == -signal.SIGKILL, stderr[-3000:]
    checkpoint = spec.checkpoint

    def has_dead_letters(batch_id: int) -> bool:
        batch = clean_run(
            in_batches(records, checkpoint, batch_id, batch_id + 1, topic_name), crash.write
        )
        return bool(batch.dead_letters)

    killed = crash.batch_killed(has_dead_letters)
    journaled = [int(n) for n in os.listdir(os.path.join(checkpoint, "offsets")) if n.isdigit()]
    assert max(journaled) == killed  # the failpoint fired in the batch intended
    crash.check_left_behind(
        sink_tables(url, topic_name),
        before=clean_run(in_batches(records, checkpoint, 0, killed, topic_name), crash.write),
        through=clean_run(in_batches(records, checkpoint, 0, killed + 1, topic_name), crash.write),
    )
    at_crash = committed(kafka, group, topic_name)
    in_group = killed + int(crash.group_committed_batch_killed())
    assert at_crash == (batch_end_offsets(checkpoint, in_group - 1) if in_group else {})

    if crash.sink.startswith("parquet"):  # a replay swaps a batch's folder: a sample could miss it
        rerun(spec, spark)
    else:
        with GroupSampler(kafka, group, topic_name, url) as sampler:
            rerun(spec, spark)
        sampler.check(records, crash.write, floor=at_crash)

    assert sink_tables(url, topic_name) == expected
    assert committed(kafka, group, topic_name) == {
        (topic_name, p): RECORDS_PER_PARTITION for p in range(PARTITIONS)
    }


def test_poison_records_land_in_the_dlq_of_postgresql_and_the_counts_add_up(
    broker, kafka, topic_name, tmp_path, postgres
):
    """Through the CLI with --json: every kind of rejection, including the size limit, which
    takes precedence over the UTF-8 and JSON checks for the large records of partition 2."""
    broker.create_topic(topic_name, 3)
    small = produce_profile(kafka, topic_name, explicit([250, 250, 0]), keys=10, poison=0.06)
    large = produce_profile(
        kafka, topic_name, explicit([0, 0, 60], record_bytes=400), keys=5, poison=0.1
    )
    records = read_topic(kafka, topic_name, 3)
    limit = 300
    expected = clean_run(records, "upsert", limit)
    reasons_by_kind = {
        RecordKind.INVALID_UTF8: INVALID_UTF8,
        RecordKind.INVALID_JSON: INVALID_JSON,
        RecordKind.NULL_KEY: NULL_KEY,
    }
    large_poison = {(p, o): kind for p, o, kind in large.poison}
    assert {(row[0], row[1]): row[-1] for row in expected.dead_letters} == {
        **{(p, o): reasons_by_kind[kind] for p, o, kind in small.poison},
        **{
            (2, o): NULL_KEY
            if large_poison.get((2, o)) == RecordKind.NULL_KEY
            else too_large(limit)
            for o in range(60)
        },
    }
    spec = ImportSpec(
        kafka=kafka,
        topics=(topic_name,),
        sink_url=postgres.url,
        checkpoint=str(tmp_path / "ckpt"),
        write="upsert",
        value_format="json",
        max_record_bytes=limit,
    )

    code, stdout, stderr = run_import_process([*cli_args(spec), "--json"], tmp_path)

    assert code == 0, stderr[-3000:]
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert sink_tables(postgres.url, topic_name) == expected
    reasons = Counter(row[-1] for row in expected.dead_letters)
    assert set(reasons) == {NULL_KEY, INVALID_UTF8, INVALID_JSON, too_large(limit)}
    assert summary["dead_lettered_by_reason"] == dict(reasons)
    assert summary["records"] == len(records) == summary["imported"] + summary["dead_lettered"]
    assert summary["dead_lettered"] == len(expected.dead_letters)


def test_the_group_follows_the_sink_after_every_batch_and_never_goes_back(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    broker.create_topic(topic_name, PARTITIONS)
    produce_profile(kafka, topic_name, explicit([500, 250]), keys=20)
    records = read_topic(kafka, topic_name, PARTITIONS)
    group = f"{topic_name}-importer"
    spec = ImportSpec(
        kafka=kafka,
        topics=(topic_name,),
        sink_url=postgres.url,
        checkpoint=str(tmp_path / "ckpt"),
        value_format="json",
        max_records_per_batch=150,
        group=group,
    )
    after_batches: list[tuple[Offsets, Offsets, Tables]] = []

    def probe(batch_id: int) -> None:
        end = batch_end_offsets(spec.checkpoint, batch_id)
        after_batches.append(
            (end, committed(kafka, group, topic_name), sink_tables(postgres.url, topic_name))
        )

    with GroupSampler(kafka, group, topic_name, postgres.url) as sampler:
        summary = run_import(spec, BatchProbe(probe), spark=spark)

    assert summary.batches == len(after_batches) == 5
    for end, offsets, tables in after_batches:
        assert offsets == end
        assert tables == clean_run(below(records, end, topic_name), "append")
    sampler.check(records, "append", floor={})
    assert committed(kafka, group, topic_name) == {(topic_name, 0): 500, (topic_name, 1): 250}


def test_a_replay_from_a_fresh_checkpoint_never_moves_the_group_backwards(
    broker, kafka, topic_name, tmp_path, spark
):
    """As after a crash, or seed 001's late commit: batches replayed from the log start must not
    drag a group that is further along back."""
    broker.create_topic(topic_name, PARTITIONS)
    produce_profile(kafka, topic_name, explicit([400, 400]), keys=20)
    group = f"{topic_name}-importer"
    ahead = {(topic_name, 0): 400, (topic_name, 1): 100}
    consumer = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(t, p, o) for (t, p), o in ahead.items()], asynchronous=False
        )
    finally:
        consumer.close()
    spec = ImportSpec(
        kafka=kafka,
        topics=(topic_name,),
        sink_url=f"sqlite:///{tmp_path}/out.db",
        checkpoint=str(tmp_path / "ckpt"),
        value_format="json",
        max_records_per_batch=200,
        group=group,
    )
    seen: list[tuple[Offsets, Offsets]] = []

    def probe(batch_id: int) -> None:
        seen.append(
            (batch_end_offsets(spec.checkpoint, batch_id), committed(kafka, group, topic_name))
        )

    summary = run_import(spec, BatchProbe(probe), spark=spark)

    assert summary.batches == len(seen) == 4
    for end, offsets in seen:
        assert offsets == {tp: max(ahead[tp], end[tp]) for tp in ahead}
    assert committed(kafka, group, topic_name) == {(topic_name, 0): 400, (topic_name, 1): 400}


@pytest.mark.timeout(300)
def test_the_broker_down_for_seconds_mid_import_loses_and_doubles_nothing(
    broker, kafka, topic_name, tmp_path, spark, request
):
    """Either outcome is allowed: the import rides it out, or stops with one line and a rerun
    completes. The one seen is recorded as the test's `outcome` property."""
    broker.create_topic(topic_name, PARTITIONS)
    produce_profile(kafka, topic_name, explicit([400, 400]), keys=20)
    records = read_topic(kafka, topic_name, PARTITIONS)
    spec = ImportSpec(
        kafka=kafka,
        topics=(topic_name,),
        sink_url=f"sqlite:///{tmp_path}/out.db",
        checkpoint=str(tmp_path / "ckpt"),
        value_format="json",
        max_records_per_batch=200,
    )
    came_back = threading.Event()

    def bring_back() -> None:
        broker.set_up()
        came_back.set()

    back_up = threading.Timer(DOWN_S, bring_back)

    def take_down_after_first_batch(batch_id: int) -> None:
        if batch_id == 0:
            broker.set_down()
            back_up.start()

    try:
        first = run_import(spec, BatchProbe(take_down_after_first_batch), spark=spark)
        outcome = f"retried and completed in {first.batches} batches"
    except LaglessError as failure:
        assert "\n" not in str(failure)
        assert came_back.wait(DOWN_S + 5)
        again = rerun(spec, spark)
        outcome = f"stopped ({failure}); the rerun completed {again.batches} batches"
    finally:
        back_up.cancel()  # only matters if the import failed before the first batch ended
    request.node.user_properties.append(("outcome", outcome))

    assert came_back.is_set()  # the broker really was down while the import went on
    assert sink_tables(spec.sink_url, topic_name) == clean_run(records, "append")


@pytest.mark.parametrize(
    ("sink", "failpoint"),
    [
        # In every run (CI) each failpoint once (SQLite's mid-write: the typed rows' case
        # below), the rest in the matrix.
        ("delta", "before-write:2"),
        ("parquet", "after-write:1"),
        ("postgresql", "mid-write:2"),
        *(
            pytest.param(sink, failpoint, marks=pytest.mark.matrix)
            for sink, failpoint in (
                ("sqlite", "mid-write:2"),
                ("delta", "mid-write:2"),
                ("delta", "after-write:1"),
                ("sqlite", "before-write:2"),
                ("sqlite", "after-write:1"),
                # Parquet's before-write is Delta's: the same staging folder, dropped before
                # the tasks.
                ("parquet", "mid-write:2"),
                ("iceberg", "mid-write:2"),
            )
        ),
    ],
)
def test_records_written_by_the_source_tasks_survive_kill_9_at_each_failpoint(
    sink, failpoint, request, broker, kafka, topic_name, tmp_path, spark
):
    """Raw values take the path where the source's tasks write the records themselves
    (source/executor_write.py): into files the driver makes visible by a rename, a Delta commit
    or one SQLite transaction, or COPYed into PostgreSQL, unique on their offsets. A kill leaves
    whole batches only (PostgreSQL: the killed batch's rows too, which the rerun finds there),
    and the rerun ends with every record exactly once and no staged file left."""
    broker.create_topic(topic_name, PARTITIONS)
    produce_profile(kafka, topic_name, explicit([RECORDS_PER_PARTITION] * PARTITIONS), keys=12)
    records = read_topic(kafka, topic_name, PARTITIONS)
    url = sink_url(sink, tmp_path, request)
    spec = small_batches(kafka, topic_name, url, tmp_path)
    assert tasks_writer(spec) is not None  # the path under test

    code, _, stderr = run_import_process(cli_args(spec), tmp_path, failpoint)

    assert code == -signal.SIGKILL, stderr[-3000:]
    name, _, nth = failpoint.partition(":")
    killed = int(nth) - 1
    # The tasks' COPYs are committed before the driver's mid-write point.
    written_by_tasks = name == "after-write" or (sink == "postgresql" and name == "mid-write")
    visible_through = killed + 1 if written_by_tasks else killed

    def rows(batch_records: list[Record]) -> list[tuple[Any, ...]]:
        return sorted((r.partition, r.offset, r.key, r.value, r.timestamp) for r in batch_records)

    left = stored(url, topic_name, TARGET_COLUMNS)
    assert left == rows(in_batches(records, spec.checkpoint, 0, visible_through, topic_name))

    rerun(spec, spark)

    assert stored(url, topic_name, TARGET_COLUMNS) == rows(records)
    left_over = [p for p in tmp_path.rglob("*") if "partial" in p.name or p.suffix == ".replaced"]
    assert not left_over
    assert not list(tmp_path.rglob("*.arrow"))


TYPED_SCHEMA = "seq BIGINT NOT NULL, pad STRING"


def json_object(value: bytes | None) -> dict[str, Any] | None:
    """The value as the typed import reads it: a JSON object, else None (poison)."""
    try:
        parsed = json.loads(value.decode()) if value is not None else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None


@pytest.mark.parametrize(
    ("sink", "failpoint"),
    [
        ("sqlite", "mid-write:2"),
        pytest.param("delta", "mid-write:2", marks=pytest.mark.matrix),
        pytest.param("parquet", "after-write:1", marks=pytest.mark.matrix),
        pytest.param("iceberg", "before-write:2", marks=pytest.mark.matrix),
        pytest.param("parquet+s3", "mid-write:2", marks=pytest.mark.matrix),
    ],
)
def test_typed_rows_the_source_tasks_write_survive_kill_9(
    sink, failpoint, request, broker, kafka, topic_name, tmp_path, spark, caplog
):
    """Typed JSON values the source's tasks decode and write themselves, and the poison among
    them, which they leave to Spark's rows (dead letters, committed with the same batch): the
    rerun after a kill ends with every good record once as its row, every poison record once
    as a dead letter, and nothing staged left."""
    broker.create_topic(topic_name, PARTITIONS)
    explicit_counts = explicit([RECORDS_PER_PARTITION] * PARTITIONS)
    produce_profile(kafka, topic_name, explicit_counts, keys=12, poison=0.02)
    records = read_topic(kafka, topic_name, PARTITIONS)
    url = sink_url(sink, tmp_path, request)
    spec = small_batches(
        kafka, topic_name, url, tmp_path, value_format="json", value_schema=TYPED_SCHEMA
    )

    code, _, stderr = run_import_process(cli_args(spec), tmp_path, failpoint)

    assert code == -signal.SIGKILL, stderr[-3000:]
    with caplog.at_level(logging.INFO, "lagless.importer.batch_writer"):
        summary = rerun(spec, spark)

    good = {(r.partition, r.offset): json_object(r.value) for r in records}
    poison = sorted(tp for tp, value in good.items() if value is None)
    rows = sorted((p, o, v["seq"], v["pad"]) for (p, o), v in good.items() if v is not None)
    assert len(poison) == 8  # 12 poison records: 4 each of bad UTF-8, bad JSON, null key
    assert stored(url, topic_name, ("partition", "offset", "seq", "pad")) == rows
    assert stored(url, f"{topic_name}_dlq", ("partition", "offset")) == poison
    # The path under test: the rerun's tasks wrote, and left the poison to Spark's rows.
    assert summary.records > 0 and "records left to Spark's rows" in caplog.text
    staged = [p for p in tmp_path.rglob("*.parquet") if "staging" in str(p)]  # any store's
    assert not staged


@pytest.mark.parametrize(
    ("sink", "value_format", "failpoint"),
    [
        # Spark's rows, split by table in each batch: the first table committed, not the others.
        ("sqlite", "json", "between-tables:1"),
        *(
            pytest.param(*case, marks=pytest.mark.matrix)
            for case in (
                ("delta", "raw", "between-tables:2"),  # the tasks write, a table each
                ("parquet", "raw", "between-tables:1"),
                ("postgresql", "json", "between-tables:2"),
                ("iceberg", "json", "between-tables:1"),
            )
        ),
    ],
)
def test_kill_9_between_two_tables_commits_then_a_rerun_lands_every_record_once_in_each(
    sink, value_format, failpoint, request, broker, kafka, topic_name, tmp_path, spark
):
    """A routed import (--topic-pattern, a table per topic) killed in its first batch after
    some of the tables committed their part: each table's ledger alone says what it holds, so
    the rerun replays into each only what it lacks, never doubling the others."""
    topics = [f"{topic_name}_{suffix}" for suffix in "abc"]
    records = {}
    for seed, topic in enumerate(topics):
        broker.create_topic(topic, PARTITIONS)
        produce_profile(kafka, topic, explicit([150] * PARTITIONS), keys=12, seed=seed)
        records[topic] = read_topic(kafka, topic, PARTITIONS)
    url = sink_url(sink, tmp_path, request)
    spec = ImportSpec(
        kafka=kafka,
        topics=(),
        topic_pattern=f"{topic_name}_[abc]",
        sink_url=url,
        checkpoint=str(tmp_path / "ckpt"),
        value_format=value_format,
        max_records_per_batch=BATCH_RECORDS,
    )
    args = ["--bootstrap", kafka.bootstrap, "--sink", url, "--checkpoint", spec.checkpoint]
    args += ["--topic-pattern", f"{topic_name}_[abc]", "--format", value_format]
    args += ["--max-records-per-batch", str(BATCH_RECORDS)]

    code, _, stderr = run_import_process(args, tmp_path, failpoint)

    assert code == -signal.SIGKILL, stderr[-3000:]
    assert journaled_batches(spec.checkpoint) == [0]  # killed in the first batch
    first = batch_end_offsets(spec.checkpoint, 0)
    columns = ("partition", "offset")

    def rows(topic: str, until: Offsets | None = None) -> list[tuple[Any, ...]]:
        return sorted(
            (r.partition, r.offset)
            for r in records[topic]
            if until is None or r.offset < until.get((topic, r.partition), 0)
        )

    left = {topic: stored(url, topic, columns) for topic in topics}
    committed_tables = [t for t in topics if left[t] and left[t] == rows(t, first)]
    assert all(left[t] in ([], rows(t, first)) for t in topics), "only whole parts of tables"
    assert len(committed_tables) == int(failpoint.partition(":")[2])

    rerun(spec, spark)

    for topic in topics:
        assert stored(url, topic, columns) == rows(topic), topic


@pytest.mark.parametrize("sink", ["sqlite", pytest.param("delta", marks=pytest.mark.matrix)])
def test_kill_9_while_the_store_commits_a_batch_spark_recorded_then_the_rerun_reads_it_again(
    sink, request, broker, kafka, topic_name, tmp_path, spark, caplog
):
    """An upsert whose tasks decode the records (importer/change_files.py) commits each batch
    to the store beside the next batch's tasks, after Spark recorded it as committed. Killed
    there (4 s after the store's commit began: Spark has recorded the batch), the table lacks
    a batch the checkpoint calls committed; the checkpoint's mark says why, the rerun reads
    that batch again, and the table ends as a clean run's."""
    broker.create_topic(topic_name, PARTITIONS)
    produce_profile(kafka, topic_name, explicit([RECORDS_PER_PARTITION] * PARTITIONS), keys=12)
    records = read_topic(kafka, topic_name, PARTITIONS)
    url = sink_url(sink, tmp_path, request)
    spec = small_batches(kafka, topic_name, url, tmp_path, write="upsert", value_format="raw")
    checkpoint = Path(spec.checkpoint)

    code, _, stderr = run_import_process(cli_args(spec), tmp_path, "mid-write:2:4")

    assert code == -signal.SIGKILL, stderr[-3000:]
    # Batch 1's store commit was under way, and Spark had recorded batch 1 as committed.
    assert (checkpoint / "commits" / "1").exists() and (checkpoint / "storing" / "1").exists()

    def newest_per_key(batch_records: list[Record]) -> list[tuple[Any, ...]]:
        return sorted((p, o, k) for p, o, k, *_ in clean_run(batch_records, "upsert").target)

    columns = ("partition", "offset", "key")
    held = stored(url, topic_name, columns)
    assert held == newest_per_key(in_batches(records, spec.checkpoint, 0, 1, topic_name))

    with caplog.at_level(logging.WARNING, "lagless.importer.job"):
        rerun(spec, spark)

    assert "the tables lack batch 1, which Spark had recorded as committed" in caplog.text
    assert stored(url, topic_name, columns) == newest_per_key(records)
    assert not list((checkpoint / "storing").iterdir())
