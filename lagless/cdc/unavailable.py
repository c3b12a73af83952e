"""Debezium's placeholder for a TOASTed value an update did not change (PostgreSQL sends none):
its form in each column type, and where a batch's column holds it.

Debezium 3.6's PostgreSQL connector sends, for an unchanged TOASTed value (seen in
tests/integration/test_mirror_types.py):

| column | Debezium sends | the column holds (connect_types) |
| --- | --- | --- |
| text, varchar, json, jsonb, xml | `__debezium_unavailable_value` | that text |
| bytea | its bytes (base64) | those bytes |
| hstore (`hstore.handling.mode=json`) | `{"__debezium...":"__debezium..."}` | the text, as text's |
| hstore (`map`) | a map of the text to itself | that map |
| text[], varchar[], json[], jsonb[] | a list of the text | that list |
| uuid[] | a list of UUID.nameUUIDFromBytes(its bytes) | a list of the text |
| bytea[] | a list of its bytes | that list |
| int[], bigint[], date[] | its bytes, each byte a number | those numbers (dates: days) |
| smallint[], real[], double[], numeric[], boolean[], timestamp[], ... | NULL | NULL |

The last row cannot be told from a NULL: a mirror of such a table needs `REPLICA IDENTITY
FULL` (docs/mirror.md). For every other type the column holds `unavailable_value(type)`: the
stores' upserts keep the value they hold (sinks/sql.py, sinks/newer_wins.py, the batch's own
earlier value first: importer/change_files.py, importer/rows.py), a primary-key change's new
row takes the old row's, and where none is known they store NULL, marked, never the
placeholder (cdc/key_change.py).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

UNAVAILABLE = "__debezium_unavailable_value"
UNAVAILABLE_BYTES = UNAVAILABLE.encode()
# Its other forms, which the converters of text (Json, Uuid) make UNAVAILABLE.
UNAVAILABLE_HSTORE = json.dumps({UNAVAILABLE: UNAVAILABLE}, separators=(",", ":"))
UNAVAILABLE_UUID = str(uuid.UUID(bytes=hashlib.md5(UNAVAILABLE_BYTES).digest(), version=3))
TEXT_FORMS = (UNAVAILABLE_HSTORE, UNAVAILABLE_UUID)
_EPOCH_DAY = datetime.date(1970, 1, 1)


def as_text(value: Any) -> Any:
    """A text value, with the placeholder's other text forms as UNAVAILABLE."""
    return UNAVAILABLE if value in TEXT_FORMS else value


def unavailable_value(data_type: DataType) -> Any:
    """What a column of `data_type` holds where Debezium sent the placeholder (as Arrow's
    to_pylist gives it), or None: Debezium sends NULL for it, or the type is not TOASTed."""
    from pyspark.sql import types as T

    if isinstance(data_type, T.StringType):
        return UNAVAILABLE
    if isinstance(data_type, T.BinaryType):
        return UNAVAILABLE_BYTES
    if isinstance(data_type, T.ArrayType):
        item = data_type.elementType
        if isinstance(item, T.StringType):
            return [UNAVAILABLE]
        if isinstance(item, T.BinaryType):
            return [UNAVAILABLE_BYTES]
        if isinstance(item, T.IntegerType | T.LongType):
            return list(UNAVAILABLE_BYTES)
        if isinstance(item, T.DateType):
            return [_EPOCH_DAY + datetime.timedelta(days=b) for b in UNAVAILABLE_BYTES]
    if isinstance(data_type, T.MapType) and all(
        isinstance(t, T.StringType) for t in (data_type.keyType, data_type.valueType)
    ):
        return [(UNAVAILABLE, UNAVAILABLE)]
    return None


def unavailable_json(data_type: DataType) -> str | None:
    """The placeholder of a nested column as JSON text, as Spark's to_json writes the value
    (the SQL stores keep nested values as JSON); None for a flat or untoasted one."""
    from pyspark.sql import types as T

    value = unavailable_value(data_type)
    if value is None or not isinstance(data_type, T.ArrayType | T.MapType):
        return None

    def shown(item: Any) -> Any:
        if isinstance(item, bytes):
            return base64.b64encode(item).decode()
        if isinstance(item, datetime.date):
            return item.isoformat()
        return item

    if isinstance(data_type, T.MapType):
        return json.dumps({k: v for k, v in value}, separators=(",", ":"))
    return json.dumps([shown(item) for item in value], separators=(",", ":"))


def keeps_unavailable(data_type: DataType) -> bool:
    """A column whose value may be Debezium's placeholder: a store keeps the value it holds
    where a row brings that one."""
    return unavailable_value(data_type) is not None


def kept_columns(fields: StructType, key: tuple[str, ...]) -> list[tuple[str, DataType]]:
    """(name, type) of each column whose placeholder keeps the stored value."""
    return [
        (f.name, f.dataType) for f in fields if keeps_unavailable(f.dataType) and f.name not in key
    ]


def unavailable_mask(values: pa.Array | pa.ChunkedArray, data_type: DataType) -> pa.Array:
    """Where `values` (a batch's column of `data_type`) hold the placeholder: a boolean array,
    never null."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    marker = unavailable_value(data_type)
    if marker is None or len(values) == 0:
        return pa.array(np.zeros(len(values), bool))
    if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)) and not (
        pa.types.is_map(values.type)
    ):
        return pc.fill_null(pc.equal(values, pa.scalar(marker, values.type)), False)
    lengths = np.diff(values.offsets.to_numpy(zero_copy_only=False))  # a null's is 0
    sized = lengths == len(marker)
    found = np.zeros(len(values), bool)
    for at in np.flatnonzero(sized):
        found[at] = values[int(at)].as_py() == marker
    return pa.array(found)


def placed(values: pa.Array, data_type: DataType, where: pa.Array) -> pa.Array:
    """`values` (a batch's column of `data_type`) with the placeholder where `where` holds: a
    key change's delete stands for the row's values, which the mirror finds (cdc/key_change.py)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return pc.if_else(where, pa.scalar(unavailable_value(data_type), values.type), values)
