"""Peak memory of a bulk `lagless import` of large records, per kind of process.

Fills the embedded broker with a seed-002-shaped backlog whose three large-record partitions
hold ~800 KB JSON values (compressible, so the broker's ~5 MiB a partition holds hundreds:
~1.2 GB of values in all by default), launches `lagless import --mode bulk` as users do, and
every --sample-ms reads /proc for all its descendant processes: resident memory (VmRSS,
sampled) and the kernel's high-water mark (VmHWM, exact), split by kind: the driver's Python
(the CLI), the JVM, PySpark's worker daemon and the Python workers it forks. Target of the
issue: a Python worker <= 512 MiB.

    .venv/bin/python bench/memory.py [--large-records 100] [--large-record-bytes 800000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import (
    Launched,
    cmdline,
    descendants,
    import_args,
    memory_kib,
    postgres_server,
    sink_url,
)
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.gen import produce_profile
from lagless.gen.profiles import (
    MAX_RECORD_BYTES,
    PARTITION_BYTES_LIMIT,
    SEED_002_LARGE,
    Profile,
    explicit,
    seed_002,
)
from lagless.kafka.config import KafkaConfig

TOPIC = "memory"
COMPRESSION = "zstd"
WORKER_TARGET_MIB = 512
KINDS = ("driver python", "jvm", "python daemon", "python worker", "other")
console = Console(stderr=True)


def profile(args: argparse.Namespace) -> Profile:
    """seed-002's shape: its large partitions get `large_records` values of the large size."""
    base = seed_002(args.scale)
    per_record = explicit([1], args.large_record_bytes).stored_bytes(0, COMPRESSION)
    large = args.large_records or PARTITION_BYTES_LIMIT // per_record
    counts = [large if p in SEED_002_LARGE else n for p, n in enumerate(base.counts)]
    sizes = [
        args.large_record_bytes if p in SEED_002_LARGE else size
        for p, size in enumerate(base.record_bytes)
    ]
    return Profile("seed-002-large", tuple(counts), tuple(sizes))


@dataclass
class Peaks:
    """Per process: its kind, and the largest VmRSS sampled and VmHWM read (KiB)."""

    kind: dict[int, str] = field(default_factory=dict)
    rss: dict[int, int] = field(default_factory=dict)
    hwm: dict[int, int] = field(default_factory=dict)
    # Per kind, the largest sum over its processes in one sample.
    kind_sum: dict[str, int] = field(default_factory=dict)
    total: int = 0
    samples: int = 0


def classify(pid: int, root: int, known: dict[int, str]) -> str:
    """The kind of a process; its parent's kind must be known (descendants lists parents
    first)."""
    if pid == root:
        return "driver python"
    command = cmdline(pid)
    program = os.path.basename(command[0]) if command else ""
    if program == "java":
        return "jvm"
    if program.startswith("python"):
        # Workers are forked from the daemon: same command line, the daemon as parent.
        if "pyspark.daemon" in command:
            parent = known.get(_ppid(pid))
            return "python worker" if parent == "python daemon" else "python daemon"
        return "python worker"
    return "other"


class Sampler(threading.Thread):
    def __init__(self, root: int, every_s: float) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.every_s = every_s
        self.peaks = Peaks()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            self.sample()
            self.stop.wait(max(0.0, self.every_s - (time.monotonic() - began)))

    def sample(self) -> None:
        peaks = self.peaks
        sums = dict.fromkeys(KINDS, 0)
        for pid in descendants(self.root):
            memory = memory_kib(pid)
            if memory is None:
                continue
            if peaks.kind.get(pid, "other") == "other":
                # Again while "other": spark-class's bash execs the JVM under its own pid.
                peaks.kind[pid] = classify(pid, self.root, peaks.kind)
            kind = peaks.kind[pid]
            rss, hwm = memory
            peaks.rss[pid] = max(peaks.rss.get(pid, 0), rss)
            peaks.hwm[pid] = max(peaks.hwm.get(pid, 0), hwm)
            sums[kind] += rss
        for kind, total in sums.items():
            peaks.kind_sum[kind] = max(peaks.kind_sum.get(kind, 0), total)
        peaks.total = max(peaks.total, sum(sums.values()))
        peaks.samples += 1


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def mib(kib: int) -> float:
    return kib / 1024


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--large-records",
        type=int,
        help="records in each large partition (default: as many as the broker keeps)",
    )
    parser.add_argument("--large-record-bytes", type=int, default=800_000)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="seed-002 scale of the small-record partitions"
    )
    parser.add_argument(
        "--sink",
        choices=("parquet", "delta", "sqlite", "postgresql", "postgresql-driver"),
        default="parquet",
        help="postgresql-driver: each batch through the driver as one Arrow table",
    )
    parser.add_argument(
        "--postgres-url", help="PostgreSQL to import into (default: a throwaway one via initdb)"
    )
    parser.add_argument("--sample-ms", type=float, default=100.0)
    parser.add_argument("--master", help="lagless import --master")
    parser.add_argument(
        "--import-option", action="append", default=[], metavar="ARG", help="extra import arg"
    )
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    if not 1 <= args.large_record_bytes <= MAX_RECORD_BYTES:
        parser.error(f"--large-record-bytes must be 1..{MAX_RECORD_BYTES}")
    return args


def main() -> int:
    args = parse_args()
    chosen = profile(args)
    load_before = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="lagless-memory-"))
    postgres_url, stop_postgres = args.postgres_url, None
    if args.sink.startswith("postgresql") and not postgres_url:
        postgres_url, stop_postgres = postgres_server()
        if postgres_url is None:
            sys.exit("no --postgres-url and initdb not installed")
    try:
        with EmbeddedBroker(topics={TOPIC: chosen.partitions}) as broker:
            with Progress(
                TextColumn("[bold]producing"),
                BarColumn(),
                TextColumn("{task.completed:>10,.0f} records"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as bar:
                task = bar.add_task("produce", total=chosen.total_records)
                produced = produce_profile(
                    KafkaConfig(broker.bootstrap),
                    TOPIC,
                    chosen,
                    compression=COMPRESSION,
                    on_progress=lambda done: bar.update(task, completed=done),
                )
            if produced.truncated_partitions():
                sys.exit(f"the broker dropped the start of {produced.truncated_partitions()}")
            console.print(
                f"produced {produced.records:,} records, {produced.value_bytes / 1e6:,.0f} MB of "
                f"values ({len(SEED_002_LARGE)} partitions of "
                f"{chosen.counts[SEED_002_LARGE[0]]:,} x {args.large_record_bytes:,} B)"
            )
            url = sink_url(args.sink, work, postgres_url)
            cli_args = import_args(broker.bootstrap, TOPIC, url, work / "checkpoint", "bulk", args)
            launched = Launched(cli_args, args.sink, url, TOPIC)
            sampler = Sampler(launched.process.pid, args.sample_ms / 1000)
            sampler.start()
            with console.status("importing") as status:

                def tick(run: Launched) -> None:
                    worst = max(
                        (
                            rss
                            for pid, rss in sampler.peaks.rss.items()
                            if sampler.peaks.kind.get(pid) == "python worker"
                        ),
                        default=0,
                    )
                    status.update(
                        f"importing, {run.elapsed:.0f} s; peak Python worker so far "
                        f"{mib(worst):,.0f} MiB"
                    )

                result = launched.wait(tick, args.timeout)
            sampler.stop.set()
            sampler.join()
    finally:
        if stop_postgres is not None:
            stop_postgres()
        shutil.rmtree(work, ignore_errors=True)
    report = summarize(sampler.peaks, result.returncode, result.summary, args, produced.records)
    report["load_before"] = load_before
    report["load_after"] = [round(x, 2) for x in os.getloadavg()]
    report["launch_to_exit_s"] = round(result.exit_s, 1)
    show(report)
    print(json.dumps(report))
    if result.returncode != 0:
        console.print(f"[red]import exited {result.returncode}[/]\n{result.stderr_tail}")
        return 1
    return 0


def summarize(
    peaks: Peaks, code: int, summary: dict[str, Any], args: argparse.Namespace, records: int
) -> dict[str, Any]:
    kinds: dict[str, Any] = {}
    for kind in KINDS:
        pids = [pid for pid, k in peaks.kind.items() if k == kind]
        if not pids:
            continue
        kinds[kind] = {
            "processes": len(pids),
            "max_rss_mib": round(mib(max(peaks.rss[p] for p in pids)), 1),
            "max_hwm_mib": round(mib(max(peaks.hwm[p] for p in pids)), 1),
            "max_sum_rss_mib": round(mib(peaks.kind_sum.get(kind, 0)), 1),
        }
    worker = kinds.get("python worker", {}).get("max_hwm_mib")
    return {
        "sink": args.sink,
        "import_options": args.import_option,
        "records": records,
        "imported": summary.get("records"),
        "large_record_bytes": args.large_record_bytes,
        "exit_code": code,
        "samples": peaks.samples,
        "sample_ms": args.sample_ms,
        "kinds": kinds,
        "max_total_rss_mib": round(mib(peaks.total), 1),
        "python_worker_target_mib": WORKER_TARGET_MIB,
        "python_worker_within_target": None if worker is None else worker <= WORKER_TARGET_MIB,
    }


def show(report: dict[str, Any]) -> None:
    verdict = report["python_worker_within_target"]
    table = Table(
        title=f"peak memory, bulk import of {report['records']:,} records "
        f"({report['large_record_bytes']:,} B large ones) → {report['sink']}",
        caption=f"{report['samples']} samples every {report['sample_ms']:g} ms; HWM = the "
        f"kernel's peak RSS of a process; all processes at once peaked at "
        f"{report['max_total_rss_mib']:,.0f} MiB. Python worker <= "
        f"{WORKER_TARGET_MIB} MiB: {'yes' if verdict else 'no' if verdict is False else '-'}",
    )
    for column in ("process kind", "processes", "max RSS MiB", "max HWM MiB", "max sum MiB"):
        table.add_column(column, justify="left" if column == "process kind" else "right")
    for kind, k in report["kinds"].items():
        table.add_row(
            kind,
            str(k["processes"]),
            f"{k['max_rss_mib']:,.0f}",
            f"{k['max_hwm_mib']:,.0f}",
            f"{k['max_sum_rss_mib']:,.0f}",
        )
    Console(width=max(Console().width, 110)).print(table)


if __name__ == "__main__":
    sys.exit(main())
