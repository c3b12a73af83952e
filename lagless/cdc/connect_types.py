"""Kafka Connect's schemas as Spark columns, and each JSON value as its column takes it.

A Debezium change event in Kafka Connect's JSON carries its schema (`{"schema", "payload"}`)
(in Avro, its schema is the registry's, read as Connect's: cdc/avro_schema.py): a struct of
typed fields, a logical type named by `name` (`org.apache.kafka.connect.data.*`,
`io.debezium.time.*`, `io.debezium.data.*`). Each becomes the natural Spark type, so each store
gets its own (sinks/sql.py: SQLite keeps decimals and times as text, PostgreSQL has them all):

| Connect | column | the JSON value |
| --- | --- | --- |
| int8/16/32/64, boolean, string | tinyint ... bigint, boolean, string | as is |
| float32/64 | float, double | a number, or "NaN", "Infinity", "-Infinity" |
| bytes | binary | base64 (Avro: bytes) |
| Decimal (`scale`, `connect.decimal.precision`) | decimal(p, s) | base64, unscaled (Avro: bytes) |
| VariableScaleDecimal (struct scale, value) | string | exact decimal text |
| Date | date | days since the epoch |
| Time, MicroTime, NanoTime | string HH:MM:SS.ffffff | ms, µs, ns of the day |
| Timestamp, MicroTimestamp, NanoTimestamp | timestamp_ntz | ms, µs, ns since the epoch |
| ZonedTimestamp | timestamp (an instant, UTC) | ISO 8601 text with its offset |
| Json, Uuid, Enum, Xml, ZonedTime | string | text |
| array, map, struct | array, map, struct of the above | |

Dates and timestamps hold 0001-01-01 to 9999-12-31, the range every store and Spark read:
PostgreSQL's `infinity` and `-infinity` (which Debezium sends as sentinels: `INFINITY`) are
stored as that range's last and first instant (9999-12-31 23:59:59.999999, 0001-01-01), and
any other value outside it (BC, year 10000) is refused (ValueError: the event is dead-lettered
with its reason, cdc/envelope.py), never stored changed.

`decimal.handling.mode=string` or `double` gives string or float64 fields (no logical name):
those columns are text or double. Without a schema (`schemas.enable=false`), `--value-schema`
names the columns' Spark types and `for_spark_type` reads each JSON value as Debezium's
defaults write it (dates as days, timestamps without zone as µs; decimals by what the value
is: `_decimal_schemaless`).

Runs on executors: imports nothing of lagless but its errors and cdc.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lagless.cdc.unavailable import UNAVAILABLE, UNAVAILABLE_BYTES, as_text
from lagless.exceptions import BadInput

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

__all__ = ["UNAVAILABLE", "UNAVAILABLE_BYTES"]

# Spark's largest decimal: a wider Connect decimal is kept as its exact text.
MAX_PRECISION = 38

Convert = Callable[[Any], Any]


@dataclass(frozen=True)
class ReadAs:
    """How a batch of a column's JSON values is read at once (cdc/columnar.py): parsed as JSON
    `json` ("int", "float", "bool" or "text"; a value of another JSON type fails the reading),
    then either cast to the column's Arrow type (timestamps scaled from `per_second` units to
    µs first) or, `each`, each value through the column's `convert` as an event at a time
    would."""

    json: str
    each: bool = False
    per_second: int = 0
    # Connect's Decimal (base64 of the unscaled integer), "base64"; or --value-schema's
    # decimal, text where it looks like a number (`_decimal_schemaless`), "guessed": decoded at
    # once where the unscaled values fit 64 bits.
    decimal: str = ""


@dataclass(frozen=True)
class Column:
    """A field of the row: its Spark type, what turns its JSON value into the value Arrow
    takes for that type (None stays None), and how a batch of them may be read at once, the
    likelier first (none: an event at a time only)."""

    name: str
    data_type: DataType
    convert: Convert
    read_as: tuple[ReadAs, ...] = ()
    # The Connect schema's default (its JSON value, as the events write one): the value of
    # the rows that predate the column (cdc/envelope.py).
    default: Any = None


def _same(value: Any) -> Any:
    return value


# Kafka Connect's JSON writes a float's NaN and infinities as text.
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _float(value: Any) -> Any:
    """float32/float64: a number, or NaN and ±Infinity as Connect's JSON writes them."""
    if isinstance(value, str):
        if value not in _FLOAT_WORDS:
            raise ValueError(f"{value[:40]!r} is not a number")
        return _FLOAT_WORDS[value]
    return value


def _from_base64(value: Any) -> Any:
    return base64.b64decode(value) if isinstance(value, str) else value


def _unscaled(value: Any) -> int:
    """The unscaled value of Connect's Decimal: base64 text in JSON, bytes in Avro. Anything
    else is refused, never read: `bytes(n)` of a number n would be n zero bytes (a decimal
    sent as 25276182474 once asked for 25 GB)."""
    if isinstance(value, str):
        raw = base64.b64decode(value)
    elif isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
    else:
        raise ValueError(f"{str(value)[:40]!r} is not a decimal's bytes")
    return int.from_bytes(raw, "big", signed=True)


def _decimal(scale: int) -> Convert:
    """Connect's Decimal: bytes of the unscaled value, base64 in JSON."""
    return lambda value: decimal.Decimal(_unscaled(value)).scaleb(-scale)


_BASE64_TEXT = re.compile(
    r"(?:[A-Za-z0-9+/]{4})+(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?|"
    r"[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}="
)


def _decimal_schemaless(precision: int, scale: int) -> Convert:
    """A DECIMAL(precision, scale) column of --value-schema: the events carry no schema to
    tell Debezium's decimal.handling.mode, so the JSON value tells. A struct is a
    VariableScaleDecimal (`{"scale", "value"}`, precise mode of a numeric without scale); a
    number is double mode's; text with a '.' or a '-', or that is not base64, string mode's;
    other text base64 of the unscaled value (precise mode, the default) at `scale`. Digits
    alone are base64 and text at once: base64 where the column has a scale (string mode then
    writes a '.'), refused where it has none. A value the column cannot hold exactly (more
    decimals, too many digits, NaN) is refused, never rounded."""
    precise = _decimal(scale)
    unit = decimal.Decimal(1).scaleb(-scale)

    def exact(value: decimal.Decimal) -> decimal.Decimal:
        if not value.is_finite():
            raise ValueError(f"{value} is no number a DECIMAL holds")
        fitted = value.quantize(unit, context=decimal.Context(prec=MAX_PRECISION + 2))
        if fitted != value or abs(fitted) >= decimal.Decimal(10) ** (precision - scale):
            raise ValueError(f"{value} does not fit DECIMAL({precision},{scale}) exactly")
        return fitted

    def convert(value: Any) -> Any:
        if isinstance(value, dict):
            unscaled = decimal.Decimal(_unscaled(value["value"]))
            return exact(unscaled.scaleb(-int(value["scale"])))
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError(f"a JSON {type(value).__name__} is no decimal")
        if not isinstance(value, str):
            return exact(decimal.Decimal(repr(value) if isinstance(value, float) else value))
        if "." in value or value.startswith("-") or not _BASE64_TEXT.fullmatch(value):
            return exact(decimal.Decimal(value))
        if value.isdigit() and scale == 0:
            raise ValueError(
                f"{value!r} is base64 (decimal.handling.mode=precise) and a number's text "
                "(string) at once; declare the column STRING, or its scale"
            )
        return exact(precise(value))

    return convert


def _decimal_text(scale: int) -> Convert:
    convert = _decimal(scale)
    return lambda value: str(convert(value))


def _variable_decimal(value: Any) -> Any:
    """io.debezium.data.VariableScaleDecimal: {"scale": s, "value": base64 unscaled}."""
    if isinstance(value, dict):
        return str(decimal.Decimal(_unscaled(value["value"])).scaleb(-int(value["scale"])))
    return str(value)


def _time_of_day(per_second: int) -> Convert:
    def convert(value: Any) -> Any:
        if isinstance(value, str):
            return value
        whole, part = divmod(int(value), per_second)
        micros = part * 1_000_000 // per_second
        hours, rest = divmod(whole, 3600)
        text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
        return f"{text}.{micros:06d}" if micros else text

    return convert


# The dates and instants every store holds (and Spark and Python read): 0001-01-01 to
# 9999-12-31 23:59:59.999999, as days and as µs since the epoch.
FIRST_DAY, LAST_DAY = -719_162, 2_932_896
FIRST_MICROS, LAST_MICROS = -62_135_596_800_000_000, 253_402_300_799_999_999
# PostgreSQL's infinity and -infinity as Debezium sends them (seen from Debezium 3.6): a
# timestamp's PgJDBC sentinels (ms: DATE_POSITIVE_INFINITY / 1000) in the column's unit, a
# date's their epoch day wrapped into 32 bits (its snapshot's and its streaming's differ), a
# zoned timestamp's text.
_INFINITE_DAYS = {
    -622_191_234: LAST_DAY,
    -625_821_272: FIRST_DAY,
    -2_147_472_692: LAST_DAY,
    -2_147_472_691: FIRST_DAY,
}
_INFINITE_TIMESTAMPS = {
    1000: {9_223_372_036_825_200: LAST_MICROS, -9_223_372_036_832_400: FIRST_MICROS},
    1_000_000: {9_223_372_036_825_200_000: LAST_MICROS, -9_223_372_036_832_400_000: FIRST_MICROS},
}
_INFINITE_TIMESTAMPS[1_000_000_000] = _INFINITE_TIMESTAMPS[1_000_000]
_INFINITE_TEXT = {"infinity": LAST_MICROS, "-infinity": FIRST_MICROS}
OUT_OF_RANGE = "outside 0001-01-01 .. 9999-12-31, the dates every store holds"


def in_range_micros(micros: int) -> int:
    if not FIRST_MICROS <= micros <= LAST_MICROS:
        raise ValueError(f"timestamp {micros} µs since the epoch is {OUT_OF_RANGE}")
    return micros


def in_range_days(days: int) -> int:
    if not FIRST_DAY <= days <= LAST_DAY:
        raise ValueError(f"date {days} days since the epoch is {OUT_OF_RANGE}")
    return days


def _micros(per_second: int) -> Convert:
    infinite = _INFINITE_TIMESTAMPS.get(per_second, {})

    def convert(value: Any) -> Any:
        value = int(value)
        if value in infinite:
            return infinite[value]
        if per_second >= 1_000_000:
            return in_range_micros(value // (per_second // 1_000_000))
        return in_range_micros(value * (1_000_000 // per_second))

    return convert


_MICROS = _micros(1_000_000)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _zoned_micros(value: Any) -> Any:
    """ZonedTimestamp: ISO 8601 text with an offset, as an instant (µs since the epoch)."""
    if isinstance(value, int):
        return _MICROS(value)
    if value in _INFINITE_TEXT:
        return _INFINITE_TEXT[value]
    try:
        instant = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"timestamp {value[:40]!r} is {OUT_OF_RANGE}, or not one") from None
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=datetime.UTC)
    delta = instant - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return in_range_micros(micros)


def _days(value: Any) -> Any:
    if isinstance(value, str):
        return (datetime.date.fromisoformat(value) - datetime.date(1970, 1, 1)).days
    value = int(value)
    return _INFINITE_DAYS[value] if value in _INFINITE_DAYS else in_range_days(value)


# Columnar reading (ReadAs): the JSON type each Spark type's values are parsed as.
_JSON_OF = {
    "ByteType": "int",
    "ShortType": "int",
    "IntegerType": "int",
    "LongType": "int",
    "FloatType": "float",
    "DoubleType": "float",
    "BooleanType": "bool",
    "StringType": "text",
}
_EACH_TEXT = (ReadAs("text", each=True),)
# Numbers, or a batch whose values are all text (NaN, Infinity) read each.
_FLOATS = (ReadAs("float"), *_EACH_TEXT)


def _timestamp(per_second: int) -> tuple[ReadAs, ...]:
    return (ReadAs("int", per_second=per_second),)


_PRIMITIVES = {
    "int8": "ByteType",
    "int16": "ShortType",
    "int32": "IntegerType",
    "int64": "LongType",
    "float32": "FloatType",
    "float64": "DoubleType",
    "float": "FloatType",
    "double": "DoubleType",
    "boolean": "BooleanType",
    "string": "StringType",
    "bytes": "BinaryType",
}
_TIMES = {
    "org.apache.kafka.connect.data.Time": 1000,
    "io.debezium.time.Time": 1000,
    "io.debezium.time.MicroTime": 1_000_000,
    "io.debezium.time.NanoTime": 1_000_000_000,
}
_TIMESTAMPS = {
    "org.apache.kafka.connect.data.Timestamp": 1000,
    "io.debezium.time.Timestamp": 1000,
    "io.debezium.time.MicroTimestamp": 1_000_000,
    "io.debezium.time.NanoTimestamp": 1_000_000_000,
}
_DATES = ("org.apache.kafka.connect.data.Date", "io.debezium.time.Date")
_TEXTS = (
    "io.debezium.data.Json",
    "io.debezium.data.Uuid",
    "io.debezium.data.Enum",
    "io.debezium.data.EnumSet",
    "io.debezium.data.Xml",
    "io.debezium.data.Ltree",
    "io.debezium.time.ZonedTime",
)


def column_type(schema: dict[str, Any]) -> tuple[DataType, Convert, tuple[ReadAs, ...]]:
    """A Connect schema (one field's, as JsonConverter writes it) as a Spark type, the
    conversion of its JSON values and how a batch of them is read at once. BadInput for a
    type lagless cannot store."""
    from pyspark.sql import types as T

    name = schema.get("name")
    kind = schema.get("type")
    if name == "org.apache.kafka.connect.data.Decimal":
        parameters = schema.get("parameters") or {}
        scale = int(parameters.get("scale", 0))
        precision = int(parameters.get("connect.decimal.precision", MAX_PRECISION))
        if precision > MAX_PRECISION or scale > precision:
            return T.StringType(), _decimal_text(scale), _EACH_TEXT
        read_as = (ReadAs("text", each=True, decimal="base64"),)
        return T.DecimalType(precision, scale), _decimal(scale), read_as
    if name == "io.debezium.data.VariableScaleDecimal":
        return T.StringType(), _variable_decimal, ()
    if name in _DATES:
        return T.DateType(), _days, (ReadAs("int"),)
    if name in _TIMES:
        return T.StringType(), _time_of_day(_TIMES[name]), (ReadAs("int", each=True),)
    if name in _TIMESTAMPS:
        per_second = _TIMESTAMPS[name]
        return T.TimestampNTZType(), _micros(per_second), _timestamp(per_second)
    if name == "io.debezium.time.ZonedTimestamp":
        return T.TimestampType(), _zoned_micros, _EACH_TEXT
    if name in _TEXTS:
        # Debezium's TOAST placeholder takes other forms in hstore and uuid[] (cdc/unavailable.py)
        return T.StringType(), as_text, (ReadAs("text"),)
    if kind == "array":
        item_type, item, _ = column_type(schema["items"])
        return T.ArrayType(item_type, True), _each(item), ()
    if kind == "map":
        key_type, key, _ = column_type(schema["keys"])
        value_type, value, _ = column_type(schema["values"])
        return T.MapType(key_type, value_type, True), _entries(key, value), ()
    if kind == "struct":
        columns = struct_columns(schema)
        fields = [T.StructField(c.name, c.data_type, True) for c in columns]
        return T.StructType(fields), _fields_of(columns), ()
    if kind in _PRIMITIVES:
        data_type = getattr(T, _PRIMITIVES[kind])()
        if kind == "bytes":
            return data_type, _from_base64, _EACH_TEXT
        if _JSON_OF[_PRIMITIVES[kind]] == "float":
            return data_type, _float, _FLOATS
        if kind == "string":
            return data_type, as_text, (ReadAs("text"),)
        return data_type, _same, (ReadAs(_JSON_OF[_PRIMITIVES[kind]]),)
    raise BadInput(f"Kafka Connect type {json.dumps(schema)[:200]} cannot be stored")


def _each(convert: Convert) -> Convert:
    return lambda values: [None if v is None else convert(v) for v in values]


def _entries(key: Convert, value: Convert) -> Convert:
    """A map: an object in JSON, or its pairs (JsonConverter's of keys that are not text;
    Avro's `{"key", "value"}` records: cdc/avro_schema.py)."""

    def pair(entry: Any) -> Any:
        return (entry["key"], entry["value"]) if isinstance(entry, dict) else entry

    def convert(values: Any) -> Any:
        pairs = values.items() if isinstance(values, dict) else map(pair, values)
        return [(key(k), None if v is None else value(v)) for k, v in pairs]

    return convert


def _fields_of(columns: list[Column]) -> Convert:
    def convert(values: dict[str, Any]) -> dict[str, Any]:
        return {
            c.name: None if (v := values.get(c.name)) is None else c.convert(v) for c in columns
        }

    return convert


def struct_columns(schema: dict[str, Any]) -> list[Column]:
    """A Connect struct's fields as columns, in its order."""
    found = []
    for field in schema.get("fields") or []:
        data_type, convert, read_as = column_type(field)
        found.append(Column(field["field"], data_type, convert, read_as, field.get("default")))
    return found


def for_spark_type(name: str, data_type: DataType) -> Column:
    """A column given by --value-schema (no schema in the events): its JSON values read as
    Debezium's defaults write them."""
    from pyspark.sql import types as T

    convert: Convert = _same
    read_as: tuple[ReadAs, ...] = ()
    if isinstance(data_type, T.DecimalType):
        convert = _decimal_schemaless(data_type.precision, data_type.scale)
        read_as = (ReadAs("text", each=True, decimal="guessed"),)
    elif isinstance(data_type, T.BinaryType):
        convert, read_as = _from_base64, _EACH_TEXT
    elif isinstance(data_type, T.DateType):
        convert, read_as = _days, (ReadAs("int"), *_EACH_TEXT)
    elif isinstance(data_type, T.TimestampType):
        # µs (a timestamp without zone, Debezium's default) or ISO text (timestamptz)
        convert, read_as = _zoned_micros, (*_timestamp(1_000_000), *_EACH_TEXT)
    elif isinstance(data_type, T.TimestampNTZType):
        convert, read_as = _MICROS, _timestamp(1_000_000)
    elif isinstance(data_type, T.FloatType | T.DoubleType):
        convert, read_as = _float, _FLOATS
    elif isinstance(data_type, T.StringType):
        convert, read_as = as_text, (ReadAs("text"),)
    elif isinstance(data_type, T.ArrayType):
        convert = _each(for_spark_type(name, data_type.elementType).convert)
    elif isinstance(data_type, T.StructType):
        convert = _fields_of([for_spark_type(f.name, f.dataType) for f in data_type.fields])
    elif type(data_type).__name__ in _JSON_OF:
        read_as = (ReadAs(_JSON_OF[type(data_type).__name__]),)
    return Column(name, data_type, convert, read_as)
