"""A table's health under a continuous import (issue 32): files, bytes, read time and latency
over time, with lagless's maintenance between batches and without it.

Per store (Delta, Iceberg, Parquet) and workload (append; upsert of random keys on a table
preloaded with --keys rows), starts the embedded broker, launches `lagless import --mode
continuous` as a user launches it, and produces at a steady --rate. Every --sample-seconds it
notes the table's data files in the current version, bytes on disk against live bytes (the
import's own accounting: `StoreMaintenance.health`, what `lag --sink` shows), and the time of a
full read against the same rows written fresh as one table of the same store (its compacted
copy, read the same way; the median of up to READS reads of each, in turn, by a process at the
lowest CPU priority, so that the instrument does not slow the import it measures; an Iceberg
table through polars' native reader, and through pyiceberg's beside it: `readers`). Produce →
visible is measured by the table's ledger (what it holds, polled every --poll-ms): a record is
visible from the poll that finds its offset held. What the table holds is deleted from the log each
second (LedgerWatcher.trim), as retention would, sooner: the embedded broker's one thread walks a
partition's produce batches from its log start for every fetch, and grew to half a core within
a minute of upserts, taken from the import (the cores it used are printed per run).

Goals (issue 32): data files <= live bytes / target + 16; bytes on disk <= 2x live bytes plus
the files written within the history window; a full read within 1.3x of the compacted copy's;
produce → visible p99 within 2 s (as without maintenance: `--without` runs each case again with
`--maintain-every 0`, right after, on the same machine). Prints a table, one JSON line per run
and, with --png-dir, a chart per run.

    .venv/bin/python bench/table_health.py --png-dir bench/results
    small: --stores delta --workloads append --seconds 20 --keys 2000 --rate 200 --upsert-rate 200
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
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
from pathlib import Path
from typing import Any

from benchlib import CliRun, cli_env, import_args, sink_url, thread_cpu_seconds
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.kafka.config import KafkaConfig
from lagless.sinks import Target, sink_from_url
from lagless.sinks.maintenance import Health, Policy

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
    read_s: float
    compacted_read_s: float
    # Iceberg: the same two reads through pyiceberg's own reader (the first pair is polars').
    pyiceberg_read_s: float | None = None
    pyiceberg_compacted_read_s: float | None = None

    @property
    def read_x(self) -> float:
        return self.read_s / self.compacted_read_s if self.compacted_read_s else float("nan")

    @property
    def pyiceberg_read_x(self) -> float | None:
        if self.pyiceberg_read_s is None or not self.pyiceberg_compacted_read_s:
            return None
        return self.pyiceberg_read_s / self.pyiceberg_compacted_read_s


# Full reads per sample, of the table and of its compacted copy in turn: a read of a few-MB table
# takes tens of ms, and one alone varied several-fold with the import running beside it; reads
# this long or longer vary less, and are read fewer times.
READS = 5
LONG_READ_S = 0.1
LONG_READS = 3


def readers(url: str) -> tuple[str, ...]:
    """The readers a store's table is timed with, the first the one its goal is held to.
    Iceberg: polars' native reader, which applies position deletes as an engine does (Spark and
    Trino cannot run here: no Maven), then pyiceberg's own, which builds each data file's row
    numbers as a Python range to apply them (apache/iceberg-python#1271): it read a 1M-row
    table with 10% of its rows position-deleted 2.5x slower than the compacted copy, where
    polars read it 1.05x."""
    return ("polars", "pyiceberg") if url.startswith("iceberg:") else ("",)


def read_table(
    url: str, table: str, work: Path, reader: str = "", snapshot: int | None = None
) -> tuple[Any, float]:
    """The whole table through `reader` (its store's own by default; an Iceberg table at
    `snapshot`, else its current one), and the seconds it took."""
    began = time.monotonic()
    rows = _read(url, table, work, reader, snapshot)
    return rows, time.monotonic() - began


def read_both(url: str, work: Path) -> dict[str, tuple[float, float]]:
    """By reader: the median seconds of READS full reads of the table and of its compacted
    copy (the same rows written fresh as one table of the store), read in turn; LONG_READS of
    each when the table's first read took LONG_READ_S or longer. Iceberg's readers read the
    snapshot the copy holds, and each must count its rows: one that lost or doubled rows would
    be fast for nothing (Delta and Parquet, one reader each, are read as they grow)."""
    snapshot = _current_snapshot(work) if url.startswith("iceberg:") else None
    rows, _ = read_table(url, TOPIC, work, snapshot=snapshot)
    scratch = work / "scratch"
    write_compacted(url, rows, scratch)
    medians = {}
    for reader in readers(url):
        table: list[float] = []
        copy: list[float] = []
        while len(table) < (READS if not table or table[0] < LONG_READ_S else LONG_READS):
            read, seconds = read_table(url, TOPIC, work, reader, snapshot)
            if snapshot is not None and len(read) != rows.num_rows:
                raise AssertionError(
                    f"{reader} read {len(read)} rows, the store's own reader {rows.num_rows}"
                )
            table.append(seconds)
            copy.append(read_table(url, "copy", scratch, reader)[1])
        medians[reader] = (sorted(table)[len(table) // 2], sorted(copy)[len(copy) // 2])
    return medians


class Reads:
    """read_both in a process of its own at the lowest CPU priority: the reads are the bench's
    instrument, not its workload (a 1M-row table's reads and its compacted copy's write take
    ~2 s of a core per sample, on the import's machine), so they take only what the import
    leaves; the table and its copy, read in turn, share that alike."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.pool = context.Pool(1, initializer=os.nice, initargs=(19,))

    def both(self, url: str, work: Path) -> dict[str, tuple[float, float]]:
        return self.pool.apply(read_both, (url, work))

    def close(self) -> None:
        self.pool.terminate()
        self.pool.join()


def table_folder(url: str, work: Path) -> Path:
    """Where the table's files lie (an Iceberg table in its namespace's folder)."""
    return work / "lake" / ("default" if url.startswith("iceberg:") else "") / TOPIC


def _iceberg_catalog(work: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        "lagless", uri=f"sqlite:///{work}/lake/catalog.db", warehouse=f"file://{work}/lake"
    )


def _current_snapshot(work: Path) -> int | None:
    catalog = _iceberg_catalog(work)
    try:
        current = catalog.load_table(f"default.{TOPIC}").current_snapshot()
        return None if current is None else current.snapshot_id
    finally:
        catalog.engine.dispose()


def _read(url: str, table: str, work: Path, reader: str = "", snapshot: int | None = None) -> Any:
    import pyarrow.dataset as ds

    folder = str(work / "lake" / table)
    if url.startswith("delta:"):
        from deltalake import DeltaTable

        return DeltaTable(folder).to_pyarrow_table()
    if url.startswith("iceberg:"):
        catalog = _iceberg_catalog(work)
        try:
            found = catalog.load_table(f"default.{table}")
            if reader == "polars":
                import warnings

                import polars as pl

                # Its scan is planned by pyiceberg (a warning says so); the read is polars'.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    scan = pl.scan_iceberg(found, snapshot_id=snapshot, reader_override="native")
                    return scan.collect()
            return found.scan(snapshot_id=snapshot).to_arrow()
        finally:
            catalog.engine.dispose()
    return ds.dataset(folder, format="parquet", partitioning="hive").to_table()


def write_compacted(url: str, rows: Any, scratch: Path) -> None:
    """The same rows written as a fresh table of the store (one file)."""
    import pyarrow.parquet as pq

    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    if url.startswith("delta:"):
        from deltalake import write_deltalake

        write_deltalake(str(scratch / "lake" / "copy"), rows)
    elif url.startswith("iceberg:"):
        from pyiceberg.catalog.sql import SqlCatalog

        (scratch / "lake").mkdir()
        catalog = SqlCatalog(
            "lagless",
            uri=f"sqlite:///{scratch}/lake/catalog.db",
            warehouse=f"file://{scratch}/lake",
        )
        catalog.create_namespace("default")
        catalog.create_table("default.copy", schema=rows.schema).append(rows)
        catalog.engine.dispose()
    else:  # one batch folder; the rows' `batch` column was the folders' names
        folder = scratch / "lake" / "copy" / "batch=compacted"
        folder.mkdir(parents=True)
        pq.write_table(rows.drop_columns(["batch"]), folder / "part-0.parquet")


def sample(url: str, work: Path, policy: Policy, started: float, reads: Reads) -> Sample | None:
    with sink_from_url(url) as sink:
        maintenance = sink.maintenance()
        assert maintenance is not None
        found: Health | None = maintenance.health(TOPIC, policy)
    if found is None:
        return None
    timed = reads.both(url, work)
    read_s, compacted_read_s = timed[readers(url)[0]]
    pyiceberg_read_s, pyiceberg_compacted_read_s = timed.get("pyiceberg", (None, None))
    window_from = time.time() - policy.keep_history_s
    window = sum(
        entry.stat().st_size
        for entry in table_folder(url, work).rglob("*")
        if entry.is_file() and entry.stat().st_mtime >= window_from
    )
    return Sample(
        time.time() - started,
        found.data_files,
        found.small_files,
        found.versions,
        found.bytes_on_disk,
        found.live_bytes,
        window,
        read_s,
        compacted_read_s,
        pyiceberg_read_s,
        pyiceberg_compacted_read_s,
    )


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
            "last": None if last is None else last.__dict__ | {"read_x": round(last.read_x, 2)},
            "worst_read_x": round(max((s.read_x for s in later), default=float("nan")), 2),
            "worst_pyiceberg_read_x": max(
                (round(x, 2) for s in later if (x := s.pyiceberg_read_x) is not None),
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
    reads = Reads()
    try:
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            kafka = KafkaConfig(broker.bootstrap)
            url = sink_url(store, work)
            upsert = workload == "upsert"
            producer = SteadyProducer(
                kafka, args.partitions, args.record_bytes, args.keys if upsert else 0
            )
            # An upsert's table starts with --keys rows; an append's with a record per
            # partition, so that the steady rate starts once the import runs.
            preload = args.keys if upsert else args.partitions
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
                        found = sample(url, work, policy, started, reads)
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
            if args.png_dir:  # beside the chart: each batch's and round's line
                suffix = "" if every_s else "-without"
                args.png_dir.mkdir(parents=True, exist_ok=True)
                log_copy = args.png_dir / f"table_health-{store}-{workload}{suffix}.log"
                shutil.copy(work / "import.log", log_copy)
    finally:
        reads.close()
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
    read.plot(at, [s.read_x for s in run.samples], label="full read / compacted copy's")
    if run.store == "iceberg":
        read.plot(
            at,
            [s.pyiceberg_read_x for s in run.samples],
            ls=":",
            label="the same through pyiceberg's reader",
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
        "p50 s",
        "p99 s",
        "broker cores",
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
            str(r["p50_s"]),
            str(r["p99_s"]),
            str(r["broker_cores"]),
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
    parser.add_argument("--keys", type=int, default=1_000_000, help="upsert: the table's rows")
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
                run = run_case(args, store, workload, every)
                report = run.report(policy, args.settle_seconds)
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
