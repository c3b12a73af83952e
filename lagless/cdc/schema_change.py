"""What a Debezium mirror does when a change event's Connect schema differs from its table's
columns: every decision of that kind, here (docs/mirror.md, "Schema changes").

A column's type in the mirror is the widest its change events ever had (`widest`): an event
of a narrower type (older than a widening upstream, or newer than a narrowing) is stored in
the wider column, every value exact; an event of a wider type widens the column in place,
where the store can (`Widening`: SQLite's types are loose, PostgreSQL alters the column,
Delta rewrites the table in the wider type, Iceberg promotes int to long, float to double and
a decimal's precision). A type that is neither (int to text) or a widening the store cannot
make (a decimal's scale in Iceberg) is refused (SchemaChangeRefused): `--schema-changes`
decides whether that stops the table or the import.

Runs on executors too (the source's tasks decode with the widest types): imports nothing of
lagless but its errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Literal

from lagless.exceptions import SchemaChangeRefused

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructType

# --schema-changes: what a change the table cannot follow does. evolve: the table stops (its
# part of each batch is left unwritten), the others go on; fail: the import stops (exit 2).
SchemaChanges = Literal["evolve", "fail"]
SCHEMA_CHANGES: tuple[SchemaChanges, ...] = ("evolve", "fail")

# Which widenings a store makes in place: (held, wanted) -> whether it can.
Widening = Callable[["DataType", "DataType"], bool]

# Integral types, narrowest first: each holds every value of those before it.
_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")
_FLOATING = ("FloatType", "DoubleType")
MAX_PRECISION = 38

REMEDY = (
    "to mirror the table as it is now, re-snapshot it (Debezium's execute-snapshot signal) and "
    "import it into a new --table with a new --checkpoint and --starting-timestamp at the "
    "signal (docs/mirror.md, Schema changes)"
)


def _rank(data_type: DataType, chain: tuple[str, ...]) -> int:
    name = type(data_type).__name__
    return chain.index(name) if name in chain else -1


def widens(held: DataType, wanted: DataType) -> bool:
    """`wanted` holds every value of `held` exactly, and is not the same type: a wider integer,
    double for float, a decimal with at least as many digits on each side of the point."""
    from pyspark.sql.types import DecimalType

    if held == wanted:
        return False
    for chain in (_INTEGRAL, _FLOATING):
        low, high = _rank(held, chain), _rank(wanted, chain)
        if low >= 0 and high >= 0:
            return low < high
    if isinstance(held, DecimalType) and isinstance(wanted, DecimalType):
        integral = wanted.precision - wanted.scale >= held.precision - held.scale
        return integral and wanted.scale >= held.scale
    return False


def widest(held: DataType, event: DataType) -> DataType | None:
    """The type a column takes when it holds `held` and an event brings `event`: the wider of
    the two (two decimals: the digits of both on each side of the point); None when neither
    holds the other's values."""
    from pyspark.sql.types import DecimalType

    if held.simpleString() == event.simpleString() or widens(event, held):
        return held  # (a nested type's nullability aside, as stores differ in it)
    if widens(held, event):
        return event
    if isinstance(held, DecimalType) and isinstance(event, DecimalType):
        scale = max(held.scale, event.scale)
        integral = max(held.precision - held.scale, event.precision - event.scale)
        if integral + scale <= MAX_PRECISION:
            return DecimalType(integral + scale, scale)
    return None


def takes(held: DataType, event: DataType) -> bool:
    """A column of type `held` stores an event's value of type `event` as it is."""
    return widest(held, event) == held


def merged(fields: StructType, held: Mapping[str, DataType | None], table: str) -> StructType:
    """A mirror's columns from its newest change events (`fields`) against the table's
    (`held`, each with its Spark type where the store tells it): each column the widest of
    the two, so that events of either type are read into it. SchemaChangeRefused for a column
    whose types neither hold the other's, with the table's first."""
    from pyspark.sql.types import StructField, StructType

    columns = []
    for field in fields:
        kind = held.get(field.name)
        wider = field.dataType if kind is None else widest(kind, field.dataType)
        if wider is not None and wider.simpleString() == field.dataType.simpleString():
            wider = field.dataType
        if wider is None:
            refuse(table, field.name, kind or "", field.dataType)
        columns.append(StructField(field.name, wider or field.dataType, True, field.metadata))
    return StructType(columns)


def refused(
    table: str, column: str, held: DataType | str, event: DataType | str, why: str = ""
) -> str:
    """The one line a refused change prints: the true direction, and the remedy."""
    because = why or "neither type holds every value of the other"
    return (
        f"schema change lagless cannot apply to table {table!r}: column {column!r} is "
        f"{_named(held)} in the table, the change events now make it {_named(event)} "
        f"({because}); {REMEDY}"
    )


def _named(data_type: DataType | str) -> str:
    return data_type if isinstance(data_type, str) else data_type.simpleString()


def refuse(
    table: str, column: str, held: DataType | str, event: DataType | str, why: str = ""
) -> None:
    raise SchemaChangeRefused(refused(table, column, held, event, why), table)


def check_widening(
    table: str, column: str, held: DataType, wanted: DataType, store: str, can: Widening
) -> None:
    """SchemaChangeRefused unless the store widens `held` to `wanted` in place."""
    if not can(held, wanted):
        refuse(table, column, held, wanted, f"{store} cannot widen a column that way")


def every_widening(held: DataType, wanted: DataType) -> bool:
    """SQLite, PostgreSQL and Delta widen a column to any wider type."""
    return widens(held, wanted)


def iceberg_widening(held: DataType, wanted: DataType) -> bool:
    """Iceberg's type promotions: int to long (a byte or short is an int there), float to
    double, a decimal's precision up with its scale kept."""
    from pyspark.sql.types import DecimalType

    if isinstance(held, DecimalType) and isinstance(wanted, DecimalType):
        return held.scale == wanted.scale and wanted.precision >= held.precision
    return widens(held, wanted)
