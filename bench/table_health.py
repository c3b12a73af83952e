"""A table's health under a continuous import (issue 32): files, bytes, read time and latency
over time, with lagless's maintenance between batches and without it.

Per store (Delta, Iceberg, Parquet) and workload (append, or upsert of random keys, on a table
preloaded with --keys rows), starts the embedded broker, launches `lagless import --mode
continuous` as a user launches it, and produces at a steady --rate. Every --sample-seconds it
notes the table's data files in the current version, bytes on disk against live bytes (the
import's own accounting: `StoreMaintenance.health`, what `lag --sink` shows), and pins the
table's current version (`pin`: its files hard-linked aside). Once the import has stopped, each
pinned version's full read is timed against the same rows written fresh as one table of the
same store (its compacted copy, read the same way; the median of READS reads of each, in turn;
Delta and Iceberg through polars' reader, and through their own library's beside it:
`readers`), on a quiet machine: the reads time the table, not the import's load, and do not
slow the import they measure. Produce → visible is measured by the table's ledger (what it
holds, polled every --poll-ms): a record is visible from the poll that finds its offset held.
What the table holds is deleted from the log each second (LedgerWatcher.trim), as retention
would, sooner: the embedded broker's one thread walks a partition's produce batches from its
log start for every fetch, and grew to half a core within a minute of upserts, taken from the
import (the cores it used are printed per run). How fast the machine was, before and after
each run, is printed too (`machine_ms`: a fixed task's ms; higher is slower): compare runs of
different days with it in mind.

Goals (issue 32): data files <= live bytes / target + 16; bytes on disk <= 2x live bytes plus
what the history window keeps (`_kept_for_the_window`); a full read within 1.3x of the
compacted copy's; produce → visible p99 within 2 s (as without maintenance: `--without` runs
each case again with `--maintain-every 0`, right after, on the same machine). Prints a table,
one JSON line per run and, with --png-dir, a chart per run.

    .venv/bin/python bench/table_health.py --png-dir bench/results
    small: --stores delta --workloads append --seconds 20 --keys 2000 --rate 200 --upsert-rate 200
    a young append table (its files all small): --workloads append --keys 8
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib import CliRun, cli_env, import_args, machine_ms, sink_url, thread_cpu_seconds
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.kafka.config import KafkaConfig
from lagless.sinks import Target, maintenance_of, sink_from_url
from lagless.sinks.maintenance import Health, Policy
from lagless.sinks.parquet import RETIRED

TOPIC = "health"
GOALS = {"files_over": 16, "bytes_x": 2.0, "read_x": 1.3, "p99_s": 2.0}
console = Console(stderr=True)


# --- the import: `lagless import`'s arguments, its run_import on a session made first ----------

# The CLI's own start also warms up the source's read planner beside the query's start; on this
# machine under load (load average 20+ on 2 cores) that made every CLI import fail ("Python
# worker failed to connect back"), on main as on this branch. The import here is the CLI's, its
# arguments parsed by the CLI, on a session made before it, as the test suite runs it.
RUNNER = """
import sys
from lagless import logs
from lagless.cli.import_ import spec_from_args
from lagless.cli.main import build_parser
from lagless.importer.job import run_import
from lagless.importer.spark import spark_session
logs.configure("info", sys.argv.pop(1))
args = build_parser("import").parse_args(["import", *sys.argv[1:]])
spec = spec_from_args(args)
run_import(spec, spark=spark_session(spec.master))
"""


class Launched:
    """The import's process: interrupted (SIGINT, a continuous import's usual end) at the end."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in wait()
        self.process = subprocess.Popen(
            [sys.executable, "-c", RUNNER, str(log), *args],
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
            env=cli_env(),
            start_new_session=True,
        )

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def wait(self, timeout_s: float = 180) -> CliRun:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.stderr.seek(0)
        tail = "\n".join(self.stderr.read().decode(errors="replace").strip().splitlines()[-15:])
        self.stderr.close()
        return CliRun("", [], self.process.returncode, None, 0.0, {}, tail)


# --- producing at a steady rate, each record's produce time by its offset ---------------------


class SteadyProducer(threading.Thread):
    """`rate` records/s, round-robin over the partitions; an upsert's keys drawn at random from
    `keys`. Delivery reports note each record's offset with the time it was produced."""

    def __init__(self, kafka: KafkaConfig, partitions: int, value_bytes: int, keys: int) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            kafka.producer(**{"linger.ms": 5, "compression.type": "zstd", "acks": 1})
        )
        self.partitions = partitions
        # Random hex, each record's own: values that compress as little as an id does (a
        # pool of values would let a compaction's dictionary encoding shrink the table).
        self.value_bytes = value_bytes
        self.keys = keys
        self.rate = 0.0
        self.produced = 0
        self.sent: dict[int, list[tuple[int, float]]] = {p: [] for p in range(partitions)}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.random = random.Random(7)

    def preload(self, count: int) -> None:
        """One record per key, 0..count-1, as fast as the client goes (not timed)."""
        for n in range(count):
            self._send(b"k%08d" % n, timed=False)
            if n % 10_000 == 0:
                self.producer.poll(0)
        self.producer.flush(120)

    def _send(self, key: bytes | None, timed: bool = True) -> None:
        partition = self.produced % self.partitions
        sent_at = time.time()

        def delivered(error: Any, message: Any) -> None:
            if error is None and timed:
                with self.lock:
                    self.sent[message.partition()].append((message.offset(), sent_at))

        while True:
            try:
                value = os.urandom(self.value_bytes // 2).hex().encode()
                self.producer.produce(
                    TOPIC, value=value, key=key, partition=partition, on_delivery=delivered
                )
                break
            except BufferError:
                self.producer.poll(0.05)
        self.produced += 1

    def run(self) -> None:
        owed, last = 0.0, time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            owed += self.rate * (now - last)
            last = now
            while owed >= 1:
                key = b"k%08d" % self.random.randrange(self.keys) if self.keys else None
                self._send(key)
                owed -= 1
            self.producer.poll(0)
            time.sleep(0.002)
        self.producer.flush(30)


class LedgerWatcher(threading.Thread):
    """Polls what the table holds (its ledger, as the import reads it); each produced record
    is visible from the end of the poll that finds its offset held. Each second, deletes from
    the log what the table holds (`trim`)."""

    def __init__(
        self, url: str, producer: SteadyProducer, poll_s: float, broker: EmbeddedBroker
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.producer, self.poll_s, self.broker = url, producer, poll_s, broker
        self.seen: list[tuple[float, float]] = []  # (produced at, visible at)
        self.held: dict[int, int] = {}
        self.deleted: dict[int, int] = {}
        self.last_trim = 0.0
        self.trimming = True
        self.stop = threading.Event()

    def trim(self) -> None:
        """The records the table holds deleted from the log, forward only (the mock moves a
        log's start back to an offset below it): the import never reads them again."""
        if not self.trimming or time.monotonic() - self.last_trim < 1.0:
            return
        self.last_trim = time.monotonic()
        try:
            for partition, top in self.held.items():
                if top > self.deleted.get(partition, 0):
                    self.broker.delete_records(TOPIC, partition, top)
                    self.deleted[partition] = top
        except Exception as exc:  # the case goes on, its latencies measured, with the log kept
            console.print(f"records the table holds are no longer deleted: {exc}")
            self.trimming = False

    def run(self) -> None:
        partitions = [(TOPIC, p) for p in range(self.producer.partitions)]
        target = Target(TOPIC, "append", "raw")
        while not self.stop.is_set():
            began = time.time()
            try:
                with sink_from_url(self.url) as sink:
                    held = sink.ledger(target, partitions)
            except Exception:  # the table not there yet, or replaced under the read
                held = {}
            visible = time.time()
            with self.producer.lock:
                for (_, p), top in held.items():
                    self.held[p] = top
                    waiting = self.producer.sent[p]
                    done = [sent_at for offset, sent_at in waiting if offset < top]
                    self.producer.sent[p] = [(o, t) for o, t in waiting if o >= top]
                    self.seen.extend((sent_at, visible) for sent_at in done)
            self.trim()
            time.sleep(max(0.0, self.poll_s - (time.time() - began)))


# --- samples of the table ---------------------------------------------------------------------


@dataclass
class Sample:
    at_s: float
    data_files: int
    small_files: int
    versions: int
    bytes_on_disk: int
    live_bytes: int
    window_bytes: int
    pinned: Pinned
    # Timed once the import has stopped (time_reads).
    read_s: float = 0.0
    compacted_read_s: float = 0.0
    # Delta and Iceberg: the same two reads through the store's own library (deltalake,
    # pyiceberg); the first pair is polars'.
    own_read_s: float | None = None
    own_compacted_read_s: float | None = None

    @property
    def read_x(self) -> float:
        return self.read_s / self.compacted_read_s if self.compacted_read_s else float("nan")

    @property
    def own_read_x(self) -> float | None:
        if self.own_read_s is None or not self.own_compacted_read_s:
            return None
        return self.own_read_s / self.own_compacted_read_s


# Full reads per sample and reader, of the table and of its compacted copy in turn (the median
# of each).
READS = 5


@dataclass(frozen=True)
class Pinned:
    """A sample's version of the table, kept readable until the import has stopped, so that its
    reads are timed on a quiet machine. Under the running import (2 cores, one taken by the
    import's JVM and Python), a full read of a 1M-row Iceberg upsert table took 2.05x its
    compacted copy's, where the same table read at rest took 1.0x; a Delta upsert table of one
    data file read 1.73x in the run and 0.92x at rest: the reads measured the machine's load,
    not the table. Delta and Parquet: the files the version reads, hard-linked into `folder`
    (their paths are relative), Delta's log with them, `version` the Delta version. Iceberg:
    the table's metadata and the files its snapshot reads, hard-linked into `folder` under
    their own relative paths and put back where the run removed them (its manifests name
    absolute paths), `version` the metadata file."""

    url: str
    table_folder: Path
    folder: Path
    version: int | str | None


def pin(url: str, work: Path, into: Path) -> Pinned:
    """The table's current version, its files hard-linked into `into` (links: no bytes
    copied, and maintenance's removals do not reach them)."""
    folder = table_folder(url, work)
    keep: list[Path]
    version: int | str | None = None
    if url.startswith("delta:"):
        from deltalake import DeltaTable

        delta = DeltaTable(str(folder))
        version = delta.version()
        keep = [*(folder / "_delta_log").iterdir(), *map(_local, delta.file_uris())]
    elif url.startswith("iceberg:"):
        table = _iceberg_table(work)
        version = table.metadata_location
        keep = [*(folder / "metadata").iterdir(), *_snapshot_files(table, None)]
    else:
        keep = [
            path
            for path in folder.glob("batch=*/*.parquet")
            if not path.name.startswith((".", "_"))
        ]
    for path in keep:
        kept = into / path.relative_to(folder)
        kept.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):  # a log's temporary file, gone
            os.link(path, kept)
    return Pinned(url, folder, into, version)


def _iceberg_table(work: Path) -> Any:
    catalog = _iceberg_catalog(work)
    try:
        return catalog.load_table(f"default.{TOPIC}")
    finally:
        catalog.engine.dispose()


def _snapshot_files(table: Any, snapshot_id: int | None) -> list[Path]:
    """The data and delete files an Iceberg snapshot reads (the current one: None)."""
    found = []
    for task in table.scan(snapshot_id=snapshot_id).plan_files():
        found.append(_local(task.file.file_path))
        found.extend(_local(d.file_path) for d in task.delete_files)
    return found


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def readers(url: str) -> tuple[str, ...]:
    """The readers a store's table is timed with, the first the one its goal is held to; ""
    is the store's own library (pyarrow's dataset for a Parquet folder). Delta and Iceberg:
    first polars, which reads the Parquet files itself, as an engine does (Spark and Trino
    cannot run here: no Maven), then the store's own library, which lagless does not choose:
    - pyiceberg applies position deletes by building each data file's row numbers as a Python
      range (apache/iceberg-python#1271): a 1M-row table with 10% of its rows position-deleted
      read 2.5x slower than the compacted copy, through polars 1.05x;
    - delta-rs's MERGE writes its files with Arrow's view types in their embedded schema
      (DataFusion's default), and deltalake's pyarrow dataset declares the table's plain types,
      so pyarrow casts every string and binary column as it reads: a Delta upsert table of one
      file read 1.3-1.4x its copy's through deltalake, 1.13x through polars; the file itself
      read through pyarrow's Parquet reader in 69.6 ms, the copy's in 68.6 ms."""
    if url.startswith("iceberg:"):
        return ("polars", "pyiceberg")
    return ("polars", "") if url.startswith("delta:") else ("",)


def time_reads(pinned: Pinned, scratch: Path) -> dict[str, tuple[float, float]]:
    """By reader: the median seconds of READS full reads of the pinned version and of its
    compacted copy (the same rows written fresh as one table of the store), read in turn. Each
    reader must count the rows the store's own reader found: one that lost or doubled rows
    would be fast for nothing."""
    if pinned.url.startswith("iceberg:"):
        _put_back(pinned)
    rows = _read(pinned)
    copy = write_compacted(pinned.url, rows, scratch)
    medians = {}
    for reader in readers(pinned.url):
        table: list[float] = []
        copied: list[float] = []
        while len(table) < READS:
            began = time.monotonic()
            read = _read(pinned, reader)
            table.append(time.monotonic() - began)
            if len(read) != rows.num_rows:
                raise AssertionError(
                    f"{reader} read {len(read)} rows, the store's own reader {rows.num_rows}"
                )
            began = time.monotonic()
            _read(copy, reader)
            copied.append(time.monotonic() - began)
        medians[reader] = (sorted(table)[len(table) // 2], sorted(copied)[len(copied) // 2])
    return medians


def _put_back(pinned: Pinned) -> None:
    """An Iceberg version's files, linked back where the run's maintenance removed them."""
    for kept in pinned.folder.rglob("*"):
        if kept.is_file():
            original = pinned.table_folder / kept.relative_to(pinned.folder)
            if not original.exists():
                original.parent.mkdir(parents=True, exist_ok=True)
                os.link(kept, original)


def table_folder(url: str, work: Path) -> Path:
    """Where the table's files lie (an Iceberg table in its namespace's folder)."""
    return work / "lake" / ("default" if url.startswith("iceberg:") else "") / TOPIC


def _iceberg_catalog(work: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        "lagless", uri=f"sqlite:///{work}/lake/catalog.db", warehouse=f"file://{work}/lake"
    )


def _read(pinned: Pinned, reader: str = "") -> Any:
    """The pinned version's rows, through `reader` (the store's own by default)."""
    import pyarrow.dataset as ds

    if pinned.url.startswith("delta:"):
        from deltalake import DeltaTable

        assert isinstance(pinned.version, int)
        if reader == "polars":
            import polars as pl

            return pl.read_delta(str(pinned.folder), version=pinned.version)
        return DeltaTable(str(pinned.folder), version=pinned.version).to_pyarrow_table()
    if pinned.url.startswith("iceberg:"):
        from pyiceberg.table import StaticTable

        table = StaticTable.from_metadata(str(pinned.version))
        if reader == "polars":
            import warnings

            import polars as pl

            # Its scan is planned by pyiceberg (a warning says so); the read is polars'.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return pl.scan_iceberg(table, reader_override="native").collect()
        return table.scan().to_arrow()
    return ds.dataset(pinned.folder, format="parquet", partitioning="hive").to_table()


def write_compacted(url: str, rows: Any, scratch: Path) -> Pinned:
    """The same rows written as a fresh table of the store (one file)."""
    import pyarrow.parquet as pq

    shutil.rmtree(scratch, ignore_errors=True)
    folder = scratch / "copy"
    folder.mkdir(parents=True)
    if url.startswith("delta:"):
        from deltalake import write_deltalake

        write_deltalake(str(folder), rows)
        return Pinned(url, folder, folder, 0)
    if url.startswith("iceberg:"):
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog(
            "lagless", uri=f"sqlite:///{scratch}/catalog.db", warehouse=f"file://{scratch}"
        )
        try:
            catalog.create_namespace("default")
            table = catalog.create_table("default.copy", schema=rows.schema)
            table.append(rows)
            return Pinned(url, folder, folder, table.metadata_location)
        finally:
            catalog.engine.dispose()
    # One batch folder; the rows' `batch` column was the folders' names.
    (folder / "batch=compacted").mkdir()
    pq.write_table(rows.drop_columns(["batch"]), folder / "batch=compacted" / "part-0.parquet")
    return Pinned(url, folder, folder, None)


def sample(url: str, work: Path, policy: Policy, started: float, into: Path) -> Sample | None:
    with sink_from_url(url) as sink:
        maintenance = maintenance_of(sink)
        assert maintenance is not None
        found: Health | None = maintenance.health(TOPIC, policy)
    if found is None:
        return None
    pinned = pin(url, work, into)
    window_from = time.time() - policy.keep_history_s
    kept = _kept_for_the_window(url, work, window_from)
    window = 0
    for entry in table_folder(url, work).rglob("*"):
        with contextlib.suppress(FileNotFoundError):  # removed by expiry as it is listed
            status = entry.stat()
            if entry.is_file() and (status.st_mtime >= window_from or entry in kept):
                window += status.st_size
    return Sample(
        time.time() - started,
        found.data_files,
        found.small_files,
        found.versions,
        found.bytes_on_disk,
        found.live_bytes,
        window,
        pinned,
    )


def _kept_for_the_window(url: str, work: Path, window_from: float) -> set[Path]:
    """Files written before the history window that expiry must keep: those the version of
    the window's start reads (a Delta upsert table's whole previous copy), and a Parquet
    table's folders merged away within the window. Files written within it count by their
    time; without this, the window's bytes missed the one copy of the table each version in
    it may still read, and a Delta upsert table's bytes came out at 1.03 of the goal."""
    folder = table_folder(url, work)
    if url.startswith("delta:"):
        from deltalake import DeltaTable

        # A table younger than the window loads its first version, whose files are in it.
        delta = DeltaTable(str(folder))
        delta.load_as_version(datetime.fromtimestamp(window_from, tz=UTC))
        return set(map(_local, delta.file_uris()))
    if url.startswith("iceberg:"):
        table = _iceberg_table(work)
        then = table.snapshot_as_of_timestamp(int(window_from * 1000))
        return set() if then is None else set(_snapshot_files(table, then.snapshot_id))
    return {
        path
        for retired in folder.glob(f"{RETIRED}*")
        if int(retired.name[len(RETIRED) :].split(".", 1)[0]) >= window_from * 1000
        for path in retired.rglob("*")
    }


def time_samples(samples: list[Sample], scratch: Path) -> None:
    """Each sample's reads, timed on the pinned version now that the import has stopped."""
    os.sync()  # the run's writes, gigabytes for a Delta upsert, not written back under the reads
    for done, found in enumerate(samples):
        with console.status(f"timing the reads of sample {done + 1} of {len(samples)}"):
            timed = time_reads(found.pinned, scratch)
        first, *own = readers(found.pinned.url)
        found.read_s, found.compacted_read_s = timed[first]
        found.own_read_s, found.own_compacted_read_s = timed[own[0]] if own else (None, None)


# --- one run ----------------------------------------------------------------------------------


@dataclass
class Run:
    store: str
    workload: str
    maintain_every_s: float
    samples: list[Sample] = field(default_factory=list)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (at, latency)
    exit_code: int | None = None
    stderr_tail: str = ""
    # The seconds of each maintenance round the import logged.
    rounds: list[float] = field(default_factory=list)
    # Of a core, over the steady import: the embedded broker's thread (in this process).
    broker_cores: float | None = None

    @property
    def name(self) -> str:
        every = f"every {self.maintain_every_s:g} s" if self.maintain_every_s else "none"
        return f"{self.store} {self.workload}, maintenance {every}"

    def report(self, policy: Policy, settle_s: float) -> dict[str, Any]:
        steady = sorted(lat for at, lat in self.latencies if at >= settle_s)
        last = self.samples[-1] if self.samples else None
        later = [s for s in self.samples if s.at_s >= settle_s]
        return {
            "store": self.store,
            "workload": self.workload,
            "maintain_every_s": self.maintain_every_s,
            "target_file_size": policy.target_file_size,
            "keep_history_s": policy.keep_history_s,
            "p50_s": _percentile(steady, 0.5),
            "p99_s": _percentile(steady, 0.99),
            "visible": len(steady),
            "most_files": max((s.data_files for s in later), default=None),
            "last": None
            if last is None
            else {k: v for k, v in last.__dict__.items() if k != "pinned"}
            | {"read_x": round(last.read_x, 2)},
            "worst_read_x": round(max((s.read_x for s in later), default=float("nan")), 2),
            "worst_own_read_x": max(
                (round(x, 2) for s in later if (x := s.own_read_x) is not None),
                default=None,
            ),
            "reads_ms": [
                (
                    round(s.at_s),
                    round(s.read_s * 1000),
                    round(s.compacted_read_s * 1000),
                    s.data_files,
                )
                for s in self.samples
            ],
            "worst_bytes_over_goal": max(
                (s.bytes_on_disk / (2 * s.live_bytes + s.window_bytes) for s in later),
                default=None,
            ),
            "maintenance_rounds": len(self.rounds),
            "maintenance_s": round(sum(self.rounds), 1),
            "longest_round_s": max(self.rounds, default=0.0),
            "broker_cores": self.broker_cores,
            "exit_code": self.exit_code,
            "load": [round(x, 2) for x in os.getloadavg()],
        }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, round(q * (len(values) - 1)))], 3)


def run_case(args: argparse.Namespace, store: str, workload: str, every_s: float) -> Run:
    work = Path(tempfile.mkdtemp(prefix=f"lagless-health-{store}-"))
    run = Run(store, workload, every_s)
    policy = Policy(args.target_file_size, args.keep_history)
    launched: Launched | None = None
    try:
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            kafka = KafkaConfig(broker.bootstrap)
            url = sink_url(store, work)
            upsert = workload == "upsert"
            producer = SteadyProducer(
                kafka, args.partitions, args.record_bytes, args.keys if upsert else 0
            )
            # Both start with a table of --keys rows (in a day of appends, the new small files
            # are a tail beside a large compacted body).
            preload = args.keys
            with console.status(f"producing {preload:,} records to preload"):
                producer.preload(preload)
            extra = [
                *("--trigger-seconds", str(args.trigger_seconds)),
                *("--maintain-every", str(every_s)),
                *("--keep-history", str(args.keep_history)),
                *("--target-file-size", str(args.target_file_size)),
                *(["--write", "upsert"] if upsert else []),
            ]
            launched = Launched(
                import_args(
                    broker.bootstrap, TOPIC, url, work / "ckpt", "continuous", args, *extra
                ),
                work / "import.log",
            )
            watcher = LedgerWatcher(url, producer, args.poll_ms / 1000, broker)
            watcher.start()
            _wait_for_preload(launched, watcher, producer, preload)
            producer.rate = args.upsert_rate if upsert else args.rate
            producer.start()
            started = time.time()
            broker_cpu = thread_cpu_seconds(os.getpid(), "rdk:mock")
            next_sample = started
            with console.status(run.name) as status:
                while time.time() - started < args.seconds:
                    if launched.process.poll() is not None:
                        break
                    if time.time() >= next_sample:
                        into = work / "pinned" / str(len(run.samples))
                        found = sample(url, work, policy, started, into)
                        if found is not None:
                            run.samples.append(found)
                            status.update(
                                f"{run.name}: {found.data_files} files, "
                                f"{found.bytes_on_disk / 1e6:.1f} MB on disk"
                            )
                        next_sample += args.sample_seconds
                    time.sleep(0.2)
            broker_cpu = thread_cpu_seconds(os.getpid(), "rdk:mock") - broker_cpu
            run.broker_cores = round(broker_cpu / (time.time() - started), 2)
            producer.stop.set()
            producer.join(timeout=60)
            time.sleep(3)  # the last batches
            watcher.stop.set()
            watcher.join(timeout=10)
            run.latencies = [(p - started, v - p) for p, v in watcher.seen if p >= started]
            if launched.process.poll() is None:
                launched.interrupt()
            result = launched.wait(timeout_s=180)
            run.exit_code, run.stderr_tail = result.returncode, result.stderr_tail
            run.rounds = maintenance_rounds(work / "import.log")
            time_samples(run.samples, work / "scratch")
            if args.png_dir:  # beside the chart: each batch's and round's line
                suffix = "" if every_s else "-without"
                args.png_dir.mkdir(parents=True, exist_ok=True)
                log_copy = args.png_dir / f"table_health-{store}-{workload}{suffix}.log"
                shutil.copy(work / "import.log", log_copy)
    finally:
        if launched is not None and launched.process.poll() is None:
            os.killpg(launched.process.pid, signal.SIGKILL)  # the bench itself failed
            launched.process.wait()
        shutil.rmtree(work, ignore_errors=True)
    return run


def maintenance_rounds(log: Path) -> list[float]:
    """The seconds of each table's round, from the import's log lines (`... in 0.31 s`)."""
    if not log.exists():
        return []
    return [
        float(line.rsplit(" in ", 1)[1].split()[0])
        for line in log.read_text().splitlines()
        if "maintenance: " in line and line.rstrip().endswith(" s")
    ]


def _wait_for_preload(
    launched: Launched, watcher: LedgerWatcher, producer: SteadyProducer, keys: int
) -> None:
    """Until the table holds the preloaded records."""
    per_partition = keys // producer.partitions
    with console.status("waiting for the import's first rows") as status:
        while True:
            if launched.process.poll() is not None:
                raise SystemExit(f"the import exited {launched.wait().stderr_tail}")
            held = sum(watcher.held.values())
            # Every partition: a preload of 1M records commits in batches of a few partitions
            # each, and a steady rate started after the first would measure the catch-up.
            if len(watcher.held) == producer.partitions and all(
                v >= per_partition for v in watcher.held.values()
            ):
                return
            status.update(f"the table holds {held:,} of {keys:,} preloaded records")
            time.sleep(0.5)


# --- output -----------------------------------------------------------------------------------


def draw(path: Path, run: Run, policy: Policy) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(11, 7), dpi=90)
    at = [s.at_s for s in run.samples]
    files, bytes_, read, lat = axes[0][0], axes[0][1], axes[1][0], axes[1][1]
    files.plot(at, [s.data_files for s in run.samples], label="data files")
    files.plot(
        at,
        [s.live_bytes / policy.target_file_size + GOALS["files_over"] for s in run.samples],
        ls="--",
        label="goal: live / target + 16",
    )
    files.set_title("data files in the current version")
    bytes_.plot(at, [s.bytes_on_disk / 1e6 for s in run.samples], label="on disk")
    bytes_.plot(at, [s.live_bytes / 1e6 for s in run.samples], label="live")
    bytes_.plot(
        at,
        [(2 * s.live_bytes + s.window_bytes) / 1e6 for s in run.samples],
        ls="--",
        label="goal: 2x live + window",
    )
    bytes_.set_title("MB")
    first, *own = readers(run.samples[0].pinned.url) if run.samples else ("",)
    read.plot(
        at,
        [s.read_x for s in run.samples],
        label=f"full read{' through polars' if first else ''} / compacted copy's",
    )
    if own:
        read.plot(
            at,
            [s.own_read_x for s in run.samples],
            ls=":",
            label=f"the same through {'deltalake' if run.store == 'delta' else 'pyiceberg'}",
        )
    read.axhline(GOALS["read_x"], ls="--", color="C1", label="goal 1.3x")
    read.set_title("full read time, x the compacted copy's")
    per_second: dict[int, list[float]] = {}
    for when, latency in run.latencies:
        per_second.setdefault(int(when), []).append(latency)
    seconds = sorted(per_second)
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        lat.plot(seconds, [_percentile(sorted(per_second[s]), q) for s in seconds], label=name)
    lat.axhline(GOALS["p99_s"], ls="--", color="C2", label="goal p99 2 s")
    lat.set_title("produce → visible, s (per second produced)")
    for axis in (files, bytes_, read, lat):
        axis.set_xlabel("seconds of steady import")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle(f"lagless → {run.name}")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def show(reports: list[dict[str, Any]]) -> None:
    table = Table(title="table health under a continuous import (goals: issue 32)")
    columns = (
        "case",
        "maintenance",
        "rounds, s",
        "most files",
        "on disk / goal",
        "read x",
        "own reader's",
        "p50 s",
        "p99 s",
        "broker cores",
        "machine ms",
    )
    for name in columns:
        table.add_column(name, justify="left" if name == "case" else "right")
    for r in reports:
        over = r["worst_bytes_over_goal"]
        table.add_row(
            f"{r['store']} {r['workload']}",
            f"every {r['maintain_every_s']:g} s" if r["maintain_every_s"] else "none",
            f"{r['maintenance_rounds']}, {r['maintenance_s']:g}",
            str(r["most_files"]),
            "-" if over is None else f"{over:.2f}",
            f"{r['worst_read_x']:.2f}",
            "-" if r["worst_own_read_x"] is None else f"{r['worst_own_read_x']:.2f}",
            str(r["p50_s"]),
            str(r["p99_s"]),
            str(r["broker_cores"]),
            "{:g}, {:g}".format(*r["machine_ms"]),
        )
    Console(width=max(Console().width, 125)).print(table)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", nargs="+", default=["delta", "iceberg", "parquet"])
    parser.add_argument("--workloads", nargs="+", default=["append", "upsert"])
    parser.add_argument("--seconds", type=float, default=180.0, help="steady import, per case")
    parser.add_argument("--rate", type=float, default=2000.0, help="appends/s (2000)")
    parser.add_argument("--upsert-rate", type=float, default=3000.0, help="upserts/s (3000)")
    parser.add_argument("--keys", type=int, default=1_000_000, help="the first rows (upsert: keys)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--record-bytes", type=int, default=24)
    parser.add_argument("--trigger-seconds", type=float, default=0.5)
    parser.add_argument("--maintain-every", type=float, default=10.0)
    parser.add_argument("--keep-history", type=float, default=60.0)
    parser.add_argument("--target-file-size", type=int, default=128 * 1024 * 1024)
    parser.add_argument("--sample-seconds", type=float, default=15.0)
    parser.add_argument("--settle-seconds", type=float, default=10.0, help="not in p50/p99")
    parser.add_argument("--poll-ms", type=float, default=100.0)
    parser.add_argument("--without", action="store_true", help="each case without maintenance too")
    parser.add_argument("--master", help="lagless import --master")
    parser.add_argument("--import-option", action="append", default=[], metavar="ARG")
    parser.add_argument("--png-dir", type=Path, help="a chart per case here")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    policy = Policy(args.target_file_size, args.keep_history)
    console.print(f"load before: {[round(x, 2) for x in os.getloadavg()]}")
    reports = []
    failed = False
    for store in args.stores:
        for workload in args.workloads:
            if store == "parquet" and workload == "upsert":
                continue  # Parquet folders take appends only
            for every in (args.maintain_every, 0.0) if args.without else (args.maintain_every,):
                speed_before = machine_ms()
                run = run_case(args, store, workload, every)
                report = run.report(policy, args.settle_seconds)
                report["machine_ms"] = [speed_before, machine_ms()]
                reports.append(report)
                print(json.dumps(report), flush=True)
                if run.exit_code != 0:
                    failed = True
                    console.print(f"[red]{run.name}: exit {run.exit_code}[/]\n{run.stderr_tail}")
                if args.png_dir and run.samples:
                    args.png_dir.mkdir(parents=True, exist_ok=True)
                    suffix = "" if every else "-without"
                    png = args.png_dir / f"table_health-{store}-{workload}{suffix}.png"
                    draw(png, run, policy)
                    console.print(f"wrote {png}")
    show(reports)
    console.print(f"load after: {[round(x, 2) for x in os.getloadavg()]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
