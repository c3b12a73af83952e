"""Throughput of `lagless import --mode bulk`, as users launch it, against the client's speed.

Starts the embedded broker, fills one topic, then reads it, all in one run:

1. the baseline: two plain confluent-kafka consumers (librdkafka's default settings) in
   separate OS processes, each assigned half the partitions from the start, reading to the end
   offsets and touching every record's key and value (no store); timed from when both are
   connected to when the last one is done;
2. kcat reading the topic to its end (when installed), launch to exit, and the same two
   consumers with lagless's reader settings (a deeper prefetch, a short fetch backoff): what the
   client reaches tuned;
2b. the script peer (bench/script_peer.py): the short script a user would write instead, two
   processes with lagless's reader settings writing Parquet files of 1M rows, launch to exit;
   each lagless run's launch to exit is printed as a ratio to the script's;
3. `lagless import --mode bulk --json` launched as a subprocess, once per sink (Parquet,
   Delta, Iceberg, SQLite, and PostgreSQL when --postgres-url is given or initdb is
   installed; with `--sinks ... parquet+s3 delta+s3 iceberg+s3` also the three file stores on
   a throwaway S3 server, SeaweedFS on loopback), so Spark's start-up counts. Measured: launch
   to the first row visible in the sink (polled every 50 ms), launch to exit, records/s over
   the query's own seconds (the summary's `seconds`) and over launch to exit, and both as
   ratios to the baseline.

--breakdown then runs bench/breakdown.py on the same topic: where an import's seconds go.
Prints a table, then one line of JSON for quoting.

--volumes N [N ...] is a scaling run instead: for each backlog a fresh broker (the embedded one
while the backlog fits it, else Tansu: bench/tansu.py), the plain consumers, the script peer
and `lagless import` into Parquet, launch to exit; a table of cost against backlog, one JSON
line, and with --png a chart of it.

    .venv/bin/python bench/import_throughput.py [--records N] [--partitions 24] [--breakdown]
    .venv/bin/python bench/import_throughput.py --volumes 1350000 7200000 30000000 --png F
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import (
    Baseline,
    CliRun,
    Launched,
    import_args,
    kcat,
    plain_consumers,
    postgres_server,
    s3_server,
    sink_url,
)
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.gen.profiles import COMPRESSIONS, DEFAULT_RECORD_BYTES, PARTITION_BYTES_LIMIT
from lagless.kafka.config import KafkaConfig

TOPIC = "bench"
# Typed runs: a store, and the import options that make a column per value field. gen's values
# are {"key", "seq", "partition", "pad"}; key and partition name columns lagless adds, so the
# schema takes the other two (from_json skips fields it is not given).
JSON_SCHEMA = ("--value-format", "json", "--value-schema", "seq BIGINT NOT NULL, pad STRING")
TYPED = {
    f"{store}+json-schema": (store, JSON_SCHEMA)
    for store in ("sqlite", "parquet", "delta", "iceberg")
}
# postgresql: written from the executors; postgresql-driver: each batch through the driver.
SINKS = ("parquet", "delta", "iceberg", "sqlite", "postgresql", "postgresql-driver", *TYPED)
# Tables on S3: a throwaway SeaweedFS on loopback (tests/harness/s3.py), not in the default run.
ON_S3 = ("parquet+s3", "delta+s3", "iceberg+s3")
console = Console(stderr=True)


def _times(seconds: float, script_seconds: float) -> float:
    """seconds over the script's, as printed and as in the JSON: one rounding for both (a
    ratio printed from the unrounded value could read 6.41 where the JSON's 6.415 reads 6.42)."""
    return round(seconds / script_seconds, 3)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=24, help="topic partitions (24)")
    parser.add_argument(
        "--records", type=int, help="records in all (default: as many as the broker keeps, ~7M)"
    )
    parser.add_argument(
        "--record-bytes", type=int, default=DEFAULT_RECORD_BYTES, help="value size (100)"
    )
    parser.add_argument("--compression", choices=COMPRESSIONS, default="zstd")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct keys per partition")
    parser.add_argument(
        "--sinks",
        nargs="+",
        choices=SINKS + ON_S3,
        default=list(SINKS),
        help=f"lagless runs (all but {', '.join(ON_S3)}: those on a throwaway S3 server)",
    )
    parser.add_argument(
        "--postgres-url", help="PostgreSQL to import into (default: a throwaway one via initdb)"
    )
    parser.add_argument("--processes", type=int, default=2, help="baseline consumer processes")
    parser.add_argument("--master", help="lagless import --master (default: its local[*])")
    parser.add_argument(
        "--import-option",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for every lagless import, e.g. --import-option=--slots=8",
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="also run bench/breakdown.py on the topic"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="per import, seconds")
    parser.add_argument(
        "--volumes", type=int, nargs="+", metavar="N", help="a scaling run at these backlogs"
    )
    parser.add_argument(
        "--tansu-above",
        type=int,
        metavar="N",
        help="--volumes: backlogs above N records go to Tansu (default: those the embedded "
        "broker cannot hold)",
    )
    parser.add_argument("--png", type=Path, help="--volumes: a chart of cost against backlog")
    args = parser.parse_args()
    if args.partitions < 1 or args.processes < 1:
        parser.error("--partitions and --processes must be at least 1")
    if args.records is not None and args.records < args.partitions:
        parser.error("--records must be at least --partitions")
    if args.volumes and min(args.volumes) < args.partitions:
        parser.error("--volumes must be at least --partitions")
    return args


def embedded_capacity(args: argparse.Namespace) -> int:
    """Records the embedded broker holds at this size and compression."""
    per_record = explicit([1], args.record_bytes).stored_bytes(0, args.compression)
    return PARTITION_BYTES_LIMIT // per_record * args.partitions


def counts_that_fit(args: argparse.Namespace) -> list[int]:
    total = args.records or embedded_capacity(args)
    share, extra = divmod(total, args.partitions)
    return [share + (p < extra) for p in range(args.partitions)]


def produce(kafka: KafkaConfig, args: argparse.Namespace) -> tuple[int, int]:
    counts = counts_that_fit(args)
    with Progress(
        TextColumn("[bold]producing"),
        BarColumn(),
        TextColumn("{task.completed:>12,.0f} records"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("produce", total=sum(counts))
        produced = produce_profile(
            kafka,
            TOPIC,
            explicit(counts, args.record_bytes),
            keys=args.keys,
            compression=args.compression,
            on_progress=lambda done: bar.update(task, completed=done),
        )
    if produced.truncated_partitions():
        sys.exit(f"the broker dropped the start of partitions {produced.truncated_partitions()}")
    console.print(
        f"produced {produced.records:,} records of {args.record_bytes} B into "
        f"{args.partitions} partitions ({args.compression}) at "
        f"{produced.records_per_second:,.0f} records/s"
    )
    return produced.records, produced.value_bytes


def run_cli(
    sink: str, url: str, bootstrap: str, work: Path, args: argparse.Namespace, records: int
) -> CliRun:
    typed = TYPED[sink][1] if sink in TYPED else ()
    checkpoint = work / f"checkpoint-{sink}"
    cli_args = import_args(bootstrap, TOPIC, url, checkpoint, "bulk", args, *typed)
    with console.status(f"lagless → {sink}: launching") as status:

        def tick(run: Launched) -> None:
            seen = run.first_row_s
            phase = "waiting for the first row" if seen is None else f"first row at {seen:.1f} s"
            status.update(f"lagless → {sink} ({records:,} records): {phase}, {run.elapsed:.0f} s")

        result = Launched(cli_args, sink, url, TOPIC).wait(tick, args.timeout)
    if result.returncode != 0:
        console.print(f"[red]lagless → {sink} exited {result.returncode}[/]\n{result.stderr_tail}")
    else:
        console.print(
            f"lagless → {sink}: first row {result.first_row_s or 0:.1f} s, "
            f"exit {result.exit_s:.1f} s, {result.records:,} records"
        )
    return result


SCRIPT_NAME = "script: 2 processes, consume(10000), pyarrow Parquet"


def run_script_peer(
    bootstrap: str, work: Path, args: argparse.Namespace, value_bytes: int
) -> Baseline:
    """bench/script_peer.py launched as a user runs it: seconds from launch to exit."""
    out = work / "script-peer"
    command = [
        sys.executable,
        str(Path(__file__).with_name("script_peer.py")),
        *("--bootstrap", bootstrap, "--topic", TOPIC, "--out", str(out)),
        *("--processes", str(args.processes)),
    ]
    with console.status("the script peer: two processes writing Parquet"):
        started = time.time()
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        seconds = time.time() - started
    if done.returncode != 0:
        raise RuntimeError(f"script_peer.py exited {done.returncode}: {done.stderr[-2000:]}")
    records = int(json.loads(done.stdout.splitlines()[-1])["records"])
    shutil.rmtree(out, ignore_errors=True)
    name = SCRIPT_NAME.replace("2", str(args.processes), 1)
    return Baseline(name, records, value_bytes, seconds, seconds)


def run_breakdown(bootstrap: str, work: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    command = [
        sys.executable,
        str(Path(__file__).with_name("breakdown.py")),
        "--bootstrap",
        bootstrap,
        "--topic",
        TOPIC,
        "--sink",
        "parquet",
        "--work",
        str(work / "breakdown"),
        *(["--master", args.master] if args.master else []),
    ]
    with console.status("breakdown: an import to Parquet, timed phase by phase"):
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    sys.stderr.write(done.stderr[-3000:] if done.returncode else "")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        console.print(f"[red]breakdown.py exited {done.returncode}[/]")
        return None
    # Its table went to stdout before the JSON line: show it as it printed it.
    print("\n".join(line for line in done.stdout.splitlines() if not line.startswith("{")))
    return dict(json.loads(lines[-1]))


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value else "-"


def report(
    produced: int,
    value_bytes: int,
    baselines: list[Baseline],
    runs: list[CliRun],
    args: argparse.Namespace,
    breakdown: dict[str, Any] | None,
    load_before: list[float],
) -> None:
    base = baselines[0].records_per_second
    script = next(b for b in baselines if b.name.startswith("script"))
    table = Table(
        title=f"{produced:,} records x {args.record_bytes} B, {args.partitions} partitions, "
        f"{args.compression}, {os.cpu_count()} cores",
        caption="query: the import's own seconds (summary JSON); launch: from the process start "
        f"(Spark start-up included). Baseline = {baselines[0].name}. exit x script: launch to "
        "exit over the script peer's (bench/script_peer.py), same run.",
    )
    columns = (
        "reader",
        "records",
        "first row s",
        "exit s",
        "records/s query",
        "records/s launch",
        "x baseline query",
        "x baseline launch",
        "exit x script",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "reader" else "right")
    for b in baselines:
        launch_rate = b.records / b.launch_s if b.launch_s else 0.0
        table.add_row(
            b.name,
            f"{b.records:,}",
            "-",
            f"{b.launch_s:.2f}",
            _rate(b.records_per_second),
            _rate(launch_rate),
            f"{b.records_per_second / base:.3f}",
            f"{launch_rate / base:.3f}",
            f"{_times(b.launch_s, script.launch_s):.2f}",
        )
    for run in runs:
        ok = run.returncode == 0
        table.add_row(
            f"lagless → {run.sink}" + ("" if ok else f" (exit {run.returncode})"),
            f"{run.records:,}",
            f"{run.first_row_s:.1f}" if run.first_row_s is not None else "-",
            f"{run.exit_s:.1f}",
            _rate(run.per_second_of_query()),
            _rate(run.per_second_of_launch()),
            f"{run.per_second_of_query() / base:.3f}" if ok else "-",
            f"{run.per_second_of_launch() / base:.3f}" if ok else "-",
            f"{_times(run.exit_s, script.launch_s):.2f}" if ok else "-",
        )
    Console(width=max(Console().width, 150)).print(table)
    for run in runs:
        if run.returncode == 0:
            print(
                f"lagless → {run.sink}: launch to exit {run.exit_s:.1f} s = "
                f"{_times(run.exit_s, script.launch_s):.2f}x the script's {script.launch_s:.1f} s"
            )
    if breakdown is not None:
        total = breakdown["launch_to_exit_s"]
        print(
            f"breakdown.py (Parquet, its own run): launch to exit {total:.1f} s = "
            f"{_times(total, script.launch_s):.2f}x the script's; its phases are printed above"
        )
    figures: dict[str, Any] = {
        "records": produced,
        "value_bytes": value_bytes,
        "record_bytes": args.record_bytes,
        "partitions": args.partitions,
        "compression": args.compression,
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    for index, b in enumerate(baselines):
        key = "baseline" if index == 0 else re.sub(r"\W+", "_", b.name.lower()).strip("_")
        key = "script" if b is script else key
        figures[key] = {
            "name": b.name,
            "records_per_s": round(b.records_per_second),
            "mb_per_s": round(b.mb_per_second, 2),
            "seconds": round(b.seconds, 3),
            "launch_to_exit_s": round(b.launch_s, 3),
            "ratio": round(b.records_per_second / base, 4),
        }
    for run in runs:
        figures[run.sink] = {
            "exit_code": run.returncode,
            "records": run.records,
            "first_row_s": None if run.first_row_s is None else round(run.first_row_s, 2),
            "exit_s": round(run.exit_s, 2),
            "query_s": round(run.query_s, 2),
            "records_per_s_query": round(run.per_second_of_query()),
            "records_per_s_launch": round(run.per_second_of_launch()),
            "ratio_query": round(run.per_second_of_query() / base, 4),
            "ratio_launch": round(run.per_second_of_launch() / base, 4),
            "exit_x_script": _times(run.exit_s, script.launch_s),
        }
    if breakdown is not None:
        kept = ("launch_to_exit_s", "bar_records_per_s", "where", "phases")
        figures["breakdown"] = {k: breakdown[k] for k in kept}
        figures["breakdown"]["exit_x_script"] = _times(
            breakdown["launch_to_exit_s"], script.launch_s
        )
    print(json.dumps(figures))


def main() -> int:
    args = parse_args()
    if args.volumes:
        return scaling(args)
    load_before = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="lagless-bench-"))
    stop_postgres = stop_s3 = None
    try:
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            kafka = KafkaConfig(broker.bootstrap)
            produced, value_bytes = produce(kafka, args)
            with console.status(f"baseline: {args.processes} plain consumer processes"):
                baselines = [
                    plain_consumers(broker.bootstrap, TOPIC, args.partitions, args.processes)
                ]
            with console.status(f"{args.processes} consumer processes with lagless's settings"):
                tuned = plain_consumers(
                    broker.bootstrap, TOPIC, args.partitions, args.processes, tuned=True
                )
            with console.status("kcat"):
                found = kcat(broker.bootstrap, TOPIC, value_bytes)
            if found is None:
                console.print("kcat not installed (apt-get install kcat): no kcat figure")
            else:
                baselines.append(found)
            baselines.append(tuned)
            script = run_script_peer(broker.bootstrap, work, args, value_bytes)
            baselines.append(script)
            for b in baselines:
                console.print(f"{b.name}: {b.records_per_second:,.0f} records/s")
            postgres_url = args.postgres_url
            if any(s.startswith("postgresql") for s in args.sinks) and not postgres_url:
                with console.status("starting a throwaway PostgreSQL"):
                    postgres_url, stop_postgres = postgres_server()
                if postgres_url is None:
                    console.print("no --postgres-url and initdb not installed: no PostgreSQL run")
            s3 = None
            if any(s in ON_S3 for s in args.sinks):
                with console.status("starting a throwaway S3 server (SeaweedFS)"):
                    s3, stop_s3 = s3_server()
            runs = []
            for sink in args.sinks:
                if sink.startswith("postgresql") and not postgres_url:
                    continue
                folder = work / sink
                folder.mkdir()
                kind = TYPED[sink][0] if sink in TYPED else sink
                url = sink_url(kind, folder, postgres_url, s3)
                runs.append(run_cli(sink, url, broker.bootstrap, folder, args, produced))
                if sink.startswith("postgresql"):
                    _drop_table(postgres_url)
                if sink == "postgresql":
                    with console.status("the PostgreSQL sink alone, rows already in Arrow"):
                        baselines.append(store_alone(url, produced, args.record_bytes))
                        _drop_table(url)
            breakdown = run_breakdown(broker.bootstrap, work, args) if args.breakdown else None
        wrong = [b.name for b in baselines if b.records != produced]  # the store alone too
        wrong += [f"lagless → {r.sink}" for r in runs if r.records != produced]
        report(produced, value_bytes, baselines, runs, args, breakdown, load_before)
        if wrong:
            console.print(f"[red]read a different number of records than produced: {wrong}[/]")
            return 1
        return 0 if all(r.returncode == 0 for r in runs) else 1
    finally:
        if stop_postgres is not None:
            stop_postgres()
        if stop_s3 is not None:
            stop_s3()
        shutil.rmtree(work, ignore_errors=True)


# --- the scaling run ---------------------------------------------------------------------------


def scaling(args: argparse.Namespace) -> int:
    """Per backlog: plain consumers, the script peer and lagless → Parquet, launch to exit."""
    from tansu import TansuBroker, fill

    load_before = [round(x, 2) for x in os.getloadavg()]
    limit = args.tansu_above if args.tansu_above is not None else embedded_capacity(args)
    points: list[dict[str, Any]] = []
    for volume in sorted(args.volumes):
        args.records = volume
        on_tansu = volume > limit
        work = Path(tempfile.mkdtemp(prefix="lagless-bench-"))
        broker: Any = TansuBroker() if on_tansu else EmbeddedBroker(topics={TOPIC: args.partitions})
        try:
            with broker:
                if on_tansu:
                    broker.create_topic(TOPIC, args.partitions)
                    with console.status(f"producing {volume:,} records to Tansu"):
                        produced, value_bytes = fill(
                            broker.bootstrap,
                            TOPIC,
                            counts_that_fit(args),
                            args.record_bytes,
                            args.compression,
                            args.keys,
                        )
                else:
                    produced, value_bytes = produce(KafkaConfig(broker.bootstrap), args)
                with console.status(f"{volume:,}: {args.processes} plain consumer processes"):
                    plain = plain_consumers(
                        broker.bootstrap, TOPIC, args.partitions, args.processes
                    )
                script = run_script_peer(broker.bootstrap, work, args, value_bytes)
                folder = work / "parquet"
                folder.mkdir()
                run = run_cli(
                    "parquet", sink_url("parquet", folder), broker.bootstrap, folder, args, produced
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if run.returncode != 0 or {plain.records, script.records, run.records} != {produced}:
            console.print(f"[red]{volume:,}: a reader did not read the {produced:,} records[/]")
            return 1
        points.append(
            {
                "records": produced,
                "broker": "tansu" if on_tansu else "embedded",
                "plain_consumers_s": round(plain.seconds, 3),
                "plain_consumers_launch_to_exit_s": round(plain.launch_s, 3),
                "script_launch_to_exit_s": round(script.launch_s, 3),
                "lagless_launch_to_exit_s": round(run.exit_s, 3),
                "lagless_query_s": round(run.query_s, 3),
                "lagless_first_row_s": run.first_row_s and round(run.first_row_s, 2),
                "lagless_x_script": _times(run.exit_s, script.launch_s),
                "lagless_rate_x_script": round(script.launch_s / run.exit_s, 3),
            }
        )
    show_scaling(points, args)
    figures = {
        "scaling": points,
        "record_bytes": args.record_bytes,
        "partitions": args.partitions,
        "compression": args.compression,
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    if args.png:
        draw_scaling(points, args)
        console.print(f"wrote {args.png}")
    print(json.dumps(figures))
    return 0


def show_scaling(points: list[dict[str, Any]], args: argparse.Namespace) -> None:
    table = Table(
        title=f"cost against backlog: records of {args.record_bytes} B, {args.partitions} "
        f"partitions, {args.compression}, {os.cpu_count()} cores (launch to exit, s)",
        caption="plain consumers: their read alone (excluding their start-up); the script and "
        "lagless: launch to exit. Rate x script: lagless's records/s over the script's.",
    )
    columns = ("records", "broker", "plain consumers", "script", "lagless", "lagless query")
    for column in (*columns, "x script", "rate x script"):
        table.add_column(column, justify="left" if column == "broker" else "right")
    for p in points:
        table.add_row(
            f"{p['records']:,}",
            p["broker"],
            f"{p['plain_consumers_s']:.2f}",
            f"{p['script_launch_to_exit_s']:.2f}",
            f"{p['lagless_launch_to_exit_s']:.2f}",
            f"{p['lagless_query_s']:.2f}",
            f"{p['lagless_x_script']:.2f}",
            f"{p['lagless_rate_x_script']:.2f}",
        )
    Console(width=max(Console().width, 120)).print(table)
    for p in points:
        print(
            f"{p['records']:,} records: lagless {p['lagless_launch_to_exit_s']:.1f} s = "
            f"{p['lagless_x_script']:.2f}x the script's {p['script_launch_to_exit_s']:.1f} s"
        )


def draw_scaling(points: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    records = [p["records"] for p in points]
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=90)
    for key, label in (
        ("lagless_launch_to_exit_s", "lagless import → Parquet, launch to exit"),
        ("script_launch_to_exit_s", "the script (2 processes, pyarrow), launch to exit"),
        ("plain_consumers_s", "2 plain consumers reading, no store"),
    ):
        axes.plot(records, [p[key] for p in points], marker="o", label=label)
    for p in points:
        axes.annotate(
            f"{p['lagless_x_script']:.2f}x",
            (p["records"], p["lagless_launch_to_exit_s"]),
            textcoords="offset points",
            xytext=(0, 6),
            ha="center",
            fontsize="small",
        )
    axes.set_xlabel("backlog (records)")
    axes.set_ylabel("seconds")
    axes.set_title(
        f"cost against backlog: {args.record_bytes} B records, {args.partitions} partitions, "
        f"{os.cpu_count()} cores"
    )
    axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:,.0f}"))
    axes.set_xlim(left=0)
    axes.set_ylim(bottom=0)
    axes.legend(fontsize="small", loc="upper left")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.png)
    plt.close(figure)


def store_alone(url: str, records: int, record_bytes: int) -> Baseline:
    """The floor a store sets: lagless's own sink writing `records` rows of the same shape that
    are already in memory as Arrow (no Kafka, no Spark), into a fresh table."""
    import pyarrow as pa

    from lagless.sinks import Target, sink_from_url

    rows = pa.table(
        {
            "topic": pa.array([TOPIC] * records, pa.string()),
            "partition": pa.array([i % 24 for i in range(records)], pa.int32()),
            "offset": pa.array(range(records), pa.int64()),
            "key": pa.array([b"k-%d" % (i % 1000) for i in range(records)], pa.binary()),
            "value": pa.array([b"x" * record_bytes] * records, pa.binary()),
            "timestamp": pa.array([1_700_000_000_000] * records, pa.int64()),
        }
    )
    sink = sink_from_url(url)
    target = Target(TOPIC, "append", "raw")
    sink.prepare(target)
    started = time.perf_counter()
    written = sink.write_arrow(rows.to_reader(), target, dead_letters=False)  # type: ignore[attr-defined]
    seconds = time.perf_counter() - started
    return Baseline(
        "PostgreSQL sink alone (rows in Arrow)",
        written,
        rows.nbytes,
        seconds,
        seconds,
    )


def _drop_table(url: str) -> None:
    """A --postgres-url database keeps nothing of the bench."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{TOPIC}", "{TOPIC}_dlq"')


if __name__ == "__main__":
    sys.exit(main())
