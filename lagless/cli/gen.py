"""`lagless gen`: produce test records shaped like a profile to an existing topic.

The profiles take their shapes from the failures the README lists: seed-000 the lag of the
first (threads blocked on drained partitions), seed-002 and deals the third (large records,
update floods). The deals profile writes large deal documents keyed by the deal id, as JSON or
Avro, in runs of updates with some tombstones; `--write-schema FILE` saves their schema for
`lagless import --value-schema @FILE`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from lagless.cli.options import add_kafka_arguments, kafka_config
from lagless.exceptions import BadInput
from lagless.gen.deals import DealRecords, register_schema, schema_text
from lagless.gen.produce import (
    ProbeRecords,
    ProducedSummary,
    RecordShape,
    check_topic,
    iter_kinds,
    produce_profile,
)
from lagless.gen.profiles import (
    COMPRESSIONS,
    DEALS_RECORD_BYTES,
    DEFAULT_RECORD_BYTES,
    PROFILE_NAMES,
    PROFILES,
    Profile,
    build_profile,
    explicit,
    parse_counts,
)
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "gen",
        help="produce test records to an existing topic",
        description=__doc__,
    )
    add_kafka_arguments(parser)
    parser.add_argument(
        "--topic", required=True, metavar="TOPIC", help="existing topic to write to"
    )
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument(
        "--profile",
        choices=PROFILE_NAMES,
        help="; ".join(f"{name}: {meaning}" for name, meaning in PROFILES.items()),
    )
    shape.add_argument(
        "--counts", metavar="N,N,...", help="records per partition, e.g. 100,200,0,50"
    )
    parser.add_argument(
        "--scale", type=float, metavar="X", help="multiply a named profile's counts (default: 1)"
    )
    parser.add_argument(
        "--record-bytes",
        type=int,
        metavar="N",
        help=f"value size in bytes (default: {DEFAULT_RECORD_BYTES}; deals: the JSON document's, "
        f"{DEALS_RECORD_BYTES})",
    )
    parser.add_argument(
        "--keys",
        type=int,
        default=1_000,
        metavar="N",
        help="distinct keys per partition (default: %(default)s)",
    )
    parser.add_argument(
        "--poison",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="share of poison records, 0 to 1 (default: %(default)g)",
    )
    parser.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        help="producer compression; zstd lets the embedded broker keep about twice the records "
        "(default: none; deals: zstd)",
    )
    parser.add_argument(
        "--value-format",
        choices=("json", "avro"),
        default="json",
        help="deals only: values as JSON or Avro (default: %(default)s)",
    )
    parser.add_argument(
        "--schema-registry",
        metavar="URL",
        help="deals as Avro in the Confluent wire format, the schema registered under "
        "<topic>-value at URL",
    )
    parser.add_argument(
        "--write-schema",
        metavar="FILE",
        help="deals only: write the values' schema to FILE (Spark DDL for json, Avro for avro) "
        "for lagless import --value-schema @FILE",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="random seed of the key draws (default: 0)"
    )
    parser.set_defaults(func=handler)


def _profile(args: argparse.Namespace, config: KafkaConfig) -> Profile:
    if args.counts is not None:
        if args.scale is not None:
            raise BadInput("--scale applies to --profile, not to --counts")
        size = DEFAULT_RECORD_BYTES if args.record_bytes is None else args.record_bytes
        return explicit(parse_counts(args.counts), size)
    partitions = 0
    if args.profile == "uniform":
        with OffsetReader(config) as reader:
            partitions = len(reader.cluster.partitions([args.topic]))
    scale = 1.0 if args.scale is None else args.scale
    return build_profile(
        args.profile, partitions=partitions, scale=scale, record_bytes=args.record_bytes
    )


def _shape(args: argparse.Namespace) -> RecordShape:
    """The records' keys, order and values: the deals' documents, else gen's probe values.
    Registers the deals' Avro schema when asked to, and writes the schema file."""
    if args.profile != "deals":
        for given, option in (
            (args.value_format != "json", "--value-format"),
            (args.schema_registry, "--schema-registry"),
            (args.write_schema, "--write-schema"),
        ):
            if given:
                raise BadInput(f"{option} applies to --profile deals")
        return ProbeRecords()
    if args.value_format == "avro" and not (args.schema_registry or args.write_schema):
        raise BadInput(
            "--value-format avro needs --schema-registry URL or --write-schema FILE (plain Avro: "
            "the schema is not in the records)"
        )
    if args.schema_registry and args.value_format != "avro":
        raise BadInput("--schema-registry needs --value-format avro")
    if args.write_schema:
        try:
            with open(args.write_schema, "w", encoding="utf-8") as handle:
                handle.write(schema_text(args.value_format) + "\n")
        except OSError as exc:
            raise BadInput(
                f"cannot write --write-schema {args.write_schema}: {exc.strerror}"
            ) from None
    schema_id = None
    if args.schema_registry:
        schema_id = register_schema(args.schema_registry, f"{args.topic}-value")
    return DealRecords(args.value_format, schema_id)


@contextmanager
def _progress_bar(total: int) -> Iterator[Callable[[int], None] | None]:
    """A bar on stderr when a person watches it; nothing in pipes and tests."""
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    columns = (
        TextColumn("producing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("produce", total=total)
        yield lambda done: progress.update(task, completed=done)


def _summary_line(summary: ProducedSummary) -> str:
    kinds = ", ".join(f"{kind} {count:,}" for kind, count in iter_kinds(summary))
    return (
        f"produced {summary.records:,} records ({summary.value_bytes / 1e6:.1f} MB of values) "
        f"to {summary.partitions_written} partitions of {summary.topic!r} "
        f"in {summary.seconds:.2f} s ({summary.records_per_second:,.0f} records/s); {kinds}"
    )


def handler(args: argparse.Namespace) -> int:
    if args.keys < 1:
        raise BadInput(f"--keys {args.keys} must be at least 1")
    if not 0.0 <= args.poison <= 1.0:
        raise BadInput(f"--poison {args.poison} is not between 0 and 1")
    config = kafka_config(args)
    profile = _profile(args, config)
    compression = args.compression or ("zstd" if args.profile == "deals" else "none")
    profile.check_fits(compression)
    if args.poison and args.profile == "deals":
        raise BadInput("--poison does not apply to profile 'deals'")
    with OffsetReader(config) as reader:  # before a schema is written or registered
        check_topic(reader.cluster, args.topic, profile)
    shape = _shape(args)
    with _progress_bar(profile.total_records) as on_progress:
        summary = produce_profile(
            config,
            args.topic,
            profile,
            keys=args.keys,
            poison=args.poison,
            compression=compression,
            seed=args.seed,
            on_progress=on_progress,
            shape=shape,
        )
    print(_summary_line(summary), flush=True)
    truncated = summary.truncated_partitions()
    if truncated:
        dropped = sum(summary.retained_from[p] - summary.offsets[p][0] for p in truncated)
        print(
            f"lagless: warning: the broker deleted {dropped:,} of the {summary.records:,} "
            f"records just produced before anything read them (partitions {truncated}: its "
            "retention; the embedded broker keeps about 5 MB a partition, twice the records "
            "with --compression zstd)",
            file=sys.stderr,
        )
    return 0
