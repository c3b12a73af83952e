"""`lagless broker`: run an embedded Kafka cluster until interrupted.

The first line of stdout is the bootstrap address, so a script can start it in the background
and read where to connect.
"""

from __future__ import annotations

import argparse
import sys

from lagless.broker import EmbeddedBroker, parse_topic_spec
from lagless.broker.cluster import RETENTION_BYTES
from lagless.cli.options import at_least_one
from lagless.exceptions import BadInput
from lagless.signals import stop_requests


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="run an embedded Kafka cluster (dev and tests) until Ctrl-C",
        description=__doc__,
    )
    parser.add_argument(
        "--brokers", type=int, default=1, metavar="N", help="number of brokers (default: 1)"
    )
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME:PARTITIONS",
        help="topic to create (repeatable)",
    )
    parser.add_argument(
        "--retention-bytes",
        type=at_least_one,
        metavar="N",
        help=f"keep at most N bytes of each partition, deleting the oldest records past it "
        f"(default: the mock's own, about {RETENTION_BYTES:,}, which is also the most)",
    )
    parser.add_argument(
        "--retention-ms",
        type=at_least_one,
        metavar="MS",
        help="delete records older than MS milliseconds (by their timestamps) "
        "(default: none, by time)",
    )
    parser.set_defaults(func=handler)


def parse_topics(specs: list[str]) -> dict[str, int]:
    topics: dict[str, int] = {}
    for spec in specs:
        name, partitions = parse_topic_spec(spec)
        if name in topics:
            raise BadInput(f"topic {name!r} is given twice")
        topics[name] = partitions
    return topics


def handler(args: argparse.Namespace) -> int:
    topics = parse_topics(args.topic)
    running = EmbeddedBroker(
        brokers=args.brokers,
        topics=topics,
        retention_ms=args.retention_ms,
        retention_bytes=args.retention_bytes,
    )
    with stop_requests() as stop, running as broker:
        print(broker.bootstrap, flush=True)
        described = ", ".join(f"{n}:{p}" for n, p in topics.items()) or "no topics"
        print(
            f"embedded Kafka: {args.brokers} broker(s), {described}; {broker.retention}; "
            "Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        # A timed wait lets the signal handler run promptly on every platform.
        while not stop.wait(0.5):
            pass
    return 0
