"""`lagless lag`: a consumer group's lag per partition, in records and seconds, with a status;
with --sink, a table's own lag (what its ledger holds against the log)."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.table import Table

from lagless.cli.options import (
    add_group_arguments,
    add_metric_arguments,
    cluster_name,
    kafka_config,
    tell_waiting,
)
from lagless.exceptions import BadInput
from lagless.importer.table_lag import PartitionInTable, table_health, table_lag, unknown_rows
from lagless.lag.offsets import (
    FleetSource,
    KafkaOffsetSource,
    OffsetSource,
    RecordInfo,
    require_commits,
)
from lagless.lag.report import History, build_report, collect, committed_records, watched_span
from lagless.lag.status import DEFAULT_WINDOW_S
from lagless.lag.table import markdown_table, print_table, rich_table
from lagless.progress import unknown_text
from lagless.serve import metrics
from lagless.serve.sampler import Sampler, SamplerSettings
from lagless.sinks.maintenance import Health, Policy

SAMPLES_PER_WINDOW = 4
WATCH_WINDOW_REFRESHES = 5


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lag", help="show a consumer group's lag per partition", description=__doc__
    )
    add_group_arguments(parser, group_required=False)
    parser.add_argument(
        "--sink",
        metavar="URL",
        help="instead of a group: the table's own lag in this store (what its ledger holds "
        "against the log), whatever group or checkpoint wrote it; needs --topic",
    )
    parser.add_argument(
        "--table", metavar="TABLE", help="with --sink: the table (default: the topic name)"
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON")
    output.add_argument("--markdown", action="store_true", help="print a markdown table")
    output.add_argument(
        "--prometheus",
        action="store_true",
        help="print the metrics of `lagless serve` once, in Prometheus's text format",
    )
    parser.add_argument(
        "--watch", type=float, metavar="N", help="redraw every N seconds until Ctrl-C"
    )
    parser.add_argument(
        "--window",
        type=float,
        metavar="S",
        help=f"seconds of samples behind the status and time lag, as doctor's --seconds and "
        f"serve's --window (default: {DEFAULT_WINDOW_S:g}; with --watch, "
        f"{WATCH_WINDOW_REFRESHES} refreshes; 0: one sample)",
    )
    add_metric_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.sink is not None:
        return run_table_lag(args)
    if args.group is None:
        raise BadInput("lag needs --group (a consumer group's lag) or --sink (a table's)")
    # Written so NaN is refused too (every comparison with it is false).
    if args.watch is not None and not 0 < args.watch < math.inf:
        raise BadInput("--watch must be a positive number of seconds")
    if args.watch is not None and (args.json or args.markdown or args.prometheus):
        raise BadInput(
            "--watch redraws the table; it cannot be combined with --json, --markdown or "
            "--prometheus"
        )
    if args.window is not None and not 0 <= args.window < math.inf:
        raise BadInput("--window cannot be negative")
    if args.retention_warning < 0:
        raise BadInput("--retention-warning cannot be negative")
    config = kafka_config(args)
    source = KafkaOffsetSource(config, args.group, args.topic)
    try:
        require_commits(source, args.topic)
        if args.watch is not None:
            window_s = args.watch * WATCH_WINDOW_REFRESHES if args.window is None else args.window
            watch(args.group, source, args.watch, window_s, Console())
            return 0
        window_s = DEFAULT_WINDOW_S if args.window is None else args.window
        if window_s > 0:
            tell_waiting(
                f"sampling group {args.group} for {window_s:g} s: its status compares the "
                "committed offsets over time (--window 0 answers at once, from one sample)"
            )
        if args.prometheus:
            text = prometheus_once(args.group, source.fleet, window_s, cluster_name(args), args)
            print(text, end="")
            return 0
        interval_s = window_s / SAMPLES_PER_WINDOW
        history = History(keep_s=window_s + interval_s)
        collect(source, history, window_s, interval_s)
        report = build_report(
            args.group,
            history,
            watched_span(history, window_s),
            committed_records(source, history),
            source.description,
        )
    finally:
        source.close()
    now = time.time()
    if args.json:
        print(json.dumps(report.as_json(now), indent=2))
    elif args.markdown:
        print(markdown_table(report, now))
    else:
        print_table(rich_table(report, now))
    return 0


def watch(
    group: str,
    source: OffsetSource,
    refresh_s: float,
    window_s: float,
    console: Console,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Redraw the table in place every refresh_s seconds until Ctrl-C."""
    # Twice the window, so a STOP (no move for longer than the window) can be seen.
    history = History(keep_s=2 * window_s)
    records: dict[tuple[str, int], tuple[int, RecordInfo]] = {}

    def table() -> Table:
        history.add(source.sample())
        found = committed_records(source, history, records)
        report = build_report(group, history, window_s, found, source.description)
        return rich_table(report, time.time())

    with Live(table(), console=console, auto_refresh=False) as live:
        try:
            while True:
                sleep(refresh_s)
                live.update(table(), refresh=True)
        except KeyboardInterrupt:
            return


def prometheus_once(
    group: str,
    source: FleetSource,
    window_s: float,
    cluster: str,
    args: argparse.Namespace,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """The serve command's metrics for one group, sampled over the window once."""
    interval_s = window_s / SAMPLES_PER_WINDOW
    settings = SamplerSettings(interval_s, window_s, args.retention_warning)
    sampler = Sampler(source, settings, [group])
    for round_number in range(SAMPLES_PER_WINDOW + 1):
        if round_number:
            sleep(interval_s)
        sampler.sample_once()
    sampler.settle(timeout_s=interval_s + 2.0)
    return metrics.render(sampler.views(), time.time(), cluster)


def run_table_lag(args: argparse.Namespace) -> int:
    """`lag --sink URL --topic T [--table T]`: per partition, the first offset the table does
    not hold, the log's end, the records behind and the oldest missing record's age; per table
    of a folder store, its files (with --json: {"partitions": [...], "tables": [...]})."""
    if args.topic is None:
        raise BadInput("lag --sink needs --topic (the topic the table is fed from)")
    if args.group is not None or args.watch is not None or args.prometheus or args.markdown:
        raise BadInput("lag --sink takes --topic, --table and --json only")
    table = args.table or args.topic
    rows = table_lag(kafka_config(args), args.sink, table, [args.topic])
    tables = table_health(args.sink, table, Policy())
    unknown = unknown_rows(args.sink, table)
    if args.json:
        shown = {
            "partitions": [row.as_json() for row in rows],
            "tables": [each.as_json() for each in tables],
            "unknown_rows": unknown,
        }
        print(json.dumps(shown, indent=2))
        return 0
    console = Console()
    print_table(partitions_table(table, rows), console)
    mirror = [row.source_lag_s for row in rows if row.source_lag_s is not None]
    if mirror:
        console.print(
            f"mirror {table}: {sum(row.behind for row in rows):,} change events and "
            f"{max(mirror):,.1f} s behind the database"
        )
    if any(row.incomplete for row in rows):
        print(incomplete_line(table, rows))
    if unknown:
        console.print(f"mirror {table}: {unknown_text(unknown)}", highlight=False, markup=False)
    for row in rows:
        if row.another_topic is not None:
            print(
                f"table {table} holds the history of another topic of that name (deleted and "
                f"recreated since): {row.another_topic}"
            )
    if tables:
        print_table(health_table(tables), console)
    return 0


def incomplete_line(table: str, rows: list[PartitionInTable]) -> str:
    """What a table lacks for good: records it skipped below what it holds, and records the
    log deleted before any import read them; and the way to make it whole."""
    parts = []
    skipped = [row for row in rows if row.skipped]
    if skipped:
        parts.append(
            f"{sum(row.skipped for row in skipped):,} records of {_partitions(skipped)} were "
            "deleted by the broker before they were read and skipped (--skip-lost-offsets)"
        )
    gone = [row for row in rows if row.deleted_unread]
    if gone:
        parts.append(
            f"{sum(row.deleted_unread for row in gone):,} records of {_partitions(gone)} it "
            "lacks are no longer in the log"
        )
    return (
        f"table {table} is incomplete: {'; '.join(parts)}. A mirror: re-snapshot the table "
        "into a new --table and --checkpoint (docs/mirror.md, Re-snapshot a table)"
    )


def _partitions(rows: list[PartitionInTable]) -> str:
    named = [f"{row.topic}[{row.partition}]" for row in rows[:3]]
    more = f" and {len(rows) - 3} more partitions" if len(rows) > 3 else ""
    return ", ".join(named) + more


def partitions_table(table: str, rows: list[PartitionInTable]) -> Table:
    """Per partition, what the table holds against the log (a mirror's: and how far it is
    behind the database)."""
    mirror = any(row.source_lag_s is not None for row in rows)
    shown = Table(title=f"table {table}: what it holds against the log")
    names = ["topic", "partition", "table holds up to", "log end", "behind", "time lag"]
    for name in names + (["behind the database"] if mirror else []):
        shown.add_column(name, justify="left" if name == "topic" else "right")
    for row in rows:
        held = "nothing" if row.held is None else f"{row.held:,}"
        cells = [row.topic, str(row.partition), held, f"{row.log_end:,}", f"{row.behind:,}"]
        cells.append(_seconds(row.time_lag_s))
        if mirror:
            cells.append(_seconds(row.source_lag_s))
        shown.add_row(*cells)
    return shown


def health_table(tables: list[Health]) -> Table:
    shown = Table(title="its files (docs/maintenance.md)")
    columns = ("table", "data files", "small", "versions", "on disk", "live")
    for name in columns:
        shown.add_column(name, justify="left" if name == "table" else "right")
    for each in tables:
        shown.add_row(
            each.table,
            f"{each.data_files:,}",
            f"{each.small_file_share:.0%}",
            f"{each.versions:,}",
            f"{each.bytes_on_disk / 1e6:,.1f} MB",
            f"{each.live_bytes / 1e6:,.1f} MB",
        )
    return shown


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} s"
