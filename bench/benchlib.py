"""What the benchmarks share: the client's speed (plain consumers, kcat), launching the
`lagless` CLI and watching its sink, and reading processes' memory from /proc.

Not a benchmark itself; the scripts beside it import it (they run from this folder).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
CONSUME_BATCH = 10_000
POLL_S = 0.05


# --- the client's speed: plain confluent-kafka consumers, one OS process each ---------------


@dataclass
class Baseline:
    """Records read by `processes` plain consumers between the go signal and the last one's
    end (their process start-up and connection are excluded; `launch_s` includes them)."""

    name: str
    records: int
    bytes: int
    seconds: float
    launch_s: float

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_second(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


def _plain_consumer(
    bootstrap: str, topic: str, partitions: list[int], results: Any, go: Any, tuned: bool
) -> None:
    """Assigned `partitions` from their start, read to their end offsets, touching every
    record's key and value; report (records, bytes, started, finished) in wall-clock time.
    Plain: librdkafka's default settings, as a user's consumer has them; tuned: lagless's
    reader settings (deeper prefetch, short backoff), which read several times faster."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from lagless.kafka.config import KafkaConfig

    settings = (
        KafkaConfig(bootstrap).reader()
        if tuned
        else {
            "bootstrap.servers": bootstrap,
            "group.id": "lagless-bench-plain",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer = Consumer(settings)
    try:
        marks = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in partitions
        }
        remaining = {p for p, (low, high) in marks.items() if high > low}
        results.put(("ready",))
        go.wait()
        started = time.time()
        consumer.assign([TopicPartition(topic, p, marks[p][0]) for p in remaining])
        records = size = 0
        while remaining:
            for message in consumer.consume(CONSUME_BATCH, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(error.str())
                    continue
                key, value = message.key(), message.value()
                size += (len(key) if key else 0) + (len(value) if value else 0)
                records += 1
                if (message.offset() or 0) + 1 >= marks[message.partition() or 0][1]:
                    remaining.discard(message.partition() or 0)
        results.put(("done", records, size, started, time.time()))
    finally:
        consumer.close()


def plain_consumers(
    bootstrap: str, topic: str, partitions: int, processes: int = 2, *, tuned: bool = False
) -> Baseline:
    """`processes` consumers in separate OS processes, partition p read by process p % N."""
    launched = time.time()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    go = context.Event()
    workers = [
        context.Process(
            target=_plain_consumer,
            args=(bootstrap, topic, list(range(i, partitions, processes)), results, go, tuned),
            daemon=True,
        )
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            _get(results, workers)
        began = time.time()
        go.set()
        done = [_get(results, workers) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()
    finished = max(d[4] for d in done)
    return Baseline(
        f"{'tuned' if tuned else 'plain'} consumers, {processes} processes",
        sum(d[1] for d in done),
        sum(d[2] for d in done),
        finished - began,
        finished - launched,
    )


def _get(results: Any, workers: Sequence[Any], timeout_s: float = 600) -> tuple[Any, ...]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            return results.get(timeout=0.5)
        except queue.Empty:
            if any(w.exitcode not in (None, 0) for w in workers):
                raise RuntimeError("a baseline consumer process failed") from None
    raise RuntimeError("baseline consumers did not finish")


def kcat(bootstrap: str, topic: str, value_bytes: int = 0) -> Baseline | None:
    """kcat reading the whole topic to its end; None if not installed. It prints one byte per
    record (counted here without parsing, so this process is never the bottleneck); its bytes
    are taken as `value_bytes`, what was produced."""
    binary = shutil.which("kcat") or shutil.which("kafkacat")
    if binary is None:
        return None
    command = [binary, "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q"]
    started = time.time()
    process = subprocess.Popen([*command, "-f", "."], stdout=subprocess.PIPE)
    assert process.stdout is not None
    records = 0
    while chunk := process.stdout.read(1 << 20):
        records += len(chunk)
    code = process.wait()
    seconds = time.time() - started
    if code != 0:
        raise RuntimeError(f"kcat exited {code}")
    return Baseline("kcat (1 process)", records, value_bytes, seconds, seconds)


# --- sinks: is a row there yet? --------------------------------------------------------------


def sink_url(kind: str, work: Path, postgres_url: str | None = None, s3: Any | None = None) -> str:
    if kind.endswith("+s3"):
        if s3 is None:
            raise ValueError(f"{kind} needs an S3 server")
        store = kind.removesuffix("+s3")
        catalog = f"?catalog={work}/catalog.db" if store == "iceberg" else ""
        return f"{s3.url(store, f'{work.parent.name}/{work.name}')}{catalog}"
    if kind == "sqlite":
        return f"sqlite:///{work}/bench.db"
    if kind in ("parquet", "delta", "iceberg"):
        return f"{kind}:///{work}/lake"
    if kind in ("postgresql", "postgresql-driver"):
        if not postgres_url:
            raise ValueError("postgresql needs a URL")
        # The sink's rows through the driver, as one Arrow table a batch (the former default).
        return postgres_url + ("?write_from=driver" if kind == "postgresql-driver" else "")
    raise ValueError(kind)


def sink_path(url: str) -> str:
    return url.split(":///", 1)[1]


def has_rows(url: str, table: str) -> Callable[[], bool]:
    """A probe answering whether `table` of the sink at `url` has a committed row."""
    if "+s3://" in url:
        return _s3_probe(url, table)
    if url.startswith("sqlite:"):
        path = sink_path(url)

        def sqlite_probe() -> bool:
            if not os.path.exists(path):
                return False
            try:
                # Read-only: the probe must not create the file before lagless does.
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as conn:
                    return conn.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone() is not None
            except sqlite3.OperationalError:
                return False

        return sqlite_probe
    if url.startswith("parquet:"):
        folder = os.path.join(sink_path(url), table)

        def parquet_probe() -> bool:
            for _, dirs, files in os.walk(folder):
                dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]  # _temporary
                if any(f.endswith(".parquet") for f in files):
                    return True
            return False

        return parquet_probe
    if url.startswith("delta:"):
        return _delta_probe(os.path.join(sink_path(url), table))
    if url.startswith("iceberg:"):
        return _iceberg_probe(sink_path(url), table)
    return _postgres_probe(url.split("?", 1)[0], table)


def _s3_probe(url: str, table: str) -> Callable[[], bool]:
    """On the S3 server whose AWS variables are set (s3_server): a committed Parquet batch
    (its `_ranges.json`), a Delta table with files, an Iceberg snapshot with records."""
    sys.path.insert(0, str(ROOT))
    from tests.harness.s3 import committed_parquet_files, reader_filesystem, reader_options

    store, _, place = url.partition("+s3://")
    root, _, query = place.partition("?")
    if store == "parquet":
        filesystem = reader_filesystem()
        return lambda: bool(committed_parquet_files(filesystem, f"{root}/{table}"))
    if store == "delta":
        return _delta_probe(f"s3://{root}/{table}", reader_options())
    options = reader_options()
    io = {
        "s3.endpoint": options["endpoint"],
        "s3.access-key-id": options["access_key_id"],
        "s3.secret-access-key": options["secret_access_key"],
        "s3.region": options["region"],
    }
    catalog = query.removeprefix("catalog=")
    return _iceberg_probe(f"s3://{root}", table, catalog, io)


def s3_server() -> tuple[Any, Callable[[], None]]:
    """A throwaway S3 server (SeaweedFS, tests/harness/s3.py), its AWS variables set in this
    process's environment, which the imports launched inherit: (server, stop)."""
    sys.path.insert(0, str(ROOT))
    from tests.harness.s3 import SeaweedS3

    server = SeaweedS3.start_new()
    os.environ.update(server.env())
    return server, server.destroy


def _delta_probe(path: str, options: dict[str, str] | None = None) -> Callable[[], bool]:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    def delta_probe() -> bool:
        try:
            return bool(DeltaTable(path, storage_options=options).file_uris())
        except TableNotFoundError:
            return False

    return delta_probe


def _iceberg_probe(
    warehouse: str, table: str, catalog: str | None = None, io: dict[str, str] | None = None
) -> Callable[[], bool]:
    """A snapshot holding records, read through the warehouse's catalog once lagless made it."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    opened: list[SqlCatalog] = []
    catalog_file = catalog or os.path.join(warehouse, "catalog.db")
    location = warehouse if catalog else f"file://{warehouse}"

    def iceberg_probe() -> bool:
        if not opened:
            if not os.path.exists(catalog_file):
                return False  # opening it would create it before lagless does
            opened.append(
                SqlCatalog(
                    "lagless",
                    uri=f"sqlite:///{catalog_file}",
                    warehouse=location,
                    init_catalog_tables="false",
                    **(io or {}),
                )
            )
        try:
            snapshot = opened[0].load_table(f"default.{table}").current_snapshot()
        except NoSuchTableError:
            return False
        except Exception:  # the catalog's tables not made yet, or the file locked a moment
            return False
        summary = snapshot.summary if snapshot is not None else None
        return summary is not None and int(summary.get("total-records", "0")) > 0

    return iceberg_probe


def _postgres_probe(url: str, table: str) -> Callable[[], bool]:
    import psycopg

    conn: list[Any] = []

    def probe() -> bool:
        try:
            if not conn:
                conn.append(psycopg.connect(url, autocommit=True, connect_timeout=2))
            row = conn[0].execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone()
            return row is not None
        except psycopg.errors.UndefinedTable:
            return False
        except psycopg.OperationalError:
            conn.clear()
            return False

    return probe


# --- the lagless CLI as users launch it ---------------------------------------------------------


def import_args(
    bootstrap: str, topic: str, url: str, checkpoint: Path, mode: str, args: Any, *extra: str
) -> list[str]:
    """`lagless import` arguments as the benches launch it: --json, then --master and every
    --import-option the bench was given (args.master, args.import_option)."""
    return [
        *("--bootstrap", bootstrap, "--topic", topic, "--sink", url),
        *("--checkpoint", str(checkpoint), "--mode", mode, *extra, "--json"),
        *(["--master", args.master] if args.master else []),
        *args.import_option,
    ]


def lagless_command() -> list[str]:
    script = Path(sys.executable).parent / "lagless"
    return [str(script)] if script.exists() else [sys.executable, "-m", "lagless"]


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return env


@dataclass
class CliRun:
    """One `lagless import` process: seconds from launch to its first visible row and to exit."""

    sink: str
    command: list[str]
    returncode: int
    first_row_s: float | None
    exit_s: float
    summary: dict[str, Any] = field(default_factory=dict)
    stderr_tail: str = ""

    @property
    def records(self) -> int:
        return int(self.summary.get("records", 0))

    @property
    def query_s(self) -> float:
        return float(self.summary.get("seconds", 0.0))

    def per_second_of_query(self) -> float:
        return self.records / self.query_s if self.query_s > 0 else 0.0

    def per_second_of_launch(self) -> float:
        return self.records / self.exit_s if self.exit_s > 0 else 0.0


class Launched:
    """A `lagless import` subprocess whose sink a thread probes until the first row shows."""

    def __init__(
        self,
        args: Sequence[str],
        sink: str,
        url: str,
        table: str,
        poll_s: float = POLL_S,
        probe: bool = True,
    ) -> None:
        self.command = [*lagless_command(), "import", *args]
        self.sink = sink
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in wait()
        self.launched = time.time()
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=cli_env(),
            start_new_session=True,  # a Ctrl-C in the terminal reaches the bench, not it
        )
        self.first_row_at: float | None = None
        self._probe = has_rows(url, table)
        self._poll_s = poll_s
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        if probe:
            self._watcher.start()

    def _watch(self) -> None:
        while self.first_row_at is None:
            if self._probe():
                self.first_row_at = time.time()
                return
            if self.process.poll() is not None:
                return
            time.sleep(self._poll_s)

    @property
    def elapsed(self) -> float:
        return time.time() - self.launched

    @property
    def first_row_s(self) -> float | None:
        return None if self.first_row_at is None else self.first_row_at - self.launched

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def wait(
        self, on_tick: Callable[[Launched], None] | None = None, timeout_s: float = 3600
    ) -> CliRun:
        deadline = time.time() + timeout_s
        while self.process.poll() is None:
            if time.time() > deadline:
                self.process.kill()
                break
            if on_tick:
                on_tick(self)
            time.sleep(0.1)
        exited = time.time()
        assert self.process.stdout is not None
        out = self.process.stdout.read().decode(errors="replace")
        self.process.wait()
        if self._watcher.is_alive():
            self._watcher.join(timeout=5)
        self.stderr.seek(0)
        err = self.stderr.read().decode(errors="replace")
        self.stderr.close()
        summary: dict[str, Any] = {}
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                import json

                summary = json.loads(line)
                break
        return CliRun(
            self.sink,
            self.command,
            self.process.returncode,
            self.first_row_s,
            exited - self.launched,
            summary,
            "\n".join(err.strip().splitlines()[-15:]),
        )


def postgres_server() -> tuple[str | None, Callable[[], None]]:
    """A throwaway PostgreSQL (tests/harness) when initdb is installed: (url, stop)."""
    if not (shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))):
        return None, lambda: None
    sys.path.insert(0, str(ROOT))
    from tests.harness.postgres import PostgresServer

    server = PostgresServer.start_new()
    return server.url, server.destroy


# --- memory, from /proc ---------------------------------------------------------------------


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the ppid follows the last ')'.
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    children = _children_map()
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _cpu_ticks(stat: str, waited_for: bool = False) -> int:
    """User + system clock ticks of a /proc stat line; with `waited_for`, those of its children
    that ended and were waited for too."""
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
    return sum(int(n) for n in fields[11 : 15 if waited_for else 13])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    return _cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int | None) -> float:
    """CPU seconds of a process and every process under it (noida-db runs its server as a
    child; Spark's JVM runs its Python workers), with those that ended and were waited for
    (the kernel adds them to their parent's)."""
    if pid is None:
        return 0.0
    total = 0
    for each in descendants(pid):
        with contextlib.suppress(OSError):
            total += _cpu_ticks(Path(f"/proc/{each}/stat").read_text(), waited_for=True)
    return total / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int, name: str) -> float:
    """CPU seconds of a process's threads called `name` (the embedded broker's is rdk:mock)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            if stat[stat.index("(") + 1 : stat.rindex(")")] == name:
                total += _cpu_ticks(stat)
    return total / os.sysconf("SC_CLK_TCK")


def machine_ms() -> float:
    """How fast the machine is right now: the median of 5 runs (after one to warm up), in ms,
    of a fixed single-threaded task shaped like an import's data path (a 200,000-row Arrow
    table sorted, written as Parquet and read back). A shared or throttled machine moves every
    figure of a run; printed beside them, this says by how much (higher: slower)."""
    rng = np.random.default_rng(7)
    table = pa.table(
        {
            "key": rng.integers(0, 1_000_000, 200_000),
            "amount": rng.random(200_000),
            "note": pa.array([f"row {n}" for n in rng.integers(0, 50_000, 200_000)]),
        }
    )
    times = []
    for _ in range(6):
        start = time.perf_counter()
        out = io.BytesIO()
        pq.write_table(table.sort_by("key"), out, compression="zstd")
        pq.read_table(io.BytesIO(out.getvalue()), use_threads=False)
        times.append(time.perf_counter() - start)
    return round(sorted(times[1:])[2] * 1000, 1)


def memory_kib(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in KiB, or None when the process is gone."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        return None
    return rss, hwm


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []
