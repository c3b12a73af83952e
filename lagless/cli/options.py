"""Options several commands take, declared once: where the broker is and how to reach it, the
consumer group to look at, and the labels of the metrics."""

from __future__ import annotations

import argparse
import math
from typing import TypeVar

from rich.console import Console

from lagless.kafka.config import KafkaConfig, parse_key_values
from lagless.sinks.maintenance import DEFAULT_KEEP_HISTORY_S, DEFAULT_TARGET_FILE_SIZE, parse_size

T = TypeVar("T", int, float)


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """--bootstrap and --kafka-option: read back with kafka_config(args)."""
    parser.add_argument(
        "--bootstrap",
        required=True,
        metavar="HOST:PORT[,...]",
        help="the Kafka cluster's bootstrap servers",
    )
    parser.add_argument(
        "--kafka-option",
        action="append",
        metavar="KEY=VALUE",
        help="librdkafka setting, e.g. security.protocol=SSL (repeatable); settings lagless "
        "decides itself (group.id, enable.auto.commit, auto.offset.reset, ...) are refused",
    )


def kafka_config(args: argparse.Namespace) -> KafkaConfig:
    """The clients' configuration from --bootstrap and --kafka-option."""
    return KafkaConfig.from_options(args.bootstrap, parse_key_values(args.kafka_option))


def add_group_arguments(parser: argparse.ArgumentParser, group_required: bool = True) -> None:
    """The broker, one consumer group and, optionally, one of its topics (lag, doctor)."""
    add_kafka_arguments(parser)
    parser.add_argument(
        "--group",
        type=not_empty,
        required=group_required,
        metavar="GROUP",
        help="consumer group id",
    )
    parser.add_argument(
        "--topic",
        type=not_empty,
        metavar="TOPIC",
        help="only this topic (default: every topic the group read)",
    )


def add_metric_arguments(parser: argparse.ArgumentParser) -> None:
    """The metrics' cluster label and retention warning (serve, lag --prometheus)."""
    from lagless.lag.doctor import DEFAULT_RETENTION_WARNING_S  # only these commands load it

    parser.add_argument(
        "--cluster-name",
        metavar="NAME",
        help="the cluster_name label of the metrics (default: the bootstrap address)",
    )
    parser.add_argument(
        "--retention-warning",
        type=seconds_or_zero,
        default=DEFAULT_RETENTION_WARNING_S,
        metavar="S",
        help="warn when retention deletes unread records within S seconds (default: 3600)",
    )


def cluster_name(args: argparse.Namespace) -> str:
    return str(args.cluster_name or args.bootstrap)


def tell_waiting(text: str, console: Console | None = None) -> None:
    """On a terminal, a line on stderr saying what a command waits for before it answers
    (`lag`, `doctor`: seconds of samples); nothing in pipes."""
    console = console or Console(stderr=True)
    if console.is_terminal:
        console.print(text, style="dim", highlight=False, markup=False, soft_wrap=True)


def add_maintenance_arguments(parser: argparse.ArgumentParser) -> None:
    """--target-file-size and --keep-history (import, maintain)."""
    parser.add_argument(
        "--target-file-size",
        type=file_size,
        default=DEFAULT_TARGET_FILE_SIZE,
        metavar="B",
        help="table maintenance: files smaller than this are merged into files of up to this "
        "size; bytes, or with K, M, G (default: 128M)",
    )
    parser.add_argument(
        "--keep-history",
        type=seconds_or_zero,
        default=DEFAULT_KEEP_HISTORY_S,
        metavar="S",
        help="table maintenance: versions (Delta log entries, Iceberg snapshots, merged "
        "Parquet folders) older than S seconds are expired and the files only they read "
        "removed (default: %(default).0f)",
    )


# Types of option values, checked as argparse reads them, so a bad one is one line (exit 2)
# before anything runs or is written: `argument --trigger-seconds: must be above 0, not -1`.


def positive_seconds(text: str) -> float:
    """Seconds, more than 0 (an interval, a timeout)."""
    value = _number(text)
    return _refused_unless(value > 0, value, "a number of seconds above 0", text)


def positive_number(text: str) -> float:
    """A number above 0 (a rate)."""
    value = _number(text)
    return _refused_unless(value > 0, value, "a number above 0", text)


def seconds_or_zero(text: str) -> float:
    """Seconds, 0 or more (a budget that may be none)."""
    value = _number(text)
    return _refused_unless(value >= 0, value, "a number of seconds, 0 or more", text)


def at_least_one(text: str) -> int:
    """A whole number, 1 or more (a count, a size)."""
    value = _whole(text)
    return _refused_unless(value >= 1, value, "at least 1", text)


def epoch_ms(text: str) -> int:
    """Milliseconds since the epoch."""
    value = _whole(text)
    return _refused_unless(value >= 0, value, "milliseconds since the epoch", text)


def not_empty(text: str) -> str:
    """A topic, table or group name: not empty, no spaces around it."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if text != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} has spaces around it")
    return text


def file_size(text: str) -> int:
    """Bytes, or a number with K, M, G (a file size), 1K or more."""
    try:
        return parse_size(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"must be bytes or a number with K, M or G, 1K or more, not {text}"
        ) from None


def _refused_unless(ok: bool, value: T, wanted: str, text: str) -> T:
    if not ok:
        raise argparse.ArgumentTypeError(f"must be {wanted}, not {text}")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value
