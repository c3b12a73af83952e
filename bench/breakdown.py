"""Where the seconds of a bulk import go, from its process's launch to its exit.

This script launches itself again as the import's process (--child) and times that process
from outside: launch → exit. Inside, the child runs lagless's `run_import` as the CLI does
(its own Spark session and the Python workers' warm-up), with lagless's `spark_session`
wrapped to note when the session is up, to add a StreamingQueryListener and to turn Spark's
event log on (for each task's launch and finish). Printed:

- the phases, summing to launch → exit: Python start-up, imports, Spark session (JVM,
  context, session), lagless's checks and the sink's preparation, query start, planning of
  every batch (offsets, WAL, Spark's planning), every batch's tasks (the first batch's apart:
  it starts the Python workers the warm-up has not), the driver's part of writing each batch
  (addBatch beyond its tasks: the sink's commit), Spark's commit log, the rest of the
  triggers, the query's end, Spark's stop, the process's exit;
- the same as marks in time, and each batch's Spark durationMs and its tasks.

The backlog: a topic of a running broker (--bootstrap, --topic), or one it fills on an
embedded broker: --records of 100 B (--sink parquet|sqlite; --value-schema: their JSON values
into typed columns, as `lagless import --value-format json --value-schema`), or the demo's
(--demo: seed 000 at `lagless demo`'s default scale into SQLite with the demo's group;
--demo typed: the deals into a typed SQLite table, as `lagless demo --typed`).

    .venv/bin/python bench/breakdown.py [--records 1000000] [--sink sqlite] [--demo [typed]]
"""

from __future__ import annotations

import time

STARTED = time.time()  # the child's interpreter reached this script: Python's start-up is over

import argparse  # noqa: E402 - the imports are a phase
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from datetime import datetime  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

# Spark's order inside one trigger: offsets, then the WAL, then the batch's planning and write
# (addBatch: the tasks, then the sink's commit on the driver), then the commit log.
PLANNING_KEYS = ("latestOffset", "walCommit", "getBatch", "queryPlanning")
DEMO_TOPIC = {"seed-000": "statements", "typed": "deals"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", help="a broker with --topic (default: an embedded one)")
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--records", type=int, default=1_000_000, help="embedded: records")
    parser.add_argument("--partitions", type=int, default=24, help="embedded: partitions")
    parser.add_argument("--sink", choices=("parquet", "sqlite"), default="parquet")
    parser.add_argument(
        "--value-schema",
        help="JSON values into these typed columns (e.g. 'seq BIGINT NOT NULL, pad STRING')",
    )
    parser.add_argument(
        "--demo",
        nargs="?",
        const="seed-000",
        choices=tuple(DEMO_TOPIC),
        help="the demo's backlog and import instead (typed: `lagless demo --typed`'s)",
    )
    parser.add_argument("--scale", type=float, help="--demo: the demo's --scale")
    parser.add_argument("--master", help="Spark master (default local[*], as the CLI's)")
    parser.add_argument("--work", type=Path, help="folder for the sink and checkpoint (temp)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.demo:
        args.topic = DEMO_TOPIC[args.demo]
        args.sink = "sqlite"
    return args


# --- the child: the import, in this process ----------------------------------------------------


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


def import_spec(args: argparse.Namespace, work: Path) -> Any:
    """What the CLI (or the demo) would import."""
    from lagless.importer.spec import ImportSpec
    from lagless.kafka.config import KafkaConfig

    kafka = KafkaConfig(args.bootstrap)
    checkpoint = str(work / "checkpoint")
    if args.demo == "typed":
        from lagless.cli.demo import DEALS_TOPIC
        from lagless.gen.deals import DEALS_DDL

        return ImportSpec(
            kafka=kafka,
            topics=(DEALS_TOPIC,),
            sink_url=f"sqlite:///{work}/demo.db",
            checkpoint=checkpoint,
            write="upsert",
            value_format="json",
            value_schema=DEALS_DDL,
            key_fields=("deal_id",),
            master=args.master,
        )
    if args.demo:
        from lagless.cli.demo import GROUP

        return ImportSpec(
            kafka=kafka,
            topics=(args.topic,),
            sink_url=f"sqlite:///{work}/demo.db",
            checkpoint=checkpoint,
            group=GROUP,
            master=args.master,
        )
    url = f"sqlite:///{work}/bench.db" if args.sink == "sqlite" else f"parquet:///{work}/lake"
    typed = {"value_format": "json", "value_schema": args.value_schema} if args.value_schema else {}
    return ImportSpec(
        kafka=kafka,
        topics=(args.topic,),
        sink_url=url,
        checkpoint=checkpoint,
        master=args.master,
        **typed,
    )


def child(args: argparse.Namespace) -> int:
    """Runs the import; prints its marks, batches and tasks as one JSON line."""
    import lagless.importer.spark as spark_module
    from lagless.importer.job import run_import
    from lagless.importer.warm_up import WarmUp
    from lagless.progress import Collector, Summary
    from lagless.progress.collector import RecentRate

    marks: dict[str, float] = {"python up": STARTED, "imports done": time.time()}
    work = args.work
    events = work / "spark-events"
    events.mkdir(parents=True, exist_ok=True)
    listener = query_listener()
    sessions: list[Any] = []
    real_session = spark_module.spark_session

    def spark_session(
        master: Any = None, parallelism: Any = None, conf: Any = None, **given: Any
    ) -> Any:
        logged = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
        }
        if sessions:  # asked again (a typed import's checks ask first): the same session
            return real_session(master, parallelism, {**logged, **(conf or {})}, **given)
        marks["spark session asked"] = time.time()
        spark = real_session(master, parallelism, {**logged, **(conf or {})}, **given)
        marks["spark session ready"] = time.time()
        spark.streams.addListener(listener)
        sessions.append(spark)
        return spark

    spark_module.spark_session = spark_session  # type: ignore[assignment]
    for method, mark in (
        ("start_workers", "warm-up: Python workers up"),
        ("start_planner", "warm-up: read planner up"),
    ):
        _note_when_done(WarmUp, method, mark, marks)

    records_by_batch: list[int] = []

    bar: list[float] = []  # what the import's bar shows after each batch (RecentRate)

    class Times(Collector):
        def start(self, lag: int) -> None:
            marks["query asked to start"] = time.time()
            self.rate = RecentRate(time.time())

        def batch(self, summary: Summary, lag: int) -> None:
            marks.setdefault("first batch done", time.time())
            marks["last batch done"] = time.time()
            records_by_batch.append(summary.records - sum(records_by_batch))
            bar.append(self.rate.add(time.time(), summary.records, summary.bytes)[0])

    summary = run_import(import_spec(args, work), Times())
    marks["run_import returned"] = time.time()
    listener.terminated.wait(10)  # the listener bus delivers asynchronously
    if listener.started is not None:
        marks["query started"] = listener.started
    sessions[0].stop()  # which flushes the event log
    marks["spark stopped"] = time.time()
    tasks = spark_tasks(events)
    if listener.progress:
        first = [t for t in tasks if t[2] == listener.progress[0]["batch"]]
        if first:
            marks["first batch: first task launched"] = min(t[0] for t in first)
            marks["first batch: last task finished"] = max(t[1] for t in first)
    warm_up = [t for t in tasks if t[2] is None]
    if warm_up:
        marks["warm-up: first task launched"] = min(t[0] for t in warm_up)
    out = {
        "records": summary.records,
        "marks": marks,
        "batches": listener.progress,
        "records_by_batch": records_by_batch,
        "bar": bar,
        "tasks": tasks,
    }
    print(json.dumps(out), flush=True)
    return 0


def _note_when_done(cls: Any, method: str, mark: str, marks: dict[str, float]) -> None:
    """Wrap cls.method to note when it returns."""
    real = getattr(cls, method)

    def noted(self: Any) -> None:
        real(self)
        marks[mark] = time.time()

    setattr(cls, method, noted)


def spark_tasks(events: Path) -> list[tuple[float, float, int | None]]:
    """(launch, finish, micro-batch id or None) of every task in Spark's event log; None for
    a job of no batch (the Python workers' warm-up)."""
    batch_of_stage: dict[int, int | None] = {}
    tasks = []
    for log in events.iterdir():
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerJobStart":
                batch = (event.get("Properties") or {}).get("streaming.sql.batchId")
                for stage in event["Stage IDs"]:
                    batch_of_stage[stage] = None if batch is None else int(batch)
            elif event["Event"] == "SparkListenerTaskEnd":
                info = event["Task Info"]
                batch = batch_of_stage.get(event["Stage ID"])
                tasks.append((info["Launch Time"] / 1000, info["Finish Time"] / 1000, batch))
    return sorted(tasks, key=lambda task: task[0])


# --- the parent: the backlog, the child's launch and exit, the report -----------------------------


def produce(args: argparse.Namespace, broker: Any) -> None:
    """The backlog, into a new topic of the embedded broker."""
    from lagless.gen import build_profile, explicit, produce_profile
    from lagless.kafka.config import KafkaConfig

    kafka = KafkaConfig(broker.bootstrap)
    if args.demo == "typed":
        from lagless.cli.demo import DEMO_DEAL_BYTES, DEMO_DEALS_PER_PARTITION, DEMO_DEALS_SCALE
        from lagless.gen.deals import DealRecords

        scale = args.scale or DEMO_DEALS_SCALE
        profile = build_profile("deals", partitions=0, scale=scale, record_bytes=DEMO_DEAL_BYTES)
        keys, shape = DEMO_DEALS_PER_PARTITION, DealRecords("json")
    elif args.demo:
        profile = build_profile("seed-000", partitions=24, scale=args.scale or 10.0)
        keys, shape = 1_000, None
    else:
        share, extra = divmod(args.records, args.partitions)
        profile = explicit([share + (p < extra) for p in range(args.partitions)])
        keys, shape = 1_000, None
    broker.create_topic(args.topic, profile.partitions)
    produce_profile(kafka, args.topic, profile, keys=keys, compression="zstd", shape=shape)


def launch_child(args: argparse.Namespace, work: Path) -> tuple[dict[str, Any], float, float]:
    """(the child's JSON, its launch and its exit in wall-clock time)."""
    command = [
        sys.executable,
        __file__,
        "--child",
        *("--bootstrap", args.bootstrap, "--topic", args.topic, "--sink", args.sink),
        *("--work", str(work)),
        *(["--demo", args.demo] if args.demo else []),
        *(["--master", args.master] if args.master else []),
        *(["--value-schema", args.value_schema] if args.value_schema else []),
    ]
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout)
    exited = time.time()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        # Python's own lines, not the JVM's stack frames.
        said = [line for line in done.stderr.splitlines() if not line.startswith(("\t", " "))]
        sys.stderr.write("\n".join(said[-40:]) + "\n")
        raise SystemExit(f"the import's process exited {done.returncode}")
    return json.loads(lines[-1]), launched, exited


def phases(found: dict[str, Any], launched: float, exited: float) -> list[tuple[str, float]]:
    """(phase, seconds), summing to launch → exit."""
    marks = found["marks"]
    batches = found["batches"]
    tasks = found["tasks"]
    first_trigger = batches[0]["at"] if batches else marks["run_import returned"]
    planning = added = committed = before_tasks = after_tasks = 0.0
    first_tasks = later_tasks = 0.0
    for index, batch in enumerate(batches):
        duration = batch["durationMs"]
        planned = sum(duration.get(k, 0) for k in PLANNING_KEYS) / 1000
        planning += planned
        added += duration.get("addBatch", 0) / 1000
        committed += duration.get("commitOffsets", 0) / 1000
        inside = [t for t in tasks if t[2] == batch["batch"]]
        if not inside:
            continue
        # addBatch follows the planning: the driver's foreachBatch, the tasks, the sink's commit
        add_began = batch["at"] + planned
        first_launch, last_finish = min(t[0] for t in inside), max(t[1] for t in inside)
        before_tasks += first_launch - add_began
        after_tasks += add_began + duration.get("addBatch", 0) / 1000 - last_finish
        if index == 0:
            first_tasks = last_finish - first_launch
        else:
            later_tasks += last_finish - first_launch
    last_end = (
        batches[-1]["at"] + batches[-1]["durationMs"].get("triggerExecution", 0) / 1000
        if batches
        else first_trigger
    )
    shown = [
        ("Python start-up (interpreter)", marks["python up"] - launched),
        ("imports (lagless, pyspark, pyarrow)", marks["imports done"] - marks["python up"]),
        ("lagless checks before Spark", marks["spark session asked"] - marks["imports done"]),
        (
            "Spark session (JVM, context, session)",
            marks["spark session ready"] - marks["spark session asked"],
        ),
        (
            "sink prepared, offsets read, before the query",
            marks["query asked to start"] - marks["spark session ready"],
        ),
        ("query start (to its first trigger)", first_trigger - marks["query asked to start"]),
        ("planning, all batches (offsets, WAL, Spark plan)", planning),
        ("batches' driver work before their tasks (and waits for slots)", before_tasks),
        ("first batch's tasks (Python workers' start unless warmed up)", first_tasks),
        (f"later batches' tasks ({max(0, len(batches) - 1)} batches)", later_tasks),
        ("batches' driver work after their tasks (the sink's commit)", after_tasks),
        (
            "rest of addBatch (batches without a task)",
            added - before_tasks - first_tasks - later_tasks - after_tasks,
        ),
        ("commit log, all batches", committed),
        (
            "rest of the triggers, gaps between them",
            last_end - first_trigger - planning - added - committed,
        ),
        ("query end, run_import returns", marks["run_import returned"] - last_end),
        ("Spark stop", marks["spark stopped"] - marks["run_import returned"]),
        ("process exit", exited - marks["spark stopped"]),
    ]
    return shown


def report(found: dict[str, Any], launched: float, exited: float, title: str) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    out = Console(width=max(Console().width, 120))
    total = exited - launched
    where = phases(found, launched, exited)
    table = Table(title=f"where {title}'s {total:.1f} s go, launch to exit")
    for column in ("phase", "s", "share"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for name, seconds in where:
        table.add_row(name, f"{seconds:.2f}", f"{seconds / total:.0%}")
    table.add_row("launch → exit", f"{total:.2f}", "100%", end_section=True)
    out.print(table)

    marks = sorted([("launch", launched), *found["marks"].items(), ("exit", exited)], key=_at)
    timeline = Table(title="marks (s since launch)")
    timeline.add_column("mark")
    timeline.add_column("at s", justify="right")
    for name, at in marks:
        timeline.add_row(name, f"{at - launched:.2f}")
    out.print(timeline)

    order = (*PLANNING_KEYS, "addBatch", "commitOffsets", "triggerExecution")
    keys = [k for k in order if any(k in b["durationMs"] for b in found["batches"])]
    batches = Table(title="Spark's durationMs per batch (ms), and its tasks")
    for column in ("batch", "records", *keys, "tasks", "task s (sum)"):
        batches.add_column(column, justify="right")
    records = found["records_by_batch"]
    for index, b in enumerate(found["batches"]):
        inside = [t for t in found["tasks"] if t[2] == b["batch"]]
        batches.add_row(
            str(b["batch"]),
            f"{records[index]:,}" if len(records) == len(found["batches"]) else "-",
            *(f"{b['durationMs'].get(k, 0):,}" for k in keys),
            str(len(inside)),
            f"{sum(t[1] - t[0] for t in inside):.2f}",
        )
    out.print(batches)
    # The import's progress bar (progress.RichCollector) shows RecentRate: its last figure. And
    # the whole run's, from the collector's start (Spark's query start included).
    noted = found["marks"]
    bar = found["bar"][-1] if found["bar"] else 0.0
    since_s = noted.get("last batch done", 0.0) - noted["query asked to start"]
    overall = found["records"] / since_s if since_s > 0 else 0.0
    out.print(
        f"the import's bar ends at {bar:,.0f} records/s (its last batches); "
        f"{overall:,.0f} records/s since the query was asked to start "
        f"({found['records']:,} in {since_s:.1f} s)"
    )
    return {
        "records": found["records"],
        "bar_records_per_s": round(bar),
        "records_per_s_since_query_start": round(overall),
        "launch_to_exit_s": round(total, 3),
        "where": [{"phase": name, "s": round(s, 3)} for name, s in where],
        "phases": [{"phase": name, "at_s": round(at - launched, 3)} for name, at in marks],
        "batches": found["batches"],
    }


def _at(mark: tuple[str, float]) -> float:
    return mark[1]


def main() -> int:
    args = parse_args()
    if args.child:
        return child(args)
    from lagless.broker import EmbeddedBroker

    work = args.work or Path(tempfile.mkdtemp(prefix="lagless-breakdown-"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        if args.bootstrap:
            found, launched, exited = launch_child(args, work)
        else:
            with EmbeddedBroker() as broker:
                args.bootstrap = broker.bootstrap
                produce(args, broker)
                found, launched, exited = launch_child(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    what = f"lagless demo{' --typed' if args.demo == 'typed' else ''}" if args.demo else None
    title = what or f"a bulk import into {args.sink}{' (typed JSON)' if args.value_schema else ''}"
    figures = report(found, launched, exited, f"{title} ({found['records']:,} records)")
    figures |= {"sink": args.sink, "demo": args.demo, "cores": os.cpu_count(), "launched": launched}
    figures |= {"load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
