"""`lagless doctor`: watch a consumer group for a while and say what is wrong and how to fix it."""

from __future__ import annotations

import argparse
import json
import math

from lagless.cli.options import add_group_arguments, kafka_config, tell_waiting
from lagless.exceptions import BadInput
from lagless.lag.doctor import DEFAULT_FETCH_BYTES, diagnose, examine, notes, render
from lagless.lag.members import KafkaMembership
from lagless.lag.offsets import KafkaOffsetSource, require_commits
from lagless.lag.status import DEFAULT_WINDOW_S

SAMPLES = 10
SHORTEST_INTERVAL_S = 0.1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor", help="diagnose why a consumer group lags", description=__doc__
    )
    add_group_arguments(parser)
    parser.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help="how long to watch the group, the span its status is judged over, as lag's and "
        "serve's --window (default: %(default)g)",
    )
    parser.add_argument(
        "--fetch-bytes",
        type=int,
        metavar="N",
        default=DEFAULT_FETCH_BYTES,
        help="the consumers' fetch size per partition, to judge record sizes (default: 1 MiB)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print {"group", "status", "findings": [{"kind", "text", "fix"}], "notes"} (the '
        "findings are what serve shows; notes: what could not be checked)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.seconds < math.inf:  # NaN refused too
        raise BadInput("--seconds must be positive")
    if args.fetch_bytes <= 0:
        raise BadInput("--fetch-bytes must be positive")
    config = kafka_config(args)
    source = KafkaOffsetSource(config, args.group, args.topic)
    membership = KafkaMembership(config)
    try:
        if not source.partitions:
            # No commit yet: a group with members is judged by what they hold; without any,
            # there is nothing to watch.
            description = membership.describe(args.group)
            if description is None or not description.members:
                require_commits(source, args.topic)
        interval_s = max(SHORTEST_INTERVAL_S, args.seconds / SAMPLES)
        tell_waiting(f"watching group {args.group} for {args.seconds:g} s (--seconds)")
        exam = examine(args.group, source, membership, args.seconds, interval_s)
    finally:
        source.close()
        membership.close()
    findings = diagnose(exam, args.fetch_bytes)
    if args.json:
        body = {
            "group": args.group,
            "status": exam.report.status.name,
            "findings": [finding.as_json() for finding in findings],
            "notes": notes(exam),
        }
        print(json.dumps(body, indent=2))
    else:
        print(render(exam, findings))
    return 0
