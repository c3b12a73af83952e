"""`lagless simulate`: how a consumer group would drain a backlog, next to lagless's planner."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from lagless.cli.options import at_least_one, positive_number, positive_seconds
from lagless.exceptions import BadInput
from lagless.lag.chart import write_chart
from lagless.lag.simulate import (
    format_duration,
    ideal_drain_s,
    parse_counts,
    parse_lag_table,
    simulate_all,
)
from lagless.lag.table import print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="predict how a consumer group drains a backlog, per assignor",
        description=__doc__,
    )
    backlog = parser.add_mutually_exclusive_group(required=True)
    backlog.add_argument(
        "--counts", metavar="N,N,...", help="records left per partition: 9497160,9478898,..."
    )
    backlog.add_argument(
        "--lag-table", type=Path, metavar="FILE", help="a pasted markdown lag table"
    )
    parser.add_argument(
        "--consumers", type=at_least_one, required=True, metavar="N", help="consumers in the group"
    )
    parser.add_argument(
        "--rate",
        type=positive_number,
        default=10_000.0,
        metavar="N",
        help="records per second per consumer (default: %(default)g)",
    )
    parser.add_argument(
        "--timeout-s",
        type=positive_seconds,
        default=60.0,
        metavar="S",
        help="how long a blocking consumer waits on drained partitions before it is dropped "
        "(default: %(default)g)",
    )
    parser.add_argument("--png", type=Path, metavar="FILE", help="write a chart of the drain")
    parser.set_defaults(func=run)


def _backlog(args: argparse.Namespace) -> list[int]:
    if args.counts is not None:
        return parse_counts(args.counts)
    try:
        text = args.lag_table.read_text()
    except OSError as exc:
        raise BadInput(f"cannot read {args.lag_table}: {exc.strerror}") from None
    return parse_lag_table(text)


def run(args: argparse.Namespace) -> int:
    backlog = _backlog(args)
    drains = simulate_all(backlog, args.consumers, args.rate, args.timeout_s)
    ideal_s = ideal_drain_s(backlog, args.consumers, args.rate)
    table = Table(
        title=f"{sum(backlog):,} records on {len(backlog)} partitions, {args.consumers} "
        f"consumers at {args.rate:,g} records/s; ideal {format_duration(ideal_s)}"
    )
    table.add_column("strategy")
    table.add_column("drain time", justify="right")
    table.add_column("x ideal", justify="right")
    table.add_column("consumers left by rebalances")
    for drain in drains:
        counts = " -> ".join(str(len(r.assignment)) for r in drain.rebalances)
        table.add_row(
            drain.name, format_duration(drain.drain_s), f"{drain.drain_s / ideal_s:.2f}", counts
        )
    print_table(table)
    if args.png is not None:
        write_chart(drains, ideal_s, args.png, f"{args.consumers} consumers")
        print(f"chart written to {args.png}")
    return 0
