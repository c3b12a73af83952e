"""`lagless import`: drain (bulk) or follow (continuous) a topic into a store."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from typing import Any

from rich.table import Table

from lagless.cli.options import (
    add_kafka_arguments,
    add_maintenance_arguments,
    at_least_one,
    epoch_ms,
    kafka_config,
    not_empty,
    positive_seconds,
    seconds_or_zero,
)
from lagless.importer.class_archive import build_in_background
from lagless.importer.job import run_import
from lagless.importer.spark import is_connect
from lagless.importer.spec import SCHEMA_CHANGES, ImportSpec
from lagless.progress import RichCollector
from lagless.retry import DEFAULT_RETRY_S
from lagless.sinks.url import relative_that_looks_absolute

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "import", help="import a Kafka topic into a store with Spark", description=__doc__
    )
    _add_what_to_read(parser)
    _add_where_to_write(parser)
    _add_how_values_are_read(parser)
    _add_batches(parser)
    _add_running(parser)
    _add_spark(parser)
    parser.set_defaults(func=handle)


def _add_what_to_read(parser: argparse.ArgumentParser) -> None:
    """The topics, and where in them to start and end."""
    add_kafka_arguments(parser)
    parser.add_argument(
        "--topic",
        type=not_empty,
        action="append",
        default=[],
        metavar="TOPIC",
        help="topic to import (repeatable)",
    )
    parser.add_argument(
        "--topic-pattern",
        metavar="REGEX",
        help="import every topic whose whole name matches REGEX, also those created while a "
        "continuous import runs (Spark's subscribePattern); each into the table --table names "
        "for it (default: '{topic}')",
    )
    parser.add_argument(
        "--starting-timestamp",
        type=epoch_ms,
        metavar="MS",
        help="start at each partition's first record at or after MS milliseconds since the "
        "epoch (Spark's startingTimestamp); a checkpoint to resume from overrides it",
    )
    parser.add_argument(
        "--ending-timestamp",
        type=epoch_ms,
        metavar="MS",
        help="bulk mode: stop before each partition's first record at or after MS "
        "milliseconds since the epoch (Spark's endingTimestamp)",
    )
    parser.add_argument(
        "--skip-lost-offsets",
        action="store_true",
        help="skip offsets deleted by retention instead of failing; a mirror "
        "(--value-format debezium) also refuses change events deleted before any run read "
        "them, unless this accepts the loss",
    )


def _add_where_to_write(parser: argparse.ArgumentParser) -> None:
    """The store, its tables, and the checkpoint that resumes a run."""
    parser.add_argument(
        "--sink",
        required=True,
        metavar="URL",
        help="sqlite:///file.db | postgresql://user:password@host:port/db | parquet:///dir "
        "| delta:///dir | iceberg:///dir "
        "(three slashes: a relative path; four: an absolute one)",
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="DIR",
        help="checkpoint directory; a rerun resumes from it",
    )
    parser.add_argument(
        "--table",
        type=not_empty,
        metavar="TABLE",
        help="target table (default: the topic name); Iceberg takes namespace.table; a table "
        "per topic with {topic} (the topic's name), {schema} and {table} (of <prefix>.<schema>."
        "<table>), characters a table name cannot hold as _",
    )
    parser.add_argument(
        "--write",
        choices=("append", "upsert"),
        help="append: a row per record, unique on (topic, partition, offset); upsert: a row per "
        "key, replaced only by a newer record (default: append; upsert with --value-format "
        "debezium, where append keeps the change log itself, a row per event)",
    )


def _add_how_values_are_read(parser: argparse.ArgumentParser) -> None:
    """The values' format, columns and keys, and where the records that do not fit go."""
    parser.add_argument(
        "--value-format",
        "--format",
        choices=("raw", "json", "avro", "debezium"),
        default="raw",
        dest="value_format",
        help="raw: values stored as bytes; json: values must be UTF-8 JSON, stored as text "
        "(jsonb in PostgreSQL), or a column per field with --value-schema; avro: a column per "
        "field of the Avro schema; debezium: change events of a table, mirrored (a column per "
        "column of the events' schema, upserted on the Kafka key's fields, deletes applied; "
        "docs/mirror.md); values that do not fit are dead-lettered (default: %(default)s)",
    )
    parser.add_argument(
        "--cdc-columns",
        action="store_true",
        help="debezium: add the mirror's own columns _op, _source_ts_ms and _lsn",
    )
    parser.add_argument(
        "--schema-changes",
        choices=SCHEMA_CHANGES,
        default="evolve",
        help="debezium: columns added and widened upstream are added and widened in the table; "
        "a change it cannot follow (another type, a narrowing the store cannot widen to) stops "
        "that table while the others go on (evolve), or the import (fail); docs/mirror.md "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--deletes",
        choices=("hard", "soft"),
        default="hard",
        help="debezium: hard removes a deleted row; soft keeps it with _deleted = true "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--value-schema",
        metavar="SCHEMA",
        help="json: a Spark DDL schema ('id BIGINT NOT NULL, tags ARRAY<STRING>'), @FILE holding "
        "one, or 'infer' (from the first records of each partition; printed); avro: an .avsc "
        "file (the reader schema)",
    )
    parser.add_argument(
        "--schema-registry",
        metavar="URL",
        help="avro: values in the Confluent wire format, writer schemas by id from this Schema "
        "Registry; the columns come from the newest schema of subject <topic>-value; "
        "debezium: change events (keys and values) in Avro through this registry, as Kafka "
        "Connect's io.confluent.connect.avro.AvroConverter writes them",
    )
    parser.add_argument(
        "--key-field",
        metavar="A[,B]",
        help="upsert key: these value fields (default: the Kafka key); a tombstone's Kafka key "
        "gives them (its text for one field, a JSON object for several)",
    )
    parser.add_argument(
        "--max-record-bytes",
        type=at_least_one,
        metavar="N",
        help="dead-letter values larger than this many bytes",
    )
    parser.add_argument(
        "--dead-letter-topic",
        type=not_empty,
        metavar="TOPIC",
        help="also send rejected records to this existing topic, error context in headers",
    )


def _add_batches(parser: argparse.ArgumentParser) -> None:
    """How the run is cut into batches, and the tables kept healthy between them."""
    parser.add_argument(
        "--mode",
        choices=("bulk", "continuous"),
        default="bulk",
        help="bulk: drain up to the end offsets seen at start, then stop; continuous: follow "
        "the topic until SIGINT/SIGTERM (default: %(default)s)",
    )
    parser.add_argument(
        "--max-records-per-batch",
        type=at_least_one,
        metavar="N",
        help="at most N records per micro-batch (Spark's maxOffsetsPerTrigger)",
    )
    parser.add_argument(
        "--max-bytes-per-batch",
        type=at_least_one,
        metavar="N",
        help="at most about N bytes per micro-batch (default: 1 GiB where the executors write: "
        "Parquet, Delta, PostgreSQL; 256 MiB for SQLite)",
    )
    parser.add_argument(
        "--slots",
        type=at_least_one,
        metavar="N",
        help="task slots to plan for (default: Spark parallelism x 2)",
    )
    parser.add_argument(
        "--trigger-seconds",
        type=positive_seconds,
        metavar="S",
        default=ImportSpec.trigger_seconds,
        help="continuous mode: seconds between batch starts (default: %(default)s)",
    )
    add_maintenance_arguments(parser)
    parser.add_argument(
        "--maintain-every",
        type=seconds_or_zero,
        default=ImportSpec.maintain_every_s,
        metavar="S",
        help="Parquet, Delta and Iceberg: a round of table maintenance (compaction, and expiry "
        "of versions older than --keep-history) between batches every S seconds, and a "
        "compaction of a table as soon as 4 batches wrote to it; 0: none (default: %(default)g; "
        "docs/maintenance.md)",
    )


def _add_running(parser: argparse.ArgumentParser) -> None:
    """How the run meets a broker or store that is away, and what it prints."""
    parser.add_argument(
        "--retry-seconds",
        type=seconds_or_zero,
        default=DEFAULT_RETRY_S,
        metavar="S",
        help="how long a broker or database that is away (unreachable, hung, restarting) is "
        "waited for, with retries, before the import exits 75; a rerun resumes "
        "(default: %(default).0f)",
    )
    parser.add_argument(
        "--group",
        type=not_empty,
        metavar="GROUP",
        help="also commit progress to this Kafka consumer group (for lag tools)",
    )
    parser.add_argument(
        "--explain", action="store_true", help="print the next batch's plan; import nothing"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the summary (or the plan) as JSON"
    )


def _add_spark(parser: argparse.ArgumentParser) -> None:
    """The Spark application that runs the import."""
    parser.add_argument(
        "--master",
        metavar="URL",
        help="Spark master URL, or sc://host:port for a Spark Connect server "
        "(default: $LAGLESS_SPARK_MASTER, else local[*])",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session (repeatable), e.g. spark.archives=ENV.tar.gz#env "
        "to ship lagless to executors that lack it (docs/operations.md#cluster-deployment)",
    )
    parser.add_argument(
        "--shared-disk",
        action="store_true",
        help="a cluster master's executors see this machine's disk at the same paths (workers "
        "on this machine, a shared mount): SQLite's staging and local Parquet, Delta and "
        "Iceberg folders are refused on a cluster without it",
    )


def spec_from_args(args: argparse.Namespace) -> ImportSpec:
    from lagless.exceptions import BadInput

    if args.value_format != "debezium" and (args.cdc_columns or args.deletes != "hard"):
        raise BadInput("--cdc-columns and --deletes go with --value-format debezium")
    if not args.topic and args.topic_pattern is None:
        raise BadInput("give the topics to import: --topic NAME (repeatable) or --topic-pattern")
    if args.topic_pattern is not None:
        try:
            re.compile(args.topic_pattern)
        except re.error as exc:
            raise BadInput(
                f"--topic-pattern {args.topic_pattern!r} is not a regular expression: {exc}"
            ) from None
    return ImportSpec(
        kafka=kafka_config(args),
        topics=tuple(args.topic),
        topic_pattern=args.topic_pattern,
        sink_url=args.sink,
        checkpoint=args.checkpoint,
        table=args.table,
        write=args.write or ("upsert" if args.value_format == "debezium" else "append"),
        mode=args.mode,
        value_format=args.value_format,
        max_records_per_batch=args.max_records_per_batch,
        max_bytes_per_batch=args.max_bytes_per_batch,
        slots=args.slots,
        trigger_seconds=args.trigger_seconds,
        fail_on_data_loss=not args.skip_lost_offsets,
        schema_changes=args.schema_changes,
        master=args.master,
        group=args.group,
        max_record_bytes=args.max_record_bytes,
        dead_letter_topic=args.dead_letter_topic,
        starting_timestamp=args.starting_timestamp,
        ending_timestamp=args.ending_timestamp,
        value_schema=args.value_schema,
        schema_registry=args.schema_registry,
        key_fields=key_fields(args.key_field),
        retry_seconds=args.retry_seconds,
        spark_conf=tuple(spark_setting(each) for each in args.spark_conf),
        shared_disk=args.shared_disk,
        target_file_size=args.target_file_size,
        keep_history_s=args.keep_history,
        maintain_every_s=args.maintain_every,
        cdc_columns=args.cdc_columns,
        deletes=args.deletes,
    )


def key_fields(text: str | None) -> tuple[str, ...]:
    from lagless.exceptions import BadInput

    if text is None:
        return ()
    fields = tuple(f.strip() for f in text.split(","))
    if not all(fields):
        raise BadInput(f"--key-field {text!r} names an empty field")
    return fields


def spark_setting(text: str) -> tuple[str, str]:
    from lagless.exceptions import BadInput

    key, equals, value = text.partition("=")
    if not equals or not key.strip().startswith("spark."):
        raise BadInput(f"--spark-conf {text!r} is not KEY=VALUE with a key starting spark.")
    return key.strip(), value


def handle(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    ambiguous = relative_that_looks_absolute(spec.sink_url)
    if ambiguous is not None:
        print(f"lagless: warning: {ambiguous}", file=sys.stderr, flush=True)
    if args.explain:
        from lagless.importer.explain import explain
        from lagless.lag.table import print_table

        plan = explain(spec)
        if args.json:
            print(json.dumps(plan))
        else:
            if len(plan["tables"]) > 1:
                print_table(tables_table(plan))
            print_table(plan_table(plan))
        return 0
    summary = run_import(
        spec, RichCollector(summary=not args.json, follow=spec.mode == "continuous")
    )
    if args.json:
        print(json.dumps(summary.as_dict()))
    if not is_connect(spec.master) and build_in_background():
        log.info("no class archive for Spark's driver yet: building it in the background")
    return 0


def plan_table(plan: dict[str, Any]) -> Table:
    tasks = plan["tasks"]
    records = sum(t["records"] for t in tasks)
    tables = plan["tables"]
    title = f"next batch: {len(tasks)} tasks on {plan['slots']} slots, {records:,} records"
    if len(tables) > 1:
        title += f" into {len(tables)} tables"
    table = Table(title=title)
    columns: tuple[str, ...] = ("task", "topic", "partition", "from", "until", "records", "bytes")
    if len(tables) > 1:
        columns = ("task", "table", *columns[1:])
    for name in columns:
        table.add_column(name, justify="left" if name in ("topic", "table") else "right")
    for number, task in enumerate(tasks, 1):
        for p in task["pieces"]:
            cells = [
                str(number),
                p["topic"],
                str(p["partition"]),
                f"{p['from']:,}",
                f"{p['until']:,}",
                f"{p['records']:,}",
                f"{p['bytes']:,}",
            ]
            if len(tables) > 1:
                cells.insert(1, p["table"])
            table.add_row(*cells)
    return table


def tables_table(plan: dict[str, Any]) -> Table:
    """A routed import's tables: each one's topics, what its ledger holds, its next records."""
    table = Table(title=f"{len(plan['tables'])} tables")
    for name in ("table", "topics", "partitions", "holding records", "next batch"):
        table.add_column(name, justify="left" if name in ("table", "topics") else "right")
    for each in plan["tables"]:
        holding = sum(len(parts) for parts in each["holds"].values())
        table.add_row(
            each["table"],
            ", ".join(each["topics"]),
            str(each["partitions"]),
            str(holding),
            f"{each['records']:,}",
        )
    return table
