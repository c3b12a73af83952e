"""`lagless serve`: sample consumer groups continuously and serve their lag over HTTP.

/metrics for Prometheus, /api/groups for programs, / for people. The first line of stdout is
the server's address, so a script can start it with --port 0 and read where it listens.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from types import FrameType

from lagless.cli.options import (
    add_kafka_arguments,
    add_metric_arguments,
    cluster_name,
    kafka_config,
)
from lagless.exceptions import BadInput, TransientError
from lagless.kafka.config import KafkaConfig
from lagless.lag.offsets import KafkaFleetSource
from lagless.lag.status import DEFAULT_WINDOW_S
from lagless.serve import metrics
from lagless.serve.sampler import Sampler, SamplerSettings
from lagless.serve.server import Content
from lagless.serve.service import LagService, bind, fleet_gc, fleet_malloc

DEFAULT_PORT = 9308
# Shorter than lag's 10 s: the service notices a broker that went away within a round or two.
REQUEST_TIMEOUT_S = 3.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve consumer groups' lag: Prometheus /metrics, a JSON API and a dashboard",
        description=__doc__,
    )
    add_kafka_arguments(parser)
    parser.add_argument(
        "--group",
        action="append",
        metavar="G",
        help="consumer group to watch (repeatable; default: every group the broker lists)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="HOST",
        help="address to listen on (default: %(default)s)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        metavar="PORT",
        help="port to listen on (default: %(default)s; 0: any free one)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="S",
        help="seconds between samples (default: %(default)g)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=DEFAULT_WINDOW_S,
        metavar="S",
        help="seconds of samples behind each status, as lag's --window and doctor's --seconds; "
        "STOP is no commit for longer (default: %(default)g)",
    )
    add_metric_arguments(parser)
    parser.set_defaults(func=run)


def check_numbers(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise BadInput(f"--port {args.port} is not a port (0-65535)")
    # Written so NaN is refused too (every comparison with it is false): an interval of NaN
    # waited for nothing between rounds, sampling the broker in a busy loop.
    if not 0 < args.interval < math.inf:
        raise BadInput("--interval must be a positive number of seconds")
    if not 0 < args.window < math.inf:
        raise BadInput("--window must be a positive number of seconds")
    if args.retention_warning < 0:
        raise BadInput("--retention-warning cannot be negative")


def run(args: argparse.Namespace) -> int:
    check_numbers(args)
    fleet_malloc()
    config = kafka_config(args)
    settings = SamplerSettings(args.interval, args.window, args.retention_warning)
    started: list[Sampler] = []
    latest = metrics.LatestExposition(cluster_name(args))
    content = Content(
        views=lambda: started[0].views() if started else (),
        cluster=latest.cluster,
        poll_time_ms=lambda: started[0].poll_time_ms if started else None,
        exposition=latest.get,
    )
    # Bind first: a port in use is told at once, before the broker is asked anything.
    server = bind(args.host, args.port, content)
    try:
        started.append(open_sampler(config, args.group, settings, latest))
    except BaseException:
        server.server_close()
        raise
    with fleet_gc():
        service = LagService(started[0], server).start()
        print(service.url, flush=True)
        watched = ", ".join(args.group) if args.group else "every group the broker lists"
        print(
            f"lagless serve: {watched} on {args.bootstrap}; {service.url}/metrics, "
            f"{service.url}/api/groups; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        wait_for_signal()
        service.stop()
    return 0


def open_sampler(
    config: KafkaConfig,
    groups: list[str] | None,
    settings: SamplerSettings,
    latest: metrics.LatestExposition,
) -> Sampler:
    """A sampler of the named groups (one that has not committed yet is shown so, and judged
    once it commits or its members hold partitions), or of every group the broker lists; bad
    input when the broker cannot be reached, or no group is named and the broker does not
    answer ListGroups."""
    source = KafkaFleetSource(config, request_timeout_s=REQUEST_TIMEOUT_S)
    try:
        source.topics()  # unreachable: bad input, said now
        if groups is None:
            try:
                listed = source.list_groups()
            except TransientError as exc:
                raise BadInput(f"cannot reach the broker at {config.bootstrap} ({exc})") from None
            if listed is None:
                raise BadInput(
                    f"the broker at {config.bootstrap} does not answer ListGroups (the embedded "
                    "broker does not): name the groups with --group"
                )
    except BaseException:
        source.close()
        raise
    return Sampler(source, settings, groups, after_round=latest.update)


def wait_for_signal() -> None:
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        # A timed wait lets the signal handler run promptly on every platform.
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
