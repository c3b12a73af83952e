"""Produce-to-row latency of `lagless import --mode continuous`, launched as users launch it.

Starts the embedded broker, launches `lagless import --mode continuous --trigger-seconds T`
into SQLite (or Parquet) as a subprocess, and produces at a steady rate from the moment of
launch. A thread polls the sink every --poll-ms for rows it has not seen (per partition, by
offset; for Parquet, batch folders that have their _SUCCESS) and notes when each became
visible; the record's timestamp, which the sink stores as `timestamp` (ms, the producer's
create time), says when it was produced. Once the first row is visible and --settle-seconds
more have passed (the backlog from Spark's start-up is drained), each rate of --rates runs for
--seconds; records produced in a rate's window are its sample. Then producing stops, the
import gets SIGINT and must exit 0.

Reports launch to first row, and produce-to-row p50 / p99 / max per rate (targets of the issue:
first row <= 20 s, p50 <= 1 s, p99 <= 2 s at 2,000 records/s) as a table and one JSON line;
--png writes a chart of latency over time.

    .venv/bin/python bench/latency.py [--rates 2000 20000] [--seconds 30] [--sink parquet]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import Launched, import_args, sink_path, sink_url
from confluent_kafka import Producer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.kafka.produce import produce

TOPIC = "latency"
TARGETS = {"first_row_s": 20.0, "p50_s": 1.0, "p99_s": 2.0}  # at 2,000 records/s
console = Console(stderr=True)


# --- a producer at a steady rate ---------------------------------------------------------------


class SteadyProducer(threading.Thread):
    """Produces `rate` records/s round-robin over the partitions, in small steps; the record's
    create time (set by the client at produce) is the produce time the sink keeps."""

    def __init__(self, kafka: KafkaConfig, partitions: int, record_bytes: int) -> None:
        super().__init__(daemon=True)
        self.producer = Producer(
            kafka.producer(**{"linger.ms": 5, "compression.type": "zstd", "acks": 1})
        )
        self.partitions = partitions
        self.value = b"x" * record_bytes
        self.rate = 0.0
        self.produced = 0
        self.stop = threading.Event()

    def run(self) -> None:
        owed = 0.0
        last = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            owed += self.rate * (now - last)
            last = now
            while owed >= 1:
                partition = self.produced % self.partitions
                produce(self.producer, TOPIC, value=self.value, partition=partition)
                self.produced += 1
                owed -= 1
            self.producer.poll(0)
            time.sleep(0.002)
        self.producer.flush(30)


# --- a sink watcher: when did each record become visible ----------------------------------------


@dataclass
class Seen:
    """(produce time, visible time) in seconds since the epoch, one per record seen."""

    rows: list[tuple[float, float]] = field(default_factory=list)
    first_at: float | None = None
    polls: int = 0
    poll_seconds: float = 0.0


class SinkWatcher(threading.Thread):
    def __init__(self, url: str, table: str, partitions: int, poll_s: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.table = table
        self.partitions = partitions
        self.poll_s = poll_s
        self.seen = Seen()
        self.stop = threading.Event()

    def run(self) -> None:
        poll = self._sqlite_poller() if self.url.startswith("sqlite:") else self._parquet_poller()
        while not self.stop.is_set():
            began = time.time()
            timestamps = poll()
            visible = time.time()
            self.seen.polls += 1
            self.seen.poll_seconds += visible - began
            if timestamps:
                # A row is visible from the end of the poll that found it at the latest.
                self.seen.rows.extend((ts / 1000, visible) for ts in timestamps)
                if self.seen.first_at is None:
                    self.seen.first_at = visible
            time.sleep(max(0.0, self.poll_s - (time.time() - began)))

    def _sqlite_poller(self) -> Any:
        path = sink_path(self.url)
        after = dict.fromkeys(range(self.partitions), -1)
        query = (
            f'SELECT "offset", "timestamp" FROM "{self.table}" '
            'WHERE topic = ? AND "partition" = ? AND "offset" > ? ORDER BY "offset"'
        )

        def poll() -> list[int]:
            if not os.path.exists(path):
                return []
            found: list[int] = []
            try:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as conn:
                    for p in range(self.partitions):
                        rows = conn.execute(query, (TOPIC, p, after[p])).fetchall()
                        if rows:
                            after[p] = rows[-1][0]
                            found.extend(ts for _, ts in rows)
            except sqlite3.OperationalError:  # no table yet, or locked for a moment
                pass
            return found

        return poll

    def _parquet_poller(self) -> Any:
        import pyarrow.parquet as pq

        from lagless.sinks.parquet import RANGES

        folder = Path(sink_path(self.url)) / self.table
        done: set[str] = set()

        def poll() -> list[int]:
            found: list[int] = []
            if not folder.exists():
                return found
            for batch in folder.iterdir():
                # A batch's folder is committed once it is renamed into place holding its ledger
                # entry (_-prefixed folders are a commit in progress).
                committed = batch.name.startswith("batch=") and (batch / RANGES).exists()
                if batch.name in done or not committed:
                    continue
                done.add(batch.name)
                files = [f for f in batch.iterdir() if f.suffix == ".parquet"]
                for file in files:
                    found.extend(
                        pq.read_table(file, columns=["timestamp"])["timestamp"].to_pylist()
                    )
            return found

        return poll


# --- figures ----------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


@dataclass
class Window:
    rate: float
    began: float
    ended: float
    produced: int = 0

    def stats(self, rows: list[tuple[float, float]]) -> dict[str, Any]:
        latencies = sorted(v - p for p, v in rows if self.began <= p < self.ended)
        return {
            "rate": self.rate,
            "seconds": round(self.ended - self.began, 1),
            "produced": self.produced,
            "seen": len(latencies),
            "p50_s": round(percentile(latencies, 0.50), 3),
            "p99_s": round(percentile(latencies, 0.99), 3),
            "max_s": round(latencies[-1], 3) if latencies else None,
        }


def draw(
    path: Path, rows: list[tuple[float, float]], launched: float, windows: list[Window], info: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    per_second: dict[int, list[float]] = {}
    for produced, visible in rows:
        per_second.setdefault(int(produced - launched), []).append(visible - produced)
    seconds = sorted(per_second)
    figure, axes = plt.subplots(figsize=(9, 4.5), dpi=90)
    for q, name in ((0.5, "p50"), (0.99, "p99"), (1.0, "max")):
        axes.plot(
            seconds, [percentile(sorted(per_second[s]), q) for s in seconds], label=name, lw=1.2
        )
    for window in windows:
        axes.axvspan(window.began - launched, window.ended - launched, alpha=0.08, color="C0")
        axes.text(
            window.began - launched,
            axes.get_ylim()[1] * 0.95,
            f" {window.rate:,.0f}/s",
            fontsize="small",
            va="top",
        )
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.set_xlabel("produced at, seconds since the import's launch")
    axes.set_ylabel("produce → row visible, s")
    axes.set_title(f"lagless continuous import latency ({info})")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


# --- main ----------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[2_000, 20_000])
    parser.add_argument("--seconds", type=float, default=30.0, help="per rate (30)")
    parser.add_argument("--settle-seconds", type=float, default=5.0, help="after the first row")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--sink", choices=("sqlite", "parquet"), default="sqlite")
    parser.add_argument(
        "--trigger-seconds",
        type=float,
        default=ImportSpec.trigger_seconds,
        help="seconds between batch starts (default: lagless's, %(default)s)",
    )
    parser.add_argument("--poll-ms", type=float, default=30.0, help="sink polling period (30)")
    parser.add_argument("--master", help="lagless import --master")
    parser.add_argument(
        "--import-option", action="append", default=[], metavar="ARG", help="extra import arg"
    )
    parser.add_argument("--first-row-timeout", type=float, default=180.0)
    parser.add_argument("--png", type=Path, help="write a chart of latency over time here")
    args = parser.parse_args()
    if not args.rates or min(args.rates) <= 0 or args.seconds <= 0 or args.partitions < 1:
        parser.error("--rates and --seconds must be positive, --partitions at least 1")
    return args


def main() -> int:
    args = parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="lagless-latency-"))
    try:
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            return run(args, broker, work, load_before)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, broker: EmbeddedBroker, work: Path, load_before: Any) -> int:
    kafka = KafkaConfig(broker.bootstrap)
    url = sink_url(args.sink, work)
    producer = SteadyProducer(kafka, args.partitions, args.record_bytes)
    watcher = SinkWatcher(url, TOPIC, args.partitions, args.poll_ms / 1000)
    cli_args = import_args(
        broker.bootstrap,
        TOPIC,
        url,
        work / "checkpoint",
        "continuous",
        args,
        *("--trigger-seconds", str(args.trigger_seconds)),
    )
    launched = Launched(cli_args, args.sink, url, TOPIC, probe=False)
    producer.rate = args.rates[0]
    producer.start()
    watcher.start()
    windows: list[Window] = []
    try:
        with console.status("launched; waiting for the first row") as status:
            while watcher.seen.first_at is None:
                if launched.process.poll() is not None:
                    console.print(f"[red]the import exited {launched.process.returncode}[/]")
                    print(launched.wait().stderr_tail, file=sys.stderr)
                    return 1
                if launched.elapsed > args.first_row_timeout:
                    console.print("[red]no row within --first-row-timeout[/]")
                    launched.interrupt()
                    print(launched.wait(timeout_s=60).stderr_tail, file=sys.stderr)
                    return 1
                status.update(f"launched; waiting for the first row ({launched.elapsed:.0f} s)")
                time.sleep(0.1)
            first_row_s = watcher.seen.first_at - launched.launched
            console.print(f"first row visible {first_row_s:.1f} s after launch")
            status.update(f"settling for {args.settle_seconds:g} s at {args.rates[0]:,.0f}/s")
            time.sleep(args.settle_seconds)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[seen]:>10,} rows seen"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            for rate in args.rates:
                task = bar.add_task(f"{rate:>8,.0f} records/s", total=args.seconds, seen=0)
                before = producer.produced
                producer.rate = rate
                window = Window(rate, time.time(), 0.0)
                while (elapsed := time.time() - window.began) < args.seconds:
                    bar.update(task, completed=elapsed, seen=len(watcher.seen.rows))
                    time.sleep(0.2)
                window.ended = time.time()
                window.produced = producer.produced - before
                windows.append(window)
                bar.update(task, completed=args.seconds)
        producer.rate = 0
        with console.status("waiting for the last rows"):
            deadline = time.time() + 60
            while len(watcher.seen.rows) < producer.produced and time.time() < deadline:
                time.sleep(0.1)
    finally:
        producer.stop.set()
        producer.join(timeout=40)
        watcher.stop.set()
        watcher.join(timeout=10)
        if launched.process.poll() is None:
            launched.interrupt()
    with console.status("SIGINT sent; waiting for the import to exit"):
        result = launched.wait(timeout_s=120)
    stopped_s = result.exit_s
    seen = watcher.seen
    stats = [w.stats(seen.rows) for w in windows]
    report = {
        "sink": args.sink,
        "partitions": args.partitions,
        "trigger_seconds": args.trigger_seconds,
        "poll_ms": args.poll_ms,
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "first_row_s": round(first_row_s, 2),
        "produced": producer.produced,
        "seen": len(seen.rows),
        "exit_code": result.returncode,
        "launch_to_exit_s": round(stopped_s, 1),
        "mean_poll_ms": round(1000 * seen.poll_seconds / max(1, seen.polls), 1),
        "rates": stats,
        "targets_at_2000": TARGETS,
    }
    show(report)
    if result.returncode != 0:
        console.print(f"[red]import exited {result.returncode}[/]\n{result.stderr_tail}")
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        info = f"{args.sink}, trigger {args.trigger_seconds:g} s, {args.partitions} partitions"
        draw(args.png, seen.rows, launched.launched, windows, info)
        console.print(f"wrote {args.png}")
    print(json.dumps(report))
    complete = len(seen.rows) == producer.produced
    if not complete:
        console.print(f"[red]saw {len(seen.rows):,} of {producer.produced:,} rows[/]")
    return 0 if result.returncode == 0 and complete else 1


def show(report: dict[str, Any]) -> None:
    table = Table(
        title=f"lagless continuous → {report['sink']}, trigger {report['trigger_seconds']:g} s: "
        f"first row {report['first_row_s']:.1f} s after launch (target "
        f"<= {TARGETS['first_row_s']:.0f} s)",
        caption="seen: rows whose record timestamp is in the window; sink polled every "
        f"{report['poll_ms']:g} ms (a poll took "
        f"{report['mean_poll_ms']} ms); SIGINT → exit code {report['exit_code']}; targets at "
        f"2,000/s: p50 <= {TARGETS['p50_s']:g} s, p99 <= {TARGETS['p99_s']:g} s",
    )
    for column in ("records/s", "seconds", "produced", "seen", "p50 s", "p99 s", "max s"):
        table.add_column(column, justify="right")
    for s in report["rates"]:
        table.add_row(
            f"{s['rate']:,.0f}",
            f"{s['seconds']:.0f}",
            f"{s['produced']:,}",
            f"{s['seen']:,}",
            f"{s['p50_s']:.3f}",
            f"{s['p99_s']:.3f}",
            f"{s['max_s']:.3f}" if s["max_s"] is not None else "-",
        )
    Console(width=max(Console().width, 110)).print(table)


if __name__ == "__main__":
    sys.exit(main())
