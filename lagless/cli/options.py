"""Options several commands take, declared once: where the broker is and how to reach it, the
consumer group to look at, and the labels of the metrics."""

from __future__ import annotations

import argparse

from lagless.kafka.config import KafkaConfig, parse_key_values
from lagless.lag.doctor import DEFAULT_RETENTION_WARNING_S
from lagless.sinks.maintenance import DEFAULT_KEEP_HISTORY_S, DEFAULT_TARGET_FILE_SIZE, parse_size


def add_kafka_arguments(parser: argparse.ArgumentParser) -> None:
    """--bootstrap and --kafka-option: read back with kafka_config(args)."""
    parser.add_argument(
        "--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,...]"
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
    parser.add_argument("--group", required=group_required, help="consumer group id")
    parser.add_argument("--topic", help="only this topic (default: every topic the group read)")


def add_metric_arguments(parser: argparse.ArgumentParser) -> None:
    """The metrics' cluster label and retention warning (serve, lag --prometheus)."""
    parser.add_argument(
        "--cluster-name",
        metavar="NAME",
        help="the cluster_name label of the metrics (default: the bootstrap address)",
    )
    parser.add_argument(
        "--retention-warning",
        type=float,
        default=DEFAULT_RETENTION_WARNING_S,
        metavar="S",
        help="warn when retention deletes unread records within S seconds (default 3600)",
    )


def cluster_name(args: argparse.Namespace) -> str:
    return str(args.cluster_name or args.bootstrap)


def add_maintenance_arguments(parser: argparse.ArgumentParser, history: bool = True) -> None:
    """--target-file-size and, with `history`, --keep-history (import, maintain; lag --sink
    takes the size alone, for the small-file share)."""
    parser.add_argument(
        "--target-file-size",
        type=file_size,
        default=DEFAULT_TARGET_FILE_SIZE,
        metavar="B",
        help="table maintenance: files smaller than this are merged into files of up to this "
        "size; bytes, or with K, M, G (default 128M)",
    )
    if not history:
        return
    parser.add_argument(
        "--keep-history",
        type=seconds,
        default=DEFAULT_KEEP_HISTORY_S,
        metavar="S",
        help="table maintenance: versions (Delta log entries, Iceberg snapshots, merged "
        "Parquet folders) older than S seconds are expired and the files only they read "
        "removed (default %(default).0f)",
    )


def file_size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a size in bytes, K, M or G ({exc})") from None


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds, at least 0")
    return value
