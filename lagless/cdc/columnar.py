"""A batch of change events read at once: the envelope's rules (cdc/envelope.py) for the
common batch, in Arrow's columns instead of a Python dict per event.

A mirror's task spent ~8 µs an event in Python (orjson, each column's value through its
convert, a dict per row, the rows into Arrow): most of a continuous mirror's task time. Here
the payloads are parsed by Arrow's JSON reader into typed columns in one call, and a column is
cast to its Arrow type where its JSON values are that type's already (numbers, booleans, text,
dates, timestamps scaled to µs); the columns whose values need Python (base64 bytes and
decimals, zoned timestamps, times of day) go through the same `convert` as an event at a time.

Only the common shape is read here: upserts (`r`, `c`, `u` with an `after`) of one schema the
table takes, in Kafka Connect's JSON (Avro events are read an event at a time), in an import
with hard deletes. Any other event of the batch (a delete, a
tombstone, an op a mirror does not apply, an event without `after`) is read by
Envelope.change, in its place. A batch this cannot take whole (a value of a JSON type its
column does not read, a new schema, nested columns, soft deletes) is read an event at a time:
`changes` returns None. tests/unit/test_columnar.py holds the two readings equal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from lagless.cdc.connect_types import FIRST_DAY, FIRST_MICROS, LAST_DAY, LAST_MICROS
from lagless.cdc.envelope import (
    DELETED,
    KEY_MISSING,
    LSN,
    OP,
    PAYLOAD_AT,
    SCHEMA_HEAD,
    SOURCE_TS_MS,
    Change,
    Envelope,
    Unstorable,
)
from lagless.cdc.envelope import split as json_events
from lagless.cdc.unavailable import TEXT_FORMS, UNAVAILABLE

if TYPE_CHECKING:
    from lagless.cdc.connect_types import Column, ReadAs

_JSON_TYPES = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "text": pa.string()}
_UPSERT_OPS = ("r", "c", "u")
# Base64's alphabet as 6-bit values (255: not base64).
_BASE64 = np.full(256, 255, np.uint8)
_BASE64[
    np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", np.uint8)
] = np.arange(64, dtype=np.uint8)
# What _decimal_schemaless reads as text, or refuses: each value's convert decides.
_DECIMAL_TEXT = r"\.|^-|^[0-9]+$"
# Arrow's JSON reader naming a column whose values are of another JSON type than asked.
_OTHER_TYPE = re.compile(r"Column\(/after/([^)/]*)\) changed from")
# The payloads' op, after and source, each a column of the batch's present values.
Parsed = dict[str, pa.Array]


@dataclass(frozen=True)
class Decoded:
    """What each event of a batch does, in its order: `rows` (the upserted row, or the key's
    columns of a delete; null where the event is rejected or skipped) and, as Change's
    fields, `delete`, `skip`, `error`, `new_schema`."""

    rows: pa.StructArray
    delete: pa.Array
    skip: pa.Array
    error: pa.Array
    # Each event's row schema where the table's columns do not take it yet (read an event at
    # a time only: None here).
    new_schema: pa.Array | None = None
    # Each event's TRUNCATE flag (read an event at a time only: None here).
    truncate: pa.Array | None = None


def of_changes(changes: Sequence[Change], row_type: pa.StructType) -> Decoded:
    """Changes read an event at a time (Envelope.change) as a Decoded batch: an event whose row
    Arrow refuses in `row_type` (a value its column cannot hold) is rejected alone, with its
    column and the reason (UNSTORABLE), never the batch."""
    rows = [change.row for change in changes]
    errors = [change.error for change in changes]
    try:
        array = pa.array(rows, type=row_type)
    except _ARROW_REFUSES:
        for at, row in enumerate(rows):
            refused = None if row is None else _refused(row, row_type)
            if refused is not None:
                rows[at], errors[at] = None, refused
        array = pa.array(rows, type=row_type)
    schemas = [change.new_schema for change in changes]
    deletes = [c.delete and e is None for c, e in zip(changes, errors, strict=True)]
    return Decoded(
        rows=array,
        delete=pa.array(deletes, pa.bool_()),
        skip=pa.array([change.skip for change in changes], pa.bool_()),
        error=pa.array(errors, pa.string()),
        new_schema=pa.array(schemas, pa.string()),
        truncate=pa.array([change.truncate for change in changes], pa.bool_()),
    )


_ARROW_REFUSES = (pa.ArrowException, ValueError, TypeError, OverflowError)


def _refused(row: dict[str, object], row_type: pa.StructType) -> str | None:
    """Why Arrow refuses the row in `row_type` (the first column it refuses), or None."""
    for field in row_type:
        try:
            pa.array([row.get(field.name)], type=field.type)
        except _ARROW_REFUSES as exc:
            return str(Unstorable(field.name, exc))
    return None


def changes(
    envelope: Envelope,
    keys: pa.Array,
    values: pa.Array,
    row_type: pa.StructType,
    chosen: dict[str, int] | None = None,
) -> Decoded | None:
    """The batch's events (Kafka `keys` and `values`, binary) as Envelope.change reads them,
    in the table's `row_type`; None when the batch is to be read an event at a time.
    `chosen`: the reading (Column.read_as) each column's values took last, kept between
    batches by the caller: a timestamp column of --value-schema holds µs or ISO text."""
    if envelope.deletes != "hard" or envelope.change_log or len(values) == 0:
        return None
    if envelope.events is not json_events:  # Avro: an event at a time
        return None
    present = pc.is_valid(values)
    split = _payloads(values.filter(present))
    if split is None:
        return None
    payloads, schema = split
    columns, new_schema = envelope.columns(schema)
    wanted = [c for c in columns if c.name in envelope.names]
    if new_schema is not None or not wanted or not all(c.read_as for c in wanted):
        return None
    if not envelope.as_stored(columns):  # a narrower type or a default: an event at a time
        return None
    chosen = {} if chosen is None else chosen
    try:
        parsed, readings = _read(payloads, wanted, envelope.cdc, chosen)
        if parsed is None:
            return None
        upsert = pc.fill_null(
            pc.and_(
                pc.is_in(parsed["op"], value_set=pa.array(_UPSERT_OPS)),
                pc.is_valid(parsed["after"]),
            ),
            False,
        )
        rows, missing_key = _upserts(parsed, upsert, readings, envelope, row_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, TypeError, OverflowError):
        return None  # what Arrow's reading refuses, the event at a time reads or rejects
    return _with_the_others(envelope, keys, values, present, upsert, rows, missing_key, row_type)


def _with_the_others(
    envelope: Envelope,
    keys: pa.Array,
    values: pa.Array,
    present: pa.Array,
    upsert: pa.Array,
    rows: pa.Array,
    missing_key: pa.Array,
    row_type: pa.StructType,
) -> Decoded | None:
    """The upserts Arrow read (`rows`, where `upsert` holds among the `present` values) and the
    other events, each read by Envelope.change, back in the batch's order; None when one of
    the others brings a new schema or a truncate (the batch is read an event at a time)."""
    present_at = np.flatnonzero(present.to_numpy(zero_copy_only=False))
    upsert_at = present_at[upsert.to_numpy(zero_copy_only=False)]
    other_at = np.setdiff1d(np.arange(len(values)), upsert_at, assume_unique=True)
    others = [envelope.change(keys[int(i)].as_py(), values[int(i)].as_py()) for i in other_at]
    if any(change.new_schema is not None or change.truncate for change in others):
        return None
    order = np.argsort(np.concatenate([upsert_at, other_at]), kind="stable")
    errors = pa.concat_arrays(
        [
            pc.if_else(missing_key, pa.scalar(KEY_MISSING), pa.scalar(None, pa.string())),
            pa.array([c.error for c in others], pa.string()),
        ]
    )

    def each(fast: pa.Array, slow: list[object], kind: pa.DataType) -> pa.Array:
        return pa.concat_arrays([fast, pa.array(slow, kind)]).take(order)

    no = pa.repeat(pa.scalar(False), len(upsert_at))
    return Decoded(
        rows=each(rows, [c.row for c in others], row_type),
        delete=each(no, [c.delete for c in others], pa.bool_()),
        skip=each(no, [c.skip for c in others], pa.bool_()),
        error=errors.take(order),
    )


def _payloads(values: pa.Array) -> tuple[pa.Array, bytes | None] | None:
    """(each value's payload JSON, the schema's text or None) when every value carries the
    same schema or none does (Kafka Connect's JsonConverter writes the schema first); None
    when they differ."""
    if len(values) == 0:
        return values, None
    first = values[0].as_py()
    if not first.startswith(SCHEMA_HEAD):
        if pc.any(pc.starts_with(values, SCHEMA_HEAD)).as_py():
            return None
        return values, None
    at = first.find(PAYLOAD_AT)
    if at < 0:
        return None
    head = first[: at + len(PAYLOAD_AT)]
    if not (
        pc.all(pc.starts_with(values, head)).as_py() and pc.all(pc.ends_with(values, b"}")).as_py()
    ):
        return None
    return pc.binary_slice(values, len(head), -1), first[len(SCHEMA_HEAD) : at]


def _read(
    payloads: pa.Array, wanted: list[Column], cdc: list[str], chosen: dict[str, int]
) -> tuple[Parsed | None, dict[str, tuple[Column, ReadAs]]]:
    """The payloads parsed with each column's reading `chosen` last; a column whose values
    the reader finds of another JSON type (it names the column) takes its next reading, each
    tried once (ArrowInvalid when none reads them)."""
    choice = {c.name: chosen.get(c.name, 0) % len(c.read_as) for c in wanted}
    tried = {c.name: 1 for c in wanted}
    by_name = {c.name: c for c in wanted}
    while True:
        readings = {name: (c, c.read_as[choice[name]]) for name, c in by_name.items()}
        try:
            parsed = _parsed(payloads, readings, cdc)
        except pa.ArrowInvalid as exc:
            found = _OTHER_TYPE.search(str(exc))
            name = found.group(1) if found else None
            if name not in by_name or tried[name] >= len(by_name[name].read_as):
                raise
            choice[name] = (choice[name] + 1) % len(by_name[name].read_as)
            tried[name] += 1
            continue
        chosen.update(choice)
        return parsed, readings


def _parsed(
    payloads: pa.Array, readings: dict[str, tuple[Column, ReadAs]], cdc: list[str]
) -> Parsed | None:
    """The payloads' op, after (the wanted columns, as their JSON types) and source (when
    the mirror's own columns need it), by Arrow's JSON reader; None when it reads another
    number of rows (a value spread over lines)."""
    after = pa.struct(
        [(name, _JSON_TYPES[read_as.json]) for name, (_, read_as) in readings.items()]
    )
    fields = [("op", pa.string()), ("after", after)]
    if SOURCE_TS_MS in cdc or LSN in cdc:
        fields.append(("source", pa.struct([("ts_ms", pa.int64()), ("lsn", pa.int64())])))
    lines = pc.binary_join_element_wise(payloads, pa.scalar(b""), pa.scalar(b"\n"))
    if len(lines) == 0:
        return {name: pa.array([], kind) for name, kind in fields}
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)
    start, end = int(offsets[lines.offset]), int(offsets[lines.offset + len(lines)])
    text = lines.buffers()[2][start:end]
    parsed = pj.read_json(
        pa.BufferReader(text),
        read_options=pj.ReadOptions(use_threads=False, block_size=max(len(text) + 1, 1 << 20)),
        parse_options=pj.ParseOptions(
            explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore"
        ),
    )
    if parsed.num_rows != len(payloads):
        return None
    return {name: parsed[name].combine_chunks() for name in parsed.column_names}


def _upserts(
    parsed: Parsed,
    upsert: pa.Array,
    readings: dict[str, tuple[Column, ReadAs]],
    envelope: Envelope,
    row_type: pa.StructType,
) -> tuple[pa.StructArray, pa.Array]:
    """The upserts' rows (null where the row lacks a key field) and which lack one."""
    after = parsed["after"].filter(upsert)
    count = len(after)
    parsed_columns = dict(zip(readings, after.flatten(), strict=True))
    arrays = []
    for field in row_type:
        if field.name in readings:
            column, read_as = readings[field.name]
            arrays.append(_converted(parsed_columns[field.name], column, read_as, field.type))
        elif field.name in envelope.cdc and count:
            arrays.append(_cdc_column(parsed, upsert, count, field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(count, field.type))
    by_field = dict(zip([f.name for f in row_type], arrays, strict=True))
    missing = pa.repeat(pa.scalar(False), count)
    for name in envelope.key_fields:
        key = by_field.get(name)
        missing = pc.or_(missing, pc.is_null(key) if key is not None else pa.scalar(True))
    rows = pa.StructArray.from_arrays(arrays, fields=list(row_type), mask=missing)
    return rows, missing


def _converted(parsed: pa.Array, column: Column, read_as: ReadAs, target: pa.DataType) -> pa.Array:
    """A column's JSON values as its Arrow type, as column.convert and pa.array would."""
    if read_as.decimal and pa.types.is_decimal128(target):
        decimals = _decimals(parsed, target, guessed=read_as.decimal == "guessed")
        if decimals is not None:
            return decimals
    if read_as.each:
        convert = column.convert
        return pa.array([None if v is None else convert(v) for v in parsed.to_pylist()], target)
    if read_as.per_second:
        parsed = _in_range(_as_micros(parsed, read_as.per_second), FIRST_MICROS, LAST_MICROS)
    if pa.types.is_date32(target):
        parsed = _in_range(parsed, FIRST_DAY, LAST_DAY).cast(pa.int32())
    if pa.types.is_string(target):  # connect_types' as_text
        other_form = pc.is_in(parsed, value_set=pa.array(TEXT_FORMS, pa.string()))
        return pc.if_else(other_form, pa.scalar(UNAVAILABLE), parsed)
    return parsed.cast(target)


def _in_range(parsed: pa.Array, first: int, last: int) -> pa.Array:
    """Dates or timestamps within the range every store holds; ValueError when one is not
    (an infinity or a value out of range: the batch is read an event at a time, which maps
    or refuses each, connect_types)."""
    bounds = pc.min_max(parsed)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is not None and (low < first or high > last):
        raise ValueError("a date or timestamp outside the range every store holds")
    return parsed


def _decimals(texts: pa.Array, target: pa.Decimal128Type, guessed: bool) -> pa.Array | None:
    """Base64 unscaled values as decimals at once (None: some are not base64 of at most 8
    bytes, exceed the precision or, `guessed`, read as text: each value's convert decides)."""
    if target.precision > 18 or len(texts) == 0:
        return None
    if guessed and pc.any(pc.match_substring_regex(texts, _DECIMAL_TEXT)).as_py():
        return None
    unscaled = _unscaled64(texts.fill_null("AA=="))
    bound = 10**target.precision  # at most 10**18: within int64, unlike abs(-2**63)
    if unscaled is None or ((unscaled >= bound) | (unscaled <= -bound)).any():
        return None
    two_words = np.empty((len(texts), 2), np.int64)
    two_words[:, 0], two_words[:, 1] = unscaled, unscaled >> 63  # little-endian 128 bits
    decimals = pa.Array.from_buffers(target, len(texts), [None, pa.py_buffer(two_words)])
    return pc.if_else(texts.is_valid(), decimals, pa.scalar(None, target))


def _unscaled64(texts: pa.Array) -> np.ndarray | None:
    """Each text's base64 bytes as a big-endian two's complement integer (Connect's Decimal),
    when all are base64 of 1 to 8 bytes."""
    count = len(texts)
    lengths = pc.binary_length(texts).to_numpy()
    if (lengths % 4).any() or (lengths > 12).any() or (lengths == 0).any():
        return None
    padded = pc.utf8_rpad(texts, width=12, padding="=")
    offsets = np.frombuffer(padded.buffers()[1], np.int32)[padded.offset :][: count + 1]
    chars = np.frombuffer(padded.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    chars = chars.reshape(count, 12)
    padding = chars == ord("=")
    sextets = _BASE64[chars]
    sextets[padding] = 0
    pads = padding.sum(axis=1) - (12 - lengths)
    size = lengths // 4 * 3 - pads
    # "=" only as the text's last one or two characters (else Python's b64decode refuses it)
    inner = np.arange(12)[None, :] < (lengths - pads)[:, None]
    if (sextets == 255).any() or (padding & inner).any() or (pads > 2).any():
        return None
    if (size > 8).any() or (size < 1).any():
        return None
    quads = sextets.astype(np.uint64).reshape(count, 3, 4)
    triples = (
        (quads[:, :, 0] << 18) | (quads[:, :, 1] << 12) | (quads[:, :, 2] << 6) | quads[:, :, 3]
    )
    octets = np.stack([triples >> 16, (triples >> 8) & 255, triples & 255], axis=2)
    octets = octets.reshape(count, 9)
    at = np.arange(9, dtype=np.int64)
    kept = at[None, :] < size[:, None]
    shift = np.where(kept, 8 * (size[:, None] - 1 - at[None, :]), 0).astype(np.uint64)
    value = (np.where(kept, octets, 0) << shift).sum(axis=1, dtype=np.uint64).view(np.int64)
    negative = (octets[:, 0] >= 128) & (size < 8)  # 8 bytes: int64's own sign already
    return value - np.where(negative, np.left_shift(np.int64(1), 8 * np.minimum(size, 7)), 0)


def _as_micros(parsed: pa.Array, per_second: int) -> pa.Array:
    """Timestamps in `per_second` units as µs (floor division, as Python's //), refusing
    what overflows int64 (OverflowError) as pa.array would."""
    if per_second == 1_000_000:
        return parsed
    if per_second < 1_000_000:
        return pc.multiply_checked(parsed, 1_000_000 // per_second)
    values = parsed.fill_null(0).to_numpy()
    divided = np.floor_divide(values, per_second // 1_000_000)
    return pa.array(divided, pa.int64(), mask=parsed.is_null().to_numpy(zero_copy_only=False))


def _cdc_column(parsed: Parsed, upsert: pa.Array, count: int, name: str) -> pa.Array:
    """The mirror's own column of the `count` upserts (Envelope._cdc_values)."""
    if name == OP:
        return parsed["op"].filter(upsert)
    if name == DELETED:
        return pa.repeat(pa.scalar(False), count)
    ts_ms, lsn = parsed["source"].filter(upsert).flatten()  # null where no source
    return ts_ms if name == SOURCE_TS_MS else lsn
