"""Typed JSON values decoded in the source's tasks, a batch of records at a time, where that
gives exactly what Spark's from_json would (option decodeJsonValues; importer/rows.py).

Spark's from_json sets a JSON parser up for every value, which cost a typed import into SQLite
more than parsing itself (JFR: 15 % of the executors' samples in JsonFactory._createContext).
pyarrow's JSON reader parses a whole batch at once, but its rules are not Spark's, so it is
used only where both agree, and a batch is handed back undecided (its column NULL: the JVM's
from_json decides every one of its records) on anything else:
- the columns are of types whose JSON form both read alike: whole numbers (INT, BIGINT: a
  fraction, an exponent or a number out of range is refused by both), DOUBLE (both round
  correctly), BOOLEAN and STRING (a number or an object for a string field is text to Spark,
  an error to pyarrow: undecided). Anything else (dates, decimals, nested) is never decoded
  here (`decodable`);
- pyarrow reads the batch without an error: a value that is not an object, not UTF-8 or not
  JSON, a field of another type, a key given twice, a lone surrogate, single quotes: errors;
- one row per value: a value holding a line break, blank, or two objects on one line would
  not come back as one row, and is never given to pyarrow;
- no spelling of NaN or infinity where a value may start (pyarrow and Jackson accept different
  ones, in fields the schema skips too), and no DOUBLE that overflowed to infinity;
- within the limits Jackson reads by (StreamReadConstraints: numbers of at most 1,000 digits,
  nesting at most 1,000 deep, names of at most 50,000 characters), which pyarrow does not
  have: values of at most 50,000 bytes, no run of 1,000 digits, fewer than 1,000 brackets.
Rows of tombstones (NULL values) stay NULL, as from_json leaves them.

Runs on executors: imports nothing of lagless but the decodable types.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from lagless.decodable_types import DECODABLE_TYPES

log = logging.getLogger(__name__)
# The column the decoded values arrive in: a struct of the schema's fields and CORRUPT, NULL
# where the batch was left to from_json.
COLUMN = "_lagless_json"
# from_json's columnNameOfCorruptRecord in importer/rows.py: always NULL here, as from_json
# leaves it for a value it took.
CORRUPT = "_lagless_corrupt"
# Any spelling of a non-number either parser knows (Jackson: NaN, Infinity, -INF, ...;
# RapidJSON: NaN, Inf, Infinity), in any case, where a value starts (after ':', ',' or '['):
# such a batch is left to from_json. Inside a string it is a needless fallback, never a wrong
# value. Looked for only where the batch's text holds "nan" or "inf" at all (cheaper).
_NON_NUMBER = re.compile(rb"[:,\[][ \t]*[-+]?(?:nan|inf)")
# Jackson's StreamReadConstraints (its defaults; pyarrow has none): a longer value is left to
# from_json, and in a value of more than _SHORT bytes, a run of 1,000 digits or 1,000 brackets.
_LONGEST = 50_000
_SHORT = 999
_DIGITS = re.compile(rb"[0-9]{1000}")
_DEEPEST = 1000
# A byte-order mark, in UTF-8: a batch holding one anywhere is left to from_json.
_BOM = b"\xef\xbb\xbf"
# The fewest values a batch is split into around one that cannot be decoded (JsonValues.decoded).
UNDECIDED_RUN = 16


def decodable(fields_json: str) -> bool:
    """Whether a schema (StructType.json()) holds only columns decoded alike by both parsers."""
    fields = json.loads(fields_json).get("fields", [])
    return bool(fields) and all(
        isinstance(f["type"], str) and f["type"] in DECODABLE_TYPES for f in fields
    )


def arrow_type(fields_json: str) -> pa.StructType:
    """COLUMN's type: the schema's fields, then CORRUPT."""
    fields = json.loads(fields_json)["fields"]
    return pa.struct(
        [pa.field(f["name"], DECODABLE_TYPES[f["type"]]) for f in fields]
        + [pa.field(CORRUPT, pa.string())]
    )


def spark_type(fields_json: str) -> str:
    """COLUMN's type in Spark's DDL, for the source's schema."""
    fields = json.loads(fields_json)["fields"]
    inner = ", ".join(f"`{f['name'].replace('`', '``')}`: {f['type']}" for f in fields)
    return f"struct<{inner}, {CORRUPT}: string>"


class JsonValues:
    """Adds COLUMN to the source's batches (reader.py's Arrow), one batch at a time."""

    def __init__(self, fields_json: str) -> None:
        self.type = arrow_type(fields_json)
        fields = [f for f in self.type if f.name != CORRUPT]
        self.parse_options = pj.ParseOptions(
            explicit_schema=pa.schema(fields),
            unexpected_field_behavior="ignore",
            newlines_in_values=False,
        )
        self.doubles = [f.name for f in fields if f.type == pa.float64()]

    def added_to(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """A task's batches with COLUMN; how many values it decoded goes to the log."""
        decoded = left = 0
        for batch in batches:
            batch = self.add_column(batch)
            column = batch.column(COLUMN)
            decoded += len(column) - column.null_count
            left += column.null_count - batch.column("value").null_count  # not tombstones
            yield batch
        log.debug("typed JSON: %d values decoded in the task, %d left to from_json", decoded, left)

    def add_column(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        decoded = self.decoded(batch.column("value"))
        return pa.RecordBatch.from_arrays(
            [*batch.columns, decoded], names=[*batch.schema.names, COLUMN]
        )

    def decoded(self, values: pa.Array) -> pa.Array:
        """COLUMN for the values: decoded at once, else in halves around the values that
        cannot be, down to UNDECIDED_RUN values left to from_json together. A task gathers
        its reads (reader.gathered): one odd value would otherwise leave thousands."""
        decoded = self.decode(values)
        if decoded is not None:
            return decoded
        if len(values) <= UNDECIDED_RUN or values.null_count == len(values):
            return pa.nulls(len(values), self.type)
        half = len(values) // 2
        return pa.concat_arrays(
            [self.decoded(values.slice(0, half)), self.decoded(values.slice(half))]
        )

    def decode(self, values: pa.Array) -> pa.Array | None:
        """The values as COLUMN, or None: the batch is left to from_json."""
        present = values.drop_null()
        if len(present) == 0:
            return None
        try:
            texts = present.cast(pa.string())  # refuses bytes that are not UTF-8
        except pa.ArrowInvalid:
            return None
        longest = pc.max(pc.binary_length(present)).as_py()
        if (
            longest > _LONGEST
            or pc.min(pc.utf8_length(pc.utf8_trim_whitespace(texts))).as_py() == 0
        ):
            return None  # a blank value would be no row
        joined = pc.binary_join(pa.ListArray.from_arrays([0, len(texts)], texts), "\n")
        document = joined[0].as_buffer()
        if not _one_line_each(document.to_pybytes(), len(texts), longest):
            return None
        try:
            table = pj.read_json(
                io.BytesIO(document),  # one block: a value never spans two
                read_options=pj.ReadOptions(use_threads=False, block_size=len(document) + 1),
                parse_options=self.parse_options,
            )
        except pa.ArrowInvalid:
            return None
        if table.num_rows != len(present):
            return None
        for name in self.doubles:
            column = table.column(name)
            if pc.any(pc.invert(pc.is_finite(column))).as_py():
                return None
        arrays = [table.column(f.name).combine_chunks() for f in self.type if f.name != CORRUPT]
        decoded = pa.StructArray.from_arrays(
            [*arrays, pa.nulls(len(present), pa.string())], fields=list(self.type)
        )
        if values.null_count == 0:
            return decoded
        # A tombstone's row stays NULL: the decoded rows taken in order, NULL at each tombstone.
        taken = pc.subtract(pc.cumulative_sum(pc.is_valid(values).cast(pa.int64())), 1)
        return decoded.take(pc.if_else(pc.is_valid(values), taken, None))


def _one_line_each(document: bytes, values: int, longest: int) -> bool:
    """Whether the values joined by line breaks read as one line each, within Jackson's
    limits, and hold no non-number (_NON_NUMBER)."""
    if document.count(b"\n") != values - 1 or b"\r" in document:
        return False  # a value holds a line break
    if _BOM in document:
        return False  # pyarrow skips one that starts its input; from_json refuses the value
    lowered = document.lower()
    if (b"nan" in lowered or b"inf" in lowered) and _NON_NUMBER.search(lowered):
        return False
    if longest > _SHORT:
        return not _DIGITS.search(document) and all(
            line.count(b"[") + line.count(b"{") < _DEEPEST
            for line in document.split(b"\n")
            if len(line) > _SHORT
        )
    return True
