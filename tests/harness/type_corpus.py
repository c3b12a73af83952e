"""The type corpus of a mirror (tests/integration/test_mirror_types.py): every PostgreSQL type
family Debezium's PostgreSQL connector sends, the values tried, and the rule each mirror keeps
them by, as data. docs/mirror.md's "Types per store" table is made from it
(`python -m tests.harness.type_corpus`; tests/unit/test_docs.py checks the two agree).

A case's rule is "exact" (the mirror holds the source's value), or says how the mirror holds
it; `source` is the SQL that gives the source's value as the mirror must hold it. A refusal
is a value whose event is dead-lettered with its reason (its row is not in the mirror).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
from dataclasses import dataclass
from typing import Any

from tests.harness.mirror_workload import stored_rows

STORES = ("SQLite", "PostgreSQL", "Delta", "Iceberg")
BIG = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)"


def _clamped(column: str, cast: str) -> str:
    return (
        f"CASE WHEN {column} = 'infinity' THEN '9999-12-31 23:59:59.999999'::{cast} "
        f"WHEN {column} = '-infinity' THEN '0001-01-01'::{cast} ELSE {column} END"
    )


@dataclass(frozen=True)
class Case:
    column: str
    sql_type: str
    values: tuple[str, ...]  # SQL, one per row from the first (NULL after)
    kind: str  # how a value is compared (`canonical`)
    rule: str = "exact"
    source: str = ""  # SQL of the source's value as the mirror holds it (default: the column)
    sqlite: str = ""  # SQLite's rule, where it differs

    @property
    def family(self) -> str:
        return self.sql_type


INFINITE = "`infinity` is 9999-12-31 23:59:59.999999, `-infinity` 0001-01-01"
INFINITE_DAY = "`infinity` is 9999-12-31, `-infinity` 0001-01-01"
CASES = (
    Case("i2", "smallint", ("-32768", "32767"), "int"),
    Case("i4", "integer", ("-2147483648", "7"), "int"),
    Case("i8", "bigint", ("9223372036854775807", "-1"), "int"),
    Case("dom", "posint (a domain over integer)", ("5",), "int"),
    Case("dec", "numeric(12,2)", ("-29293.56", "0", "9999999999.99"), "decimal"),
    Case(
        "num",
        "numeric",
        ("1.005", "'NaN'", "'Infinity'", "-123456789012345678901234567890.5"),
        "decimal",
        "exact text; NaN and ±Infinity are NULL (Debezium sends NULL)",
        "CASE WHEN num IN ('NaN', 'Infinity', '-Infinity') THEN NULL ELSE num END",
    ),
    Case("m", "money", ("12.34", "-1"), "decimal", "exact, as numeric(38,2)", "m::numeric"),
    Case(
        "r",
        "real",
        ("'NaN'", "'Infinity'", "'-Infinity'", "1.5"),
        "float",
        sqlite="NaN is NULL (SQLite has no NaN); ±Infinity exact",
    ),
    Case(
        "d",
        "double precision",
        ("'-Infinity'", "'NaN'", "'Infinity'", "0.1"),
        "float",
        sqlite="NaN is NULL (SQLite has no NaN); ±Infinity exact",
    ),
    Case("b", "boolean", ("true", "false"), "bool"),
    Case("ch", "char(3)", ("'ab'",), "text", "exact, padded", "ch::text || ' '"),
    Case("vc", "varchar(10)", ("'é'",), "text"),
    Case("tx", "text", (f"'{'x' * 10}'", BIG), "text"),
    Case("by", "bytea", ("'\\x00ff'", f"decode({BIG}, 'hex')"), "bytes"),
    Case("u", "uuid", ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",), "text", source="u::text"),
    Case("js", "json", ("'{\"a\": 1}'", f"json_build_array({BIG})"), "json", source="js::text"),
    Case("jb", "jsonb", ("'{\"b\": [2]}'", f"jsonb_build_array({BIG})"), "json", source="jb::text"),
    Case("x", "xml", ("'<a>x</a>'", f"xmlelement(name a, {BIG})"), "text", source="x::text"),
    Case("e", "enum", ("'ok'",), "text", source="e::text"),
    Case(
        "ints",
        "integer[]",
        ("'{1,NULL,3}'", "(SELECT array_agg(g * 7919) FROM generate_series(1, 3000) g)"),
        "list",
    ),
    Case("texts", "text[]", ("'{a,NULL}'", f"ARRAY[{BIG}, {BIG}]"), "list"),
    Case(
        "grid",
        "integer[][]",
        ("'{{1,2},{3,4}}'",),
        "list",
        "each row of a 2-D array is NULL (Debezium sends NULL)",
        "(SELECT array_agg(NULL::int) FROM generate_subscripts(grid, 1))",
    ),
    Case(
        "hs",
        "hstore",
        ("'a=>1,b=>NULL'", f"hstore({BIG}, 'v')"),
        "json",
        "JSON text (Debezium's `hstore.handling.mode=json`)",
        "hstore_to_json(hs)::text",
    ),
    Case(
        "dt",
        "date",
        ("'2020-02-29'", "'infinity'", "'-infinity'", "'0001-01-01'"),
        "date",
        INFINITE_DAY,
        _clamped("dt", "date"),
    ),
    Case(
        "tm",
        "time",
        ("'01:02:03.5'", "'24:00'", "'00:00'"),
        "time",
        "text HH:MM:SS[.ffffff]",
        "tm::text",
    ),
    Case(
        "tmz",
        "timetz",
        ("'10:00+02'",),
        "time",
        "text of the UTC time, Z",
        "(tmz AT TIME ZONE 'UTC')::time::text || 'Z'",
    ),
    Case(
        "ts0",
        "timestamp(0)",
        ("'2020-01-01 01:02:03'", "'infinity'", "'-infinity'"),
        "timestamp",
        INFINITE,
        _clamped("ts0", "timestamp"),
    ),
    Case(
        "ts3",
        "timestamp(3)",
        ("'2020-01-01 01:02:03.456'", "'9999-12-31 23:59:59.999'"),
        "timestamp",
    ),
    Case(
        "ts",
        "timestamp",
        ("'2020-01-01 01:02:03.456789'", "'-infinity'", "'infinity'", "'0001-01-01'"),
        "timestamp",
        INFINITE,
        _clamped("ts", "timestamp"),
    ),
    Case(
        "tsz",
        "timestamptz",
        ("'2020-01-01 01:02:03.456789+02'", "'infinity'", "'-infinity'", "'0044-03-15 12:00+01'"),
        "instant",
        f"the instant; {INFINITE}",
        _clamped("tsz", "timestamptz"),
    ),
    Case(
        "iv",
        "interval",
        ("'1 year 2 mons 3 days 04:05:06.7'", "'-1 day'"),
        "int",
        "µs, a month 30.4375 days (Debezium's MicroDuration)",
        "round(((date_part('year', iv) * 12 + date_part('month', iv)) * 30.4375 * 86400 "
        "+ date_part('day', iv) * 86400 + date_part('hour', iv) * 3600 "
        "+ date_part('minute', iv) * 60 + date_part('second', iv)) * 1e6)::bigint",
    ),
    Case("ip", "inet", ("'10.0.0.1/24'",), "text", source="ip::text"),
    Case("cidr", "cidr", ("'10.0.0.0/8'",), "text", source="cidr::text"),
    Case("mac", "macaddr", ("'08:00:2b:01:02:03'",), "text", source="mac::text"),
    Case(
        "bt",
        "bit(4)",
        ("B'1010'",),
        "bits",
        "bytes of the bits, little-endian (Debezium's Bits)",
        "bt::text",
    ),
    Case(
        "vb",
        "varbit",
        ("B'101'",),
        "bits",
        "bytes of the bits, little-endian (Debezium's Bits)",
        "vb::text",
    ),
    Case("rg", "int4range", ("'[1,5)'",), "text", source="rg::text"),
)
# Values whose event is dead-lettered: (column, SQL value, what the dead letter says).
REFUSED = (
    ("dt", "'4713-01-01 BC'", "outside 0001-01-01 .. 9999-12-31"),
    ("dt", "'10000-01-01'", "outside 0001-01-01 .. 9999-12-31"),
    ("ts", "'0001-12-31 23:00 BC'", "outside 0001-01-01 .. 9999-12-31"),
    ("tsz", "'10000-01-01 00:00+00'", "outside 0001-01-01 .. 9999-12-31"),
)
REFUSED_FIRST_ID = 100
# The TOASTed columns (tx, by, js, jb, x, ints, texts, hs: their second value is large): rows
# TOASTED_IDS are updated on `n` only, then the second one's key changes to KEY_CHANGED.
TOASTED_IDS = (2,)
KEY_CHANGED = (2, 50)

DDL = """
CREATE EXTENSION IF NOT EXISTS hstore;
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
"""


def create_table(name: str) -> str:
    columns = ", ".join(
        f"{c.column} {'mood' if c.sql_type == 'enum' else c.sql_type.split(' (')[0]}" for c in CASES
    )
    return f"CREATE TABLE {name} (id integer PRIMARY KEY, n integer, {columns})"


def inserts(name: str) -> list[str]:
    """The rows of the snapshot: row i holds each case's i-th value."""
    count = max(len(c.values) for c in CASES)
    statements = []
    for at in range(count):
        values = [c.values[at] if at < len(c.values) else "NULL" for c in CASES]
        statements.append(f"INSERT INTO {name} VALUES ({at + 1}, 0, {', '.join(values)})")
    return statements


def refused_inserts(name: str) -> list[str]:
    """A row per refused value, inserted once Debezium streams (its snapshot sends a BC date
    as the same date AD: docs/mirror.md)."""
    return [
        f"INSERT INTO {name} (id, n, {column}) VALUES ({REFUSED_FIRST_ID + at}, 0, {value})"
        for at, (column, value, _) in enumerate(REFUSED)
    ]


def selected() -> str:
    """SELECT list of the source's values as the mirror holds them."""
    return ", ".join(f"{c.source or c.column} AS {c.column}" for c in CASES)


def canonical(kind: str, value: Any) -> Any:
    """One form for a value, whichever store or driver gave it."""
    if value is None:
        return None
    if kind == "int":
        return int(value)
    if kind == "float":
        return "nan" if math.isnan(float(value)) else repr(float(value))
    if kind == "decimal":
        return str(decimal.Decimal(str(value)).normalize())
    if kind == "bool":
        return bool(value)
    if kind == "bytes":
        return bytes(value).hex()
    if kind == "bits":
        if isinstance(value, str):
            number = int(value, 2)
            return number.to_bytes((number.bit_length() + 7) // 8, "little").hex()
        return bytes(value).hex()
    if kind in ("json", "list"):
        return json.dumps(json.loads(value) if isinstance(value, str) else value, sort_keys=True)
    if kind == "date":
        return str(value)[:10]
    if kind in ("timestamp", "instant"):
        if isinstance(value, str):
            value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    if kind == "time":
        text = str(value)
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value)


COLUMNS = ["id", "n", *(c.column for c in CASES)]


def stored(sink: str, table: str, columns: list[str] = COLUMNS) -> list[dict[str, Any]]:
    """A mirror's table of the corpus as a user reads it, each row by column name."""
    return [dict(zip(columns, row, strict=True)) for row in stored_rows(sink, table, columns)]


def dead_letters(sink: str, table: str) -> list[str]:
    """Why each of the table's dead letters was refused."""
    return [row[0] for row in stored_rows(sink, f"{table}_dlq", ["error"])]


def as_held(store: str, row: dict[str, Any]) -> dict[str, Any]:
    """A row of the corpus (the source's or a mirror's), each value canonical as `store`
    holds it."""
    shown = {name: canonical("int", row[name]) for name in ("id", "n")}
    for case in CASES:
        shown[case.column] = expected(case, store, canonical(case.kind, row[case.column]))
    return shown


def expected(case: Case, store: str, value: Any) -> Any:
    """The source's value (canonical) as `store` holds it."""
    if store == "SQLite" and case.kind == "float" and value == "nan":
        return None
    return value


def rules_table() -> str:
    """docs/mirror.md's table: each type's rule in each store (only SQLite's ever differs)."""
    lines = [
        "| PostgreSQL type | PostgreSQL, Delta, Iceberg | SQLite |",
        "| --- | --- | --- |",
    ]
    for case in CASES:
        lines.append(f"| {case.sql_type} | {case.rule} | {case.sqlite or 'the same'} |")
    types = {c.column: c.sql_type for c in CASES}
    for column in dict.fromkeys(column for column, _, _ in REFUSED):
        reason = next(r for c, _, r in REFUSED if c == column)
        refused = f"refused: dead-lettered ({reason})"
        lines.append(f"| {types[column]} out of range (BC, 10000) | {refused} | the same |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(rules_table())
