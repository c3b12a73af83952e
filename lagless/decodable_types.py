"""The Spark types a value's column may have where a task decodes the value itself, not
Spark's rows (the source's decoding, source/json_values.py; the tasks' typed files,
sinks/staged_parquet.py), by the names StructType.json() gives them, each with the Arrow type
it is decoded and written as. One table for both sides: the sinks may not import the source."""

import pyarrow as pa

DECODABLE_TYPES = {
    "long": pa.int64(),
    "integer": pa.int32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
}
