"""`lagless lag`: a consumer group's lag per partition, in records and seconds, with a status."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from rich.console import Console
from rich.live import Live
from rich.table import Table

from lagless.exceptions import BadInput
from lagless.kafka.config import KafkaConfig, parse_key_values
from lagless.lag.members import KafkaMembership
from lagless.lag.offsets import KafkaOffsetSource, OffsetSource, RecordInfo, require_commits
from lagless.lag.report import History, build_report, collect, committed_records
from lagless.lag.table import markdown_table, rich_table
from lagless.serve import metrics
from lagless.serve.sampler import Sampler, SamplerSettings

SAMPLES_PER_WINDOW = 4
DEFAULT_WINDOW_S = 1.0
WATCH_WINDOW_REFRESHES = 5


def add_group_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", required=True, help="broker addresses, host:port[,...]")
    parser.add_argument("--group", required=True, help="consumer group id")
    parser.add_argument(
        "--kafka-option",
        action="append",
        metavar="KEY=VALUE",
        help="librdkafka setting passed through (repeatable), e.g. security.protocol=SSL",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "lag", help="show a consumer group's lag per partition", description=__doc__
    )
    add_group_arguments(parser)
    parser.add_argument("--topic", help="only this topic (default: every topic the group read)")
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
        help=f"seconds of samples behind the status and time lag "
        f"(default {DEFAULT_WINDOW_S:g}; with --watch, {WATCH_WINDOW_REFRESHES} refreshes)",
    )
    from lagless.cli.serve import add_metric_arguments

    add_metric_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.watch is not None and args.watch <= 0:
        raise BadInput("--watch must be a positive number of seconds")
    if args.watch is not None and (args.json or args.markdown or args.prometheus):
        raise BadInput(
            "--watch redraws the table; it cannot be combined with --json, --markdown or "
            "--prometheus"
        )
    if args.window is not None and args.window < 0:
        raise BadInput("--window cannot be negative")
    if args.retention_warning < 0:
        raise BadInput("--retention-warning cannot be negative")
    config = KafkaConfig.from_options(args.bootstrap, parse_key_values(args.kafka_option))
    source = KafkaOffsetSource(config, args.group, args.topic)
    try:
        require_commits(source, args.topic)
        if args.watch is not None:
            window_s = args.watch * WATCH_WINDOW_REFRESHES if args.window is None else args.window
            watch(args.group, source, args.watch, window_s, Console())
            return 0
        window_s = DEFAULT_WINDOW_S if args.window is None else args.window
        if args.prometheus:
            cluster = args.cluster_name or args.bootstrap
            membership = KafkaMembership(config)
            print(prometheus_once(args.group, source, membership, window_s, cluster, args), end="")
            return 0
        history = History(keep_s=window_s)
        collect(source, history, window_s, window_s / SAMPLES_PER_WINDOW)
        report = build_report(args.group, history, window_s, committed_records(source, history))
    finally:
        source.close()
    now = time.time()
    if args.json:
        print(json.dumps(report.as_json(now), indent=2))
    elif args.markdown:
        print(markdown_table(report, now))
    else:
        Console().print(rich_table(report, now))
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
        return rich_table(build_report(group, history, window_s, found), time.time())

    with Live(table(), console=console, auto_refresh=False) as live:
        try:
            while True:
                sleep(refresh_s)
                live.update(table(), refresh=True)
        except KeyboardInterrupt:
            return


def prometheus_once(
    group: str,
    source: OffsetSource,
    membership: KafkaMembership,
    window_s: float,
    cluster: str,
    args: argparse.Namespace,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """The serve command's metrics for one group, sampled over the window once."""
    interval_s = window_s / SAMPLES_PER_WINDOW
    settings = SamplerSettings(interval_s, window_s, args.retention_warning)
    sampler = Sampler(lambda _group: source, membership, settings, [group])
    for round_number in range(SAMPLES_PER_WINDOW + 1):
        if round_number:
            sleep(interval_s)
        sampler.sample_once()
    return metrics.render(sampler.views(), time.time(), cluster)
