"""Arrow types as an Iceberg table takes them, for the table's schema (on the driver) and for
the files Spark's tasks write (on the executors).

Iceberg has no 8- or 16-bit integers and keeps timestamps with a zone in UTC only, while
Spark's Arrow batches carry tinyint/smallint as such and timestamps in the session's zone. A
file's columns are cast on their way to Parquet (the same instants, wider integers), so the
driver can add the files to the table as they are.

Runs on executors: imports pyarrow only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa


def iceberg_type(data_type: pa.DataType) -> pa.DataType:
    """The Arrow type of the Iceberg column that holds values of `data_type`."""
    if pa.types.is_int8(data_type) or pa.types.is_int16(data_type):
        return pa.int32()
    if pa.types.is_uint8(data_type) or pa.types.is_uint16(data_type):
        return pa.int32()
    if pa.types.is_uint32(data_type):
        return pa.int64()
    if pa.types.is_timestamp(data_type):
        return pa.timestamp("us", "UTC" if data_type.tz else None)
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return pa.list_(data_type.value_field.with_type(iceberg_type(data_type.value_type)))
    if pa.types.is_map(data_type):
        return pa.map_(
            data_type.key_field.with_type(iceberg_type(data_type.key_type)),
            data_type.item_field.with_type(iceberg_type(data_type.item_type)),
        )
    if pa.types.is_struct(data_type):
        return pa.struct([f.with_type(iceberg_type(f.type)) for f in data_type])
    return data_type


def iceberg_schema(schema: pa.Schema) -> pa.Schema:
    """Every column optional: Spark's batches and the source's files differ in nullability,
    and Iceberg refuses a file whose column may be null for a required one."""
    return pa.schema([pa.field(f.name, iceberg_type(f.type), nullable=True) for f in schema])


def conformed(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task's batches in the types of the Iceberg columns."""
    for batch in batches:
        wanted = pa.schema([f.with_type(iceberg_type(f.type)) for f in batch.schema])
        yield batch if wanted == batch.schema else batch.cast(wanted)
