"""Where the seconds of a bulk import go, from this process's launch to its exit.

Runs `run_import` in this process (the CLI does not report its phases) with a Spark
StreamingQueryListener, and times: launch (the process's start, from /proc) → Python and
lagless imported → Spark session ready → query started → first batch planned (offsets,
WAL, planning) → first batch written (addBatch) → first batch committed → last batch
committed → import returned → Spark stopped (≈ exit). Each batch's Spark durationMs is
listed too.

Against a running broker (--bootstrap, --topic), or an embedded one it fills itself:

    .venv/bin/python bench/breakdown.py [--records 200000] [--partitions 24] [--sink sqlite]
"""

from __future__ import annotations

import os
import time


def _launched_at() -> float:
    """Wall-clock time this process started (/proc/self/stat field 22, in clock ticks)."""
    with open("/proc/self/stat") as handle:
        stat = handle.read()
    started_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    return time.time() - (uptime - started_ticks / os.sysconf("SC_CLK_TCK"))


LAUNCHED = _launched_at()

import argparse  # noqa: E402 - imports are part of what is timed
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from datetime import datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from lagless.broker import EmbeddedBroker  # noqa: E402
from lagless.gen import explicit, produce_profile  # noqa: E402
from lagless.importer.job import run_import  # noqa: E402
from lagless.importer.spec import ImportSpec  # noqa: E402
from lagless.kafka.config import KafkaConfig  # noqa: E402
from lagless.progress import Collector, Summary  # noqa: E402

# Spark's order inside one trigger: offsets, then the WAL, then the batch's planning and write,
# then the commit log.
PLANNING_KEYS = ("latestOffset", "walCommit", "getBatch", "queryPlanning")


def _epoch(spark_timestamp: str) -> float:
    return datetime.fromisoformat(spark_timestamp.replace("Z", "+00:00")).timestamp()


def query_listener() -> Any:
    from pyspark.sql.streaming import StreamingQueryListener

    class Recorder(StreamingQueryListener):
        def __init__(self) -> None:
            self.started: float | None = None
            self.progress: list[dict[str, Any]] = []
            self.terminated = threading.Event()

        def onQueryStarted(self, event: Any) -> None:
            self.started = _epoch(event.timestamp)

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            self.progress.append(
                {
                    "batch": progress.batchId,
                    "at": _epoch(progress.timestamp),
                    "rows": progress.numInputRows,
                    "durationMs": dict(progress.durationMs),
                }
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            self.terminated.set()

    return Recorder()


class Times(Collector):
    def __init__(self) -> None:
        self.started: float | None = None
        self.batches: list[float] = []

    def start(self, lag: int) -> None:
        self.started = time.time()

    def batch(self, summary: Summary, lag: int) -> None:
        self.batches.append(time.time())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="a broker with --topic (default: an embedded one)")
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--records", type=int, default=200_000, help="embedded broker: records")
    parser.add_argument("--partitions", type=int, default=24, help="embedded broker: partitions")
    parser.add_argument("--sink", choices=("parquet", "sqlite"), default="parquet")
    parser.add_argument("--master", help="Spark master (default local[*])")
    parser.add_argument("--work", type=Path, help="folder for the sink and checkpoint (temp)")
    return parser.parse_args()


def breakdown(
    bootstrap: str, args: argparse.Namespace, work: Path, marks: list[tuple[str, float]]
) -> tuple[Summary, Any, Times]:
    from lagless.importer.spark import spark_session

    spark = spark_session(args.master)
    marks.append(("Spark session ready", time.time()))
    listener = query_listener()
    spark.streams.addListener(listener)
    url = f"sqlite:///{work}/bench.db" if args.sink == "sqlite" else f"parquet:///{work}/lake"
    spec = ImportSpec(
        kafka=KafkaConfig(bootstrap),
        topics=(args.topic,),
        sink_url=url,
        checkpoint=str(work / "checkpoint"),
        master=args.master,
    )
    times = Times()
    summary = run_import(spec, times, spark=spark)
    returned = time.time()
    listener.terminated.wait(10)  # the listener bus delivers asynchronously
    if times.started is not None:
        marks.append(("run_import checked input, prepared the sink", times.started))
    if listener.started is not None:
        marks.append(("query started", listener.started))
    if listener.progress:
        first = listener.progress[0]
        duration = first["durationMs"]
        planned = first["at"] + sum(duration.get(k, 0) for k in PLANNING_KEYS) / 1000
        marks.append(("first batch planned (offsets, WAL, planning)", planned))
        written = planned + duration.get("addBatch", 0) / 1000
        marks.append(("first batch written (addBatch)", written))
        marks.append(("first batch committed", written + duration.get("commitOffsets", 0) / 1000))
    if len(times.batches) > 1:
        marks.append(("last batch written (foreachBatch returned)", times.batches[-1]))
    marks.append(("run_import returned", returned))
    spark.stop()
    marks.append(("Spark stopped (≈ exit)", time.time()))
    return summary, listener, times


def main() -> int:
    marks: list[tuple[str, float]] = [("launch", LAUNCHED), ("Python, lagless imported", 0.0)]
    marks[1] = (marks[1][0], time.time())
    args = parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="lagless-breakdown-"))
    work.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    try:
        if args.bootstrap:
            summary, listener, _ = breakdown(args.bootstrap, args, work, marks)
        else:
            with EmbeddedBroker(topics={args.topic: args.partitions}) as broker:
                share, extra = divmod(args.records, args.partitions)
                counts = [share + (p < extra) for p in range(args.partitions)]
                with console.status(f"producing {args.records:,} records"):
                    produce_profile(
                        KafkaConfig(broker.bootstrap),
                        args.topic,
                        explicit(counts),
                        compression="zstd",
                    )
                # Producing is not the import's: start the clock again at its end.
                shift = time.time() - marks[1][1]
                marks = [(name, at + shift) for name, at in marks]
                with console.status("importing in-process with a query listener"):
                    summary, listener, _ = breakdown(broker.bootstrap, args, work, marks)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    marks.sort(key=lambda mark: mark[1])
    table = Table(title=f"where a bulk import's seconds go ({summary.records:,} records)")
    for column in ("phase", "at s", "took s"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    phases = []
    for (name, at), previous in zip(marks, [marks[0], *marks], strict=False):
        phases.append({"phase": name, "at_s": round(at - LAUNCHED, 3)})
        table.add_row(name, f"{at - LAUNCHED:.2f}", f"{at - previous[1]:.2f}")
    batches = Table(title="Spark's durationMs per batch (ms)")
    keys = sorted({k for p in listener.progress for k in p["durationMs"]})
    for column in ("batch", "rows", *keys):
        batches.add_column(column, justify="right")
    for p in listener.progress:
        batches.add_row(
            str(p["batch"]), f"{p['rows']:,}", *(f"{p['durationMs'].get(k, 0):,}" for k in keys)
        )
    out = Console(width=max(Console().width, 120))
    out.print(table)
    out.print(batches)
    print(
        json.dumps(
            {
                "records": summary.records,
                "sink": args.sink,
                "phases": phases,
                "batches": listener.progress,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
