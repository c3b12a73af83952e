"""Parquet files written by the Kafka source's tasks themselves (its executorWriter option),
for the stores kept as folders (folder_table.py: Parquet, Delta, Iceberg), and typed appends
into SQLite.

A task writes one file for its pieces into `<table>/_staging` (task_files.StagedFiles): a
retried or replayed task replaces it with the same records. Nothing under `_staging` is visible
to readers (pyarrow and Spark skip names that start with `_`); each store's commit_staged takes
a batch's files into its table at once.

Typed values (TypedFiles) arrive decoded by the source (its decodeJsonValues or
decodeAvroValues column, NULL where a value was left to Spark's rows): a task writes the rows
of the values it decoded, in the columns and types Spark's rows would have, and leaves every
other record, as read, to a file under `_left` (a value it did not decode, or one lacking a
required field: importer/rows.py gives such records their row or their rejection reason).

Runs on executors: imports nothing of lagless but the decodable types, the planner's ranges
and task_files.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lagless.decodable_types import DECODABLE_TYPES
from lagless.planner.ranges import OffsetRange
from lagless.secret import Secret
from lagless.sinks.s3 import S3Access
from lagless.sinks.task_files import (
    FILE_SCHEMA,
    NO_DICTIONARY,
    StagedFiles,
    millis,
    output_file,
    pieces_file_name,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

STAGING = "_staging"
# Under a run's staging folder: the records the tasks left to Spark's rows.
LEFT = "_left"
# What a left record keeps: the source's columns importer/rows.py reads, in the source's types.
LEFT_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
LEFT_SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"
)


def writer(config: Mapping[str, Any], secret: Secret | None = None) -> StagedFiles | TypedFiles:
    """config: the staging "folder" (a local path, or s3://bucket/key with "s3", the access
    S3Access.to_task gave, and its secret); for typed values, "fields" (the value's schema,
    StructType.json()), "required" (fields a value must give) and "decoded" (the source's
    column of decoded values)."""
    s3 = S3Access.from_task(config["s3"], secret) if config.get("s3") else None
    if config.get("fields"):
        return TypedFiles(
            str(config["folder"]),
            str(config["fields"]),
            list(config["required"]),
            str(config["decoded"]),
            s3,
        )
    return StagedFiles(
        str(config["folder"]), ".parquet", lambda where: _parquet(where, FILE_SCHEMA), s3
    )


def task_config(
    folder: str,
    s3: S3Access | None,
    fields: StructType | None = None,
    decoded: str | None = None,
) -> tuple[str, Secret | None]:
    """The JSON config and secret of `writer` for a staging folder: raw values, or the typed
    values of `fields` the source decodes into its column `decoded`."""
    config: dict[str, Any] = {"folder": folder}
    if fields is not None:
        required = [f.name for f in fields if not f.nullable]
        config |= {"fields": fields.json(), "required": required, "decoded": decoded}
    if s3 is None:
        return json.dumps(config), None
    access, secret = s3.to_task()
    return json.dumps({**config, "s3": access}), secret


def typed_schema(fields_json: str) -> pa.Schema:
    """The rows of a typed append as Spark's tasks hold them (importer/rows.py's shape,
    accepted): the record's coordinates, its key, its timestamp in ms, the value's fields;
    every column nullable, as Spark's are."""
    fields = json.loads(fields_json)["fields"]
    return pa.schema(
        [pa.field(f.name, f.type) for f in FILE_SCHEMA if f.name != "value"]
        + [pa.field(f["name"], DECODABLE_TYPES[f["type"]]) for f in fields]
    )


class TypedFiles:
    """The source's executorWriter for typed values (JSON or Avro): a task writes the rows of
    the values the source decoded into one file named by its pieces (as StagedFiles does),
    and the other records into one file of `<folder>/_left` of the same name (only when there
    are some)."""

    def __init__(
        self,
        folder: str,
        fields_json: str,
        required: list[str],
        decoded: str,
        s3: S3Access | None = None,
    ) -> None:
        self.folder = folder
        self.schema = typed_schema(fields_json)
        self.fields = [f["name"] for f in json.loads(fields_json)["fields"]]
        self.required = required
        self.decoded = decoded
        self.s3 = s3

    def write(
        self, pieces: Sequence[OffsetRange], batches: Iterator[pa.RecordBatch]
    ) -> tuple[str, str | None]:
        name = pieces_file_name(pieces, ".parquet")
        left_folder = f"{self.folder}/{LEFT}"
        left: pq.ParquetWriter | None = None
        with ExitStack() as files:
            rows = _parquet(
                files.enter_context(output_file(self.folder, name, self.s3)), self.schema
            )
            files.callback(rows.close)
            for batch in batches:
                typed, rest = self.split(batch)
                rows.write_batch(typed)
                if rest.num_rows:
                    if left is None:
                        where = files.enter_context(output_file(left_folder, name, self.s3))
                        left = _parquet(where, rest.schema)
                        files.callback(left.close)
                    left.write_batch(rest)
        return f"{self.folder}/{name}", f"{left_folder}/{name}" if left else None

    def split(self, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch]:
        """The rows of the batch's decoded values (a tombstone's row has NULL fields, as
        from_json leaves them), and the records left to Spark's rows: a value not decoded,
        or one without a field it must give (a rejection the driver names)."""
        values = batch.column("value")
        decoded = batch.column(self.decoded)
        present = pc.is_valid(values)
        undecided = pc.is_null(decoded)
        for name in self.required:
            undecided = pc.or_(undecided, pc.is_null(pc.struct_field(decoded, name)))
        to_spark = pc.and_(present, undecided)
        rest = batch.filter(to_spark).select(list(LEFT_COLUMNS))
        kept = batch.filter(pc.invert(to_spark))
        value = kept.column(self.decoded)
        columns = [kept.column(n) for n in ("topic", "partition", "offset", "key")]
        typed = pa.RecordBatch.from_arrays(
            [*columns, millis(kept), *(pc.struct_field(value, n) for n in self.fields)],
            schema=self.schema,
        )
        return typed, rest


def _parquet(where: Any, schema: pa.Schema) -> pq.ParquetWriter:
    return pq.ParquetWriter(
        where,
        schema,
        use_dictionary=[n for n in schema.names if n not in NO_DICTIONARY],
        compression="snappy",
    )


def left_records(spark: SparkSession, files: list[str], s3: S3Access | None) -> DataFrame:
    """On the driver: the records of the tasks' `_left` files, read by Spark's tasks."""
    names = spark.createDataFrame([(path,) for path in files], "file string")
    return names.repartition(len(files)).mapInArrow(partial(read_left, s3), LEFT_SPARK_SCHEMA)


def read_files(paths: list[str], fields_json: str) -> pa.RecordBatchReader:
    """On the driver (SQLite): the rows of a batch's typed files, one batch at a time."""

    def batches() -> Iterator[pa.RecordBatch]:
        for path in paths:
            yield from pq.ParquetFile(path).iter_batches()

    return pa.RecordBatchReader.from_batches(typed_schema(fields_json), batches())


def read_left(s3: S3Access | None, names: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A Spark task (mapInArrow over a column `file`): the records of these `_left` files, in
    LEFT_SPARK_SCHEMA."""
    filesystem = s3.filesystem() if s3 is not None else None
    for batch in names:
        for path in batch.column("file").to_pylist():
            where = path.removeprefix("s3://") if filesystem is not None else path
            yield from pq.ParquetFile(where, filesystem=filesystem).iter_batches()
