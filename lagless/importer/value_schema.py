"""The value's fields, as the import's columns: a Spark DDL schema (`--value-schema`, text or
@file, parsed by Spark's own parser in the JVM), one inferred from a sample of the backlog
(`--value-schema infer`), or an Avro schema (a file, or the newest of `<topic>-value` in a
Schema Registry). Every problem is a BadInput, found before anything is written."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lagless.exceptions import BadInput
from lagless.first_line import first_line
from lagless.importer.debezium import events_of, mirror_columns
from lagless.importer.decode import (
    AvroDecoding,
    avro_fields,
    check_registry,
    latest_registered,
    parse_avro_schema,
)
from lagless.sinks.base import TOMBSTONE, TYPED_COLUMNS, Target, check_identifier
from lagless.sinks.upsert_order import LOG_TIME

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    from lagless.importer.routing import Destination
    from lagless.importer.spec import ImportSpec
    from lagless.kafka.offset_reader import OffsetReader
    from lagless.sinks import Sink

log = logging.getLogger(__name__)

INFER = "infer"
# Records read per partition to infer a schema from.
INFER_SAMPLE_RECORDS = 1000


@dataclass(frozen=True)
class ValueSchema:
    fields: StructType | None
    avro: AvroDecoding | None = None
    # Debezium: the table's key, the Kafka key's fields (or --key-field's).
    key_fields: tuple[str, ...] = ()
    # Debezium: a table without a key, kept as its change log (a row per change event), and
    # the one line that says so.
    change_log: str | None = None


def resolve(
    spec: ImportSpec,
    sink: Sink,
    partitions: list[tuple[str, int]],
    topics: tuple[str, ...] | None = None,
    reader: OffsetReader | None = None,
) -> ValueSchema:
    """The value's fields of one table, whose records are these partitions' of `topics`
    (default: the import's)."""
    topics = spec.topics if topics is None else topics
    if spec.key_fields and spec.write != "upsert":
        raise BadInput("--key-field needs --write upsert")
    if spec.value_format == "debezium":
        schema = _debezium(spec, sink, partitions, topics, reader)
    elif spec.value_format == "avro":
        schema = _avro(spec, topics)
    elif spec.value_schema is not None:
        if spec.value_format != "json":
            raise BadInput("--value-schema needs --value-format json or avro")
        if spec.schema_registry is not None:
            raise BadInput("--schema-registry needs --value-format avro")
        schema = ValueSchema(_json_fields(spec, partitions, topics))
    else:
        schema = ValueSchema(None)
    if schema.fields is None:
        if spec.key_fields:
            raise BadInput("--key-field needs the value's fields: give --value-schema")
        return schema
    for field in schema.fields:
        check_identifier(field.name, "value field")
        if field.name in (*TYPED_COLUMNS, TOMBSTONE) or (
            spec.write == "upsert" and field.name == LOG_TIME
        ):
            raise BadInput(f"value field {field.name!r} has the name of a column lagless adds")
    for name in spec.key_fields:
        if name not in schema.fields.fieldNames():
            raise BadInput(f"--key-field {name!r} is not a field of the value schema")
    return schema


def _debezium(
    spec: ImportSpec,
    sink: Sink,
    partitions: list[tuple[str, int]],
    topics: tuple[str, ...],
    reader: OffsetReader | None,
) -> ValueSchema:
    from lagless.kafka.offset_reader import OffsetReader

    if spec.schema_registry is not None:
        check_registry(spec.schema_registry)
    if spec.value_schema == INFER:
        raise BadInput("--value-format debezium takes the columns from the events' schema")
    given = None
    if spec.value_schema is not None:
        from lagless.importer.write_path import decide

        provisional = _provisional(spec, sink, topics)
        in_jvm = decide(spec.write_options, sink, [provisional]).records_in_jvm
        given = _json_fields(spec, partitions, topics, records_in_jvm=in_jvm)
    owned = reader is None
    reader = reader or OffsetReader(spec.kafka, retry_s=spec.retry_seconds)
    try:
        # The change log itself (--write append) needs to say what each row's event did.
        cdc_columns = spec.cdc_columns or spec.write == "append"
        events = events_of(spec.schema_registry)
        fields, key_fields = mirror_columns(
            reader, partitions, given, spec.key_fields, cdc_columns, spec.deletes, events
        )
    finally:
        if owned:
            reader.close()
    if key_fields or spec.write != "upsert":
        return ValueSchema(fields, key_fields=key_fields)
    said = (
        f"topic {topics[0]}: a table without a primary key (its change events have no Kafka "
        "key) is kept as its change log, a row per event; to mirror its rows, give it a "
        "primary key, or --key-field with REPLICA IDENTITY FULL"
    )
    log.warning("%s", said)
    return ValueSchema(fields, change_log=said)


def _provisional(spec: ImportSpec, sink: Sink, topics: tuple[str, ...]) -> Destination:
    """A mirror's table before its columns are known: whether the source's tasks write its
    change files (write_path.decide) does not depend on them, and Spark, started here
    to parse --value-schema, must start as the import wants it (spark.QUICK_START_JIT where
    no record passes through its JVM: C2 compiling beside a continuous Delta mirror took 0.18
    of a core here)."""
    from pyspark.sql.types import StructType

    from lagless.importer.routing import Destination

    target = Target(
        sink.table_name("table"),
        spec.write,
        spec.value_format,
        StructType([]),
        spec.key_fields,
        run_id=spec.run_id,
        deletes=spec.deletes,
        schema_registry=spec.schema_registry,
    )
    return Destination(target, topics, [], "")


def _avro(spec: ImportSpec, topics: tuple[str, ...]) -> ValueSchema:
    if spec.value_schema is not None:
        reader = _read_file(spec.value_schema.removeprefix("@"), "--value-schema")
        where = f"--value-schema {spec.value_schema}"
    elif spec.schema_registry is not None:
        if len(topics) != 1:
            raise BadInput(
                "--schema-registry reads the subject <topic>-value: import one topic per table"
            )
        subject = f"{topics[0]}-value"
        reader = latest_registered(spec.schema_registry, subject)
        where = f"subject {subject!r}"
    else:
        raise BadInput("--value-format avro needs --schema-registry URL or --value-schema FILE")
    fields = avro_fields(parse_avro_schema(reader, where))
    return ValueSchema(fields, AvroDecoding(reader, spec.schema_registry))


def _read_file(path: str, option: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise BadInput(f"{option} file {path!r} cannot be read: {reason}") from None


def _json_fields(
    spec: ImportSpec,
    partitions: list[tuple[str, int]],
    topics: tuple[str, ...],
    records_in_jvm: bool = True,
) -> StructType:
    """--value-schema's fields, parsed (or inferred) by Spark, started here as
    `records_in_jvm` (spark.spark_session) says: the import's batches use this session."""
    from lagless.importer.spark import is_remote, spark_session

    text = spec.value_schema
    assert text is not None
    if text.startswith("@"):
        text = _read_file(text[1:], "--value-schema")
    spark = spark_session(spec.master, conf=dict(spec.spark_conf), records_in_jvm=records_in_jvm)
    if text == INFER:
        if is_remote(spark):
            raise BadInput(
                "--value-schema infer cannot run over Spark Connect (it reads through Spark's "
                "RDD API): infer once with a local --master, then pass the schema it prints"
            )
        fields = _infer(spark, spec, partitions, topics)
        print(f"lagless: inferred --value-schema {to_ddl(spark, fields)!r}", file=sys.stderr)
        return fields
    return parse_ddl(spark, text)


def parse_ddl(spark: SparkSession, text: str) -> StructType:
    """A Spark DDL schema (`id BIGINT NOT NULL, tags ARRAY<STRING>`), parsed in the JVM."""
    import json

    from pyspark.sql.types import StructType

    from lagless.importer.spark import is_remote

    try:
        if is_remote(spark):  # no JVM here: the server parses it
            fields = spark.createDataFrame([], text).schema
        else:
            jvm = spark._jvm
            assert jvm is not None
            parsed = jvm.org.apache.spark.sql.types.StructType.fromDDL(text)
            fields = StructType.fromJson(json.loads(parsed.json()))
    except Exception as exc:  # Spark's ParseException: its first line says what and where
        raise BadInput(f"--value-schema is not a Spark DDL schema: {first_line(exc)}") from None
    if not fields.fields:
        raise BadInput("--value-schema has no fields")
    return fields


def to_ddl(spark: SparkSession, fields: StructType) -> str:
    jvm = spark._jvm
    assert jvm is not None
    return str(jvm.org.apache.spark.sql.types.DataType.fromJson(fields.json()).toDDL())


def _infer(
    spark: SparkSession,
    spec: ImportSpec,
    partitions: list[tuple[str, int]],
    topics: tuple[str, ...],
) -> StructType:
    """The schema Spark's JSON reader finds in the first INFER_SAMPLE_RECORDS records of each
    partition, read with the lagless source."""
    import json

    from lagless.kafka.offset_reader import OffsetReader
    from lagless.source import SOURCE_NAME

    options = spec.kafka.source_options()
    options["kafka.bootstrap.servers"] = spec.kafka.bootstrap
    options["subscribe"] = ",".join(topics)
    options["failOnDataLoss"] = "false"

    with OffsetReader(spec.kafka) as reader:
        low, high = reader.log.watermarks(partitions)
    ending: dict[str, dict[str, int]] = {}
    for (topic, partition), start in low.items():
        end = min(high[(topic, partition)], start + INFER_SAMPLE_RECORDS)
        ending.setdefault(topic, {})[str(partition)] = end
    options["endingOffsets"] = json.dumps(ending)
    sample = (
        spark.read.format(SOURCE_NAME)
        .options(**options)
        .load()
        .where("value IS NOT NULL")
        .selectExpr("CAST(value AS STRING) AS value")
    )
    fields = spark.read.json(sample.rdd.map(lambda row: row.value)).schema
    fields = type(fields)([f for f in fields.fields if f.name != "_corrupt_record"])
    if not fields.fields:
        raise BadInput("--value-schema infer found no JSON object in the topic's first records")
    return fields
