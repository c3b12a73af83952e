"""bench/skew: how long lagless and consumer-group importers take to drain skewed backlogs.

On the embedded broker, for each lag profile (seed-000, seed-002, uniform) this measures the
drain time (start until every record is in the sink) of:

- lagless: one bulk import to Parquet, in a Spark session created once (its startup is
  reported apart and excluded);
- consumer groups as people write them today: N confluent-kafka consumers subscribed in one
  group, one process each, each writing what it reads to its own Parquet files and committing
  after each write; with the range and cooperative-sticky assignors and several N;
- optionally (--blocking-s) seed 002's importer: group members that poll their partitions in
  turn, blocking up to that long on each, even when it has nothing left;
- the ideal: the profile's records divided by the client's speed, measured in the same run
  on that profile's topic: two plain confluent-kafka consumers in separate OS processes, each
  assigned half the partitions, reading to the end offsets and storing nothing
  (benchlib.plain_consumers). Every runner, lagless included, is judged against it. Also
  printed: the throughput lagless reaches with every Spark core busy (records per second of
  task time from Spark's event log, times the cores: `busy_throughput`).

Prints a table of drain times and ratios to the ideal, writes <out>/skew.json and one PNG per
profile of records imported over time, one line per runner. Not a test: it asserts nothing.

    .venv/bin/python bench/skew.py --out bench/results
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, cast

from benchlib import Baseline, plain_consumers

ASSIGNORS = ("range", "cooperative-sticky")
PARTITIONS = 24  # seed 000's topic
ONE_BATCH_BYTES = 4 * 1024**3
COMPRESSION = "zstd"  # the embedded broker keeps ~5 MiB of stored batches per partition
CONSUME_BATCH = 500
# The bench's own source option (ProgressSource's, not lagless's): where tasks note their
# reads. Spark hands a data source its options with lower-cased names, so it is taken out by
# that name before lagless's source parses the rest (which refuses any option it does not know).
PROGRESS_OPTION = "benchprogressdir"


@dataclass
class Run:
    """One runner draining one profile's topic."""

    runner: str
    drain_s: float | None  # None: not drained within the run timeout
    imported: int
    curve: list[tuple[float, int]] = field(default_factory=list)  # (seconds, records so far)
    # Seconds at which a group member's assignment changed (a member's on_assign/on_revoke).
    rebalances: list[float] = field(default_factory=list)


@dataclass
class SparkTask:
    """One task of a lagless run as Spark's event log has it, in seconds since the run began."""

    launched: float
    finished: float


@dataclass
class LaglessRun(Run):
    began_at: float = 0.0  # wall clock, to find the run's tasks in the event log
    tasks: list[SparkTask] = field(default_factory=list)

    def phases(self) -> tuple[float, float, float]:
        """Seconds before the first task launched, from then until the last finished, and
        after it until the import returned."""
        first = min(task.launched for task in self.tasks)
        last = max(task.finished for task in self.tasks)
        return first, last - first, (self.drain_s or 0.0) - last


@dataclass
class ProfileResult:
    profile: str
    counts: list[int]
    record_bytes: list[int]
    records: int
    value_bytes: int
    cores: int
    runs: list[Run]
    baseline: Baseline

    @property
    def lagless(self) -> LaglessRun:
        return next(run for run in self.runs if isinstance(run, LaglessRun))

    @property
    def busy_records_per_s(self) -> float:
        return busy_throughput(self.lagless.imported, self.lagless.tasks, self.cores)

    @property
    def ideal_s(self) -> float:
        """The profile's records at the plain consumers' pace, from the first second."""
        return self.records / self.baseline.records_per_second


# --- consumer-group importer, one process per member --------------------------------------


def group_member(
    index: int,
    bootstrap: str,
    group: str,
    assignor: str,
    topic: str,
    out_dir: str,
    blocking_s: float,
    events: Any,
    go: Event,
    stop: Event,
) -> None:
    """Subscribe, then consume, write a Parquet file, commit, report; until told to stop."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

    from lagless.kafka.config import KafkaConfig

    consumer = Consumer(KafkaConfig(bootstrap).group_member(group, assignor))
    written = 0

    def store(messages: list[Message]) -> None:
        nonlocal written
        records = [m for m in messages if m.error() is None]
        if not records:
            return
        table = pa.table(
            {
                "partition": [m.partition() for m in records],
                "offset": [m.offset() for m in records],
                "key": [m.key() for m in records],
                "value": [m.value() for m in records],
            }
        )
        pq.write_table(table, os.path.join(out_dir, f"member{index}-{written:06d}.parquet"))
        written += 1
        ends: dict[int, int] = {}
        for m in records:
            partition, offset = cast(int, m.partition()), cast(int, m.offset())
            ends[partition] = max(ends.get(partition, 0), offset + 1)
        events.put(("rows", time.time(), ends))
        # A commit fails when a rebalance took the partitions meanwhile: their next owner
        # re-reads from the last commit, as in any at-least-once importer.
        with contextlib.suppress(KafkaException):
            consumer.commit(asynchronous=False)

    def poll_in_turn() -> None:
        """Seed 002's loop: each assigned partition alone, waiting up to blocking_s for it."""
        assigned = consumer.assignment()
        if not assigned:
            store(consumer.consume(CONSUME_BATCH, timeout=0.2))
            return
        for tp in assigned:
            if stop.is_set():
                return
            others = [TopicPartition(t.topic, t.partition) for t in assigned if t != tp]
            try:
                consumer.pause(others)
                consumer.resume([TopicPartition(tp.topic, tp.partition)])
            except Exception:  # revoked by a rebalance meanwhile
                return
            store(consumer.consume(CONSUME_BATCH, timeout=blocking_s))

    events.put(("ready", index))
    go.wait()

    def note_assignment(_consumer: Any, partitions: list[Any]) -> None:
        events.put(("assigned", time.time(), index, len(partitions)))

    consumer.subscribe([topic], on_assign=note_assignment, on_revoke=note_assignment)
    try:
        while not stop.is_set():
            if blocking_s > 0:
                poll_in_turn()
            else:
                store(consumer.consume(CONSUME_BATCH, timeout=0.5))
    finally:
        consumer.close()


def run_group(
    bootstrap: str,
    topic: str,
    total: int,
    members: int,
    assignor: str,
    blocking_s: float,
    work_dir: Path,
    timeout_s: float,
    on_rows: Callable[[int], None],
) -> tuple[float | None, int, list[tuple[float, int]], list[float]]:
    """(drain seconds or None, records imported, curve, seconds of every assignment change);
    the clock starts once every member process is up, so process start-up is excluded as
    Spark's is."""
    context = multiprocessing.get_context("spawn")
    events = context.Queue()
    go, stop = context.Event(), context.Event()
    group = f"bench-{topic}-{assignor}-{members}-{time.monotonic_ns()}"
    out_dir = work_dir / group
    out_dir.mkdir(parents=True)
    processes = [
        context.Process(
            target=group_member,
            args=(i, bootstrap, group, assignor, topic, str(out_dir), blocking_s, events, go, stop),
            daemon=True,
        )
        for i in range(members)
    ]
    for process in processes:
        process.start()
    ready = 0
    while ready < members:
        kind, *_ = events.get(timeout=120)
        ready += kind == "ready"
    started = time.time()
    go.set()
    # Records re-read after a rebalance count once: a partition's records in the sink are
    # offsets 0 until the highest end any member wrote (it reads on from a commit it made).
    ends: dict[int, int] = {}
    imported = 0
    curve = [(0.0, 0)]
    rebalances: list[float] = []
    drain_s: float | None = None
    while imported < total and time.time() - started < timeout_s:
        try:
            kind, at, *details = events.get(timeout=0.5)
        except queue.Empty:
            continue
        if kind == "assigned":
            rebalances.append(round(at - started, 2))
            continue
        (batch_ends,) = details
        for partition, end in batch_ends.items():
            ends[partition] = max(ends.get(partition, 0), end)
        on_rows(sum(ends.values()) - imported)
        imported = sum(ends.values())
        curve.append((at - started, imported))
    if imported >= total:
        drain_s = curve[-1][0]
    else:
        curve.append((time.time() - started, imported))
    stop.set()
    for process in processes:
        process.join(timeout=15)
        if process.is_alive():
            process.terminate()
    shutil.rmtree(out_dir, ignore_errors=True)
    return drain_s, imported, curve, rebalances


# --- lagless, with a source that notes when each task hands over its records ---------------


def progress_source() -> type:
    """The lagless source under its own name, noting (time, records) of every batch it hands over.

    Registered in place of lagless's source for this run only; defined in a function so the
    benchmark imports pyspark only when it runs lagless. Spark ships the classes to its Python
    workers by value."""
    import pyarrow.compute as pc
    from pyspark.sql.datasource import CaseInsensitiveDict, DataSourceStreamReader
    from pyspark.sql.types import StructType

    from lagless.source.datasource import KafkaDataSource, KafkaStreamReader
    from lagless.source.options import SourceOptions

    class ProgressStreamReader(KafkaStreamReader):
        def __init__(self, options: SourceOptions, progress_dir: str) -> None:
            super().__init__(options)
            self.progress_dir = progress_dir

        def read(self, partition: Any) -> Iterator[Any]:
            log = os.path.join(self.progress_dir, f"{os.getpid()}.log")
            for batch in super().read(partition):
                yield batch
                # Records, or, where the task writes them to the sink itself, its receipt of
                # the records it wrote (executor_write.py), handed over at the task's end.
                names = batch.schema.names
                receipt = "records" in names and "value" not in names
                rows = pc.sum(batch.column("records")).as_py() if receipt else batch.num_rows
                with open(log, "a") as out:
                    out.write(f"{time.time()} {rows or 0}\n")

    class ProgressSource(KafkaDataSource):
        def lagless_options(self) -> CaseInsensitiveDict:
            """The options but this bench's own, which lagless's source refuses (names in any
            case, as Spark hands them)."""
            return CaseInsensitiveDict(
                {k: v for k, v in self.options.items() if k.lower() != PROGRESS_OPTION}
            )

        def schema(self) -> Any:
            return KafkaDataSource(self.lagless_options()).schema()

        def streamReader(self, schema: StructType) -> DataSourceStreamReader:
            return ProgressStreamReader(
                SourceOptions.parse(self.lagless_options()), self.options[PROGRESS_OPTION]
            )

    return ProgressSource


def spark_tasks(event_log: Path) -> list[tuple[float, float]]:
    """(launch, finish) wall-clock seconds of every task in the event log."""
    tasks = []
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        if event["Event"] == "SparkListenerTaskEnd":
            info = event["Task Info"]
            tasks.append((info["Launch Time"] / 1000, info["Finish Time"] / 1000))
    return tasks


def busy_throughput(records: int, tasks: Sequence[SparkTask], cores: int) -> float:
    """Records per second with every core running a task: the records read per second of
    task time, times the cores. Tasks that ran alone in a tail count at their pace too, so
    an idle core never lowers this figure; it can only lengthen the drain."""
    task_seconds = sum(task.finished - task.launched for task in tasks)
    return records * cores / task_seconds


def run_lagless(
    spark: Any, bootstrap: str, topic: str, work_dir: Path, slots: int | None
) -> LaglessRun:
    from lagless.importer.job import run_import
    from lagless.importer.spec import ImportSpec
    from lagless.kafka.config import KafkaConfig

    run_dir = work_dir / f"lagless-{topic}-{time.monotonic_ns()}"
    progress_dir = run_dir / "progress"
    progress_dir.mkdir(parents=True)
    spec = ImportSpec(
        kafka=KafkaConfig(bootstrap),
        topics=(topic,),
        sink_url=f"parquet:///{run_dir / 'lake'}",
        checkpoint=str(run_dir / "checkpoint"),
        table="bench",
        slots=slots,
        # One batch per profile, as an operator sizes a bulk import: the figure is then the
        # planner's, not that of the pause between batches.
        max_bytes_per_batch=ONE_BATCH_BYTES,
        extra_source_options={PROGRESS_OPTION: str(progress_dir)},
    )
    started = time.time()
    summary = run_import(spec, spark=spark)
    drain_s = time.time() - started
    reads = sorted(
        (float(at) - started, int(rows))
        for log in progress_dir.iterdir()
        for at, rows in (line.split() for line in log.read_text().splitlines())
    )
    curve = [(0.0, 0)]
    for at, rows in reads:
        curve.append((at, curve[-1][1] + rows))
    curve.append((drain_s, summary.imported))
    shutil.rmtree(run_dir, ignore_errors=True)
    return LaglessRun("lagless", drain_s, summary.imported, curve, began_at=started)


# --- profiles and topics ---------------------------------------------------------------------


def profiles(args: argparse.Namespace) -> list[Any]:
    from lagless.gen import build_profile

    scales = {"seed-000": args.scale_000, "seed-002": args.scale_002, "uniform": args.scale_uniform}
    return [
        build_profile(
            name, partitions=PARTITIONS, scale=scales[name], record_bytes=args.record_bytes
        )
        for name in args.profiles
    ]


# --- output --------------------------------------------------------------------------------


def ratio(run: Run, ideal_s: float) -> float | None:
    return run.drain_s / ideal_s if run.drain_s is not None else None


def draw(result: ProfileResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=90)
    axes.plot(
        [0, result.ideal_s],
        [0, result.records],
        label=f"ideal: plain consumers' {result.baseline.records_per_second:,.0f} records/s "
        "from the start",
        linestyle="--",
        color="grey",
    )
    for run in result.runs:
        axes.step(
            [t for t, _ in run.curve],
            [n for _, n in run.curve],
            where="post",
            label=run.runner,
            linewidth=2.5 if run.runner == "lagless" else 1.4,
        )
    axes.axhline(result.records, color="black", linewidth=0.6)
    axes.set_xlabel("seconds since start")
    axes.set_ylabel("records imported")
    axes.set_title(
        f"{result.profile}: {result.records:,} records, {result.value_bytes / 1e6:.0f} MB "
        f"over {sum(c > 0 for c in result.counts)} of {len(result.counts)} partitions"
    )
    axes.legend(fontsize="small", loc="lower right")
    figure.text(
        0.01,
        0.01,
        "lagless counts records as its tasks hand them over (a task writing its own files: at "
        "its end)",
        fontsize="x-small",
        color="grey",
    )
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def table(results: Sequence[ProfileResult], spark_startup_s: float) -> Any:
    from rich.table import Table

    shown = Table(
        title=f"Drain time (Spark session start-up {spark_startup_s:.1f} s, excluded); ideal = "
        "records / the plain consumers' rate on the same topic"
    )
    for column in ("profile", "runner", "drain s", "x ideal", "imported", "last rebalance s"):
        shown.add_column(column, justify="left" if column in ("profile", "runner") else "right")
    for result in results:
        for run in result.runs:
            times = ratio(run, result.ideal_s)
            shown.add_row(
                result.profile,
                run.runner,
                f"{run.drain_s:.1f}" if run.drain_s is not None else f"> {run.curve[-1][0]:.0f}",
                f"{times:.2f}" if times is not None else "-",
                f"{run.imported / result.records:.0%}",
                f"{max(run.rebalances):.1f}" if run.rebalances else "-",
            )
        shown.add_section()
    return shown


def lagless_phases(results: Sequence[ProfileResult]) -> list[str]:
    lines = []
    for result in results:
        before, reading, after = result.lagless.phases()
        lines.append(
            f"{result.profile}: plain consumers (2 processes) "
            f"{result.baseline.records_per_second:,.0f} records/s, ideal {result.ideal_s:.1f} s"
        )
        lines.append(
            f"lagless on {result.profile}: {before:.1f} s planning and starting the batch, "
            f"{reading:.1f} s running {len(result.lagless.tasks)} tasks "
            f"({result.busy_records_per_s:,.0f} records/s with every core busy), "
            f"{after:.1f} s committing"
        )
    return lines


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/skew.py",
        description="Drain time of lagless and consumer groups on skewed backlogs.",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"), help="output folder")
    parser.add_argument(
        "--profiles", nargs="+", default=["seed-000", "seed-002", "uniform"], metavar="NAME"
    )
    # Each 15-30 s of lagless's work on 2 cores, so its ~3 s of query start-up weighs little.
    parser.add_argument("--scale-000", type=float, default=30.0, help="seed-000 scale")
    parser.add_argument("--scale-002", type=float, default=120.0, help="seed-002 scale")
    parser.add_argument("--scale-uniform", type=float, default=30.0, help="uniform scale")
    parser.add_argument(
        "--record-bytes",
        type=int,
        default=100,
        help="value size of the small records (seed-002's large ones are 50 KB)",
    )
    parser.add_argument(
        "--members", type=int, nargs="+", default=[2, 16], help="consumer-group sizes"
    )
    parser.add_argument("--assignors", nargs="+", default=list(ASSIGNORS), choices=ASSIGNORS)
    parser.add_argument(
        "--blocking-s",
        type=float,
        default=0.0,
        help="also run seed 002's blocking importer (range, largest --members) with this wait",
    )
    parser.add_argument("--parallelism", type=int, default=2, help="Spark local[N] cores")
    parser.add_argument("--slots", type=int, default=None, help="lagless --slots (job default)")
    parser.add_argument(
        "--run-timeout", type=float, default=90.0, help="give up on a consumer group after this"
    )
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.members) or args.parallelism < 1 or args.blocking_s < 0:
        parser.error("--members and --parallelism must be at least 1, --blocking-s >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from lagless.broker import EmbeddedBroker
    from lagless.gen import explicit, produce_profile
    from lagless.importer.spark import spark_session
    from lagless.kafka.config import KafkaConfig

    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = profiles(args)
    groups = [(a, n, 0.0) for n in args.members for a in args.assignors]
    if args.blocking_s > 0:
        groups.append(("range", max(args.members), args.blocking_s))
    load_before = load()
    results: list[ProfileResult] = []
    with (
        EmbeddedBroker(brokers=1) as broker,
        tempfile.TemporaryDirectory(prefix="lagless-skew-") as work,
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        work_dir = Path(work)
        kafka = KafkaConfig(broker.bootstrap)
        producing = progress.add_task("producing topics", total=len(chosen) + 1)
        broker.create_topic("warm-up", 4)
        produce_profile(kafka, "warm-up", explicit([2000] * 4), compression=COMPRESSION)
        progress.advance(producing)
        produced = {}
        for profile in chosen:
            broker.create_topic(profile.name, PARTITIONS)
            summary = produce_profile(kafka, profile.name, profile, compression=COMPRESSION)
            produced[profile.name] = summary.value_bytes
            progress.advance(producing)

        starting = progress.add_task("starting Spark", total=1)
        began = time.monotonic()
        event_logs = work_dir / "spark-events"
        event_logs.mkdir()
        spark = spark_session(
            f"local[{args.parallelism}]",
            args.parallelism,
            {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": event_logs.as_uri(),
                "spark.eventLog.compress": "false",
                "spark.eventLog.rolling.enabled": "false",
            },
        )
        spark.dataSource.register(progress_source())
        spark_startup_s = time.monotonic() - began
        run_lagless(spark, broker.bootstrap, "warm-up", work_dir, args.slots)
        progress.advance(starting)

        for profile in chosen:
            total = profile.total_records
            measuring = progress.add_task(f"{profile.name}: plain consumers", total=total)
            baseline = plain_consumers(broker.bootstrap, profile.name, PARTITIONS, 2)
            progress.update(measuring, completed=baseline.records)
            running = progress.add_task(f"{profile.name}: lagless", total=total)
            lagless = run_lagless(spark, broker.bootstrap, profile.name, work_dir, args.slots)
            progress.update(running, completed=lagless.imported)
            runs: list[Run] = [lagless]
            for assignor, members, blocking_s in groups:
                name = f"group {assignor}, {members} members"
                if blocking_s:
                    name += f", blocking {blocking_s:g} s"
                running = progress.add_task(f"{profile.name}: {name}", total=total)
                group_drain_s, imported, curve, rebalances = run_group(
                    broker.bootstrap,
                    profile.name,
                    total,
                    members,
                    assignor,
                    blocking_s,
                    work_dir,
                    args.run_timeout,
                    functools.partial(progress.advance, running),
                )
                runs.append(Run(name, group_drain_s, imported, curve, rebalances))
            result = ProfileResult(
                profile.name,
                list(profile.counts),
                list(profile.record_bytes),
                total,
                produced[profile.name],
                args.parallelism,
                runs,
                baseline,
            )
            results.append(result)
        spark.stop()  # which flushes the event log
        (event_log,) = event_logs.iterdir()
        every_task = spark_tasks(event_log)
        for result in results:
            run = result.lagless
            ended_at = run.began_at + (run.drain_s or 0)
            run.tasks = [
                SparkTask(launched - run.began_at, finished - run.began_at)
                for launched, finished in every_task
                if run.began_at <= launched <= ended_at
            ]

    for result in results:
        draw(result, args.out / f"skew-{result.profile}.png")

    console.print(table(results, spark_startup_s))
    for line in lagless_phases(results):
        console.print(line)
    report = {
        "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": load(),
        "spark_startup_s": round(spark_startup_s, 2),
        "spark_master": f"local[{args.parallelism}]",
        "slots": args.slots or f"default (2 x defaultParallelism = {2 * args.parallelism})",
        "sink": "parquet: lagless a folder per batch (Spark writes it); a group a file per poll",
        "profiles": [
            {
                **{k: v for k, v in asdict(result).items() if k not in ("runs", "baseline")},
                "ideal_s": round(result.ideal_s, 2),
                "plain_consumers": {
                    "processes": 2,
                    "records_per_s": round(result.baseline.records_per_second),
                    "seconds": round(result.baseline.seconds, 3),
                },
                "busy_records_per_s": round(result.busy_records_per_s),
                "runs": [
                    {
                        "runner": run.runner,
                        "drain_s": _rounded(run.drain_s, 2),
                        "x_ideal": _rounded(ratio(run, result.ideal_s), 3),
                        "imported": run.imported,
                        "rebalances": run.rebalances,
                        "curve": [(round(s, 3), n) for s, n in run.curve],
                        "tasks": [
                            (round(t.launched, 3), round(t.finished, 3))
                            for t in getattr(run, "tasks", [])
                        ],
                    }
                    for run in result.runs
                ],
            }
            for result in results
        ],
    }
    (args.out / "skew.json").write_text(json.dumps(report, indent=1) + "\n")
    console.print(f"wrote {args.out}/skew.json and {args.out}/skew-<profile>.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
