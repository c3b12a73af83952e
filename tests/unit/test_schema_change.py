"""Which change of a column's type a mirror follows, and how each store does
(lagless/cdc/schema_change.py; the stores' own evolution: sinks/sql.py, sinks/delta/widen.py,
sinks/iceberg)."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from lagless.cdc.schema_change import (
    every_widening,
    iceberg_widening,
    merged,
    refused,
    takes,
    widens,
    widest,
)
from lagless.exceptions import SchemaChangeRefused
from lagless.sinks import Target, sink_from_url
from lagless.sinks.delta import widen
from lagless.sinks.sql import Layout, evolve

INT, LONG, SHORT = T.IntegerType(), T.LongType(), T.ShortType()
FLOAT, DOUBLE, TEXT = T.FloatType(), T.DoubleType(), T.StringType()


def dec(precision: int, scale: int) -> T.DecimalType:
    return T.DecimalType(precision, scale)


@pytest.mark.parametrize(
    ("held", "wanted", "wider"),
    [
        (INT, LONG, True),
        (SHORT, INT, True),
        (FLOAT, DOUBLE, True),
        (dec(10, 2), dec(12, 2), True),  # precision up
        (dec(10, 2), dec(12, 4), True),  # precision and scale up, integral digits kept
        (LONG, INT, False),  # narrowing
        (dec(10, 2), dec(10, 4), False),  # scale up at the cost of integral digits
        (INT, DOUBLE, False),  # another family: not exact for every value
        (INT, TEXT, False),
        (INT, INT, False),
    ],
)
def test_a_widening_holds_every_value_of_the_type_it_widens(held, wanted, wider):
    assert widens(held, wanted) is wider


@pytest.mark.parametrize(
    ("held", "event", "found"),
    [
        (INT, LONG, LONG),  # widened upstream: the column widens
        (LONG, INT, LONG),  # narrowed upstream, or an event older than a widening: kept
        (dec(10, 2), dec(8, 4), dec(12, 4)),  # two decimals: the digits of both
        (dec(38, 10), dec(38, 20), None),  # beyond Spark's 38 digits
        (INT, TEXT, None),
        (TEXT, TEXT, TEXT),
    ],
)
def test_a_column_takes_the_widest_type_its_events_had(held, event, found):
    assert widest(held, event) == found
    assert takes(held, event) is (found == held)


@pytest.mark.parametrize(
    ("held", "wanted", "sql_and_delta", "iceberg"),
    [
        (INT, LONG, True, True),
        (FLOAT, DOUBLE, True, True),
        (dec(10, 2), dec(12, 2), True, True),
        (dec(10, 2), dec(12, 4), True, False),  # a scale change is not an Iceberg promotion
    ],
)
def test_each_store_widens_in_place_what_it_can(held, wanted, sql_and_delta, iceberg):
    assert every_widening(held, wanted) is sql_and_delta
    assert iceberg_widening(held, wanted) is iceberg


def test_a_refusal_is_one_line_with_the_true_direction_and_a_remedy():
    told = refused("orders", "n", INT, TEXT)
    assert "column 'n' is int in the table, the change events now make it string" in told
    assert "execute-snapshot" in told and "--starting-timestamp" in told and "\n" not in told


def mirror_layout(**kinds: str) -> Layout:
    return Layout("t", tuple(kinds.items()), ("id",), newer_only=True, extra_columns_stay=True)


def test_postgresql_widens_a_mirrors_column_in_place_and_keeps_a_wider_one():
    found = [("id", "integer"), ("n", "integer"), ("p", "numeric(10,2)"), ("x", "bigint")]
    wanted = mirror_layout(id="integer", n="bigint", p="numeric(12,4)", x="integer")
    assert evolve(wanted, found, ("id",)) == [
        'ALTER TABLE "t" ALTER COLUMN "n" TYPE bigint',
        'ALTER TABLE "t" ALTER COLUMN "p" TYPE numeric(12,4)',
    ]


def test_sql_refuses_a_mirrors_type_change_it_cannot_follow_in_one_line():
    with pytest.raises(SchemaChangeRefused, match="column 'n' is int in the table, the change"):
        evolve(
            mirror_layout(id="INTEGER", n="TEXT"), [("id", "INTEGER"), ("n", "INTEGER")], ("id",)
        )


def test_a_column_added_with_a_default_gives_it_to_the_rows_held():
    layout = replace(mirror_layout(id="integer", d="integer"), defaults=(("d", "7"),))
    assert evolve(layout, [("id", "integer")], ("id",)) == [
        'ALTER TABLE "t" ADD COLUMN "d" integer',
        'UPDATE "t" SET "d" = 7',
    ]


def test_delta_rewrites_a_widened_mirror_keeping_its_ledger(tmp_path):
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    path = str(tmp_path / "t")
    rows = pa.table({"id": pa.array([1, 2], pa.int32()), "p": pa.array([1, 2], pa.int32())})
    held = CommitProperties(app_transactions=[Transaction("ledger", 5)])
    write_deltalake(path, rows, description="lagless", commit_properties=held)
    delta = DeltaTable(path)
    wanted = pa.schema([("id", pa.int32()), ("p", pa.int64())])
    wider = widen.widened(delta, wanted, "t")
    assert wider is not None and wider.field("p").type == pa.int64()
    widen.rewrite(delta, pa.schema([*wider, pa.field("d", pa.int32())]), {"d": 7})
    again = DeltaTable(path)
    assert again.transaction_version("ledger") == 5
    assert again.metadata().description == "lagless"
    got = again.to_pyarrow_table().sort_by("id")
    assert got.schema.field("p").type == pa.int64() and got.column("d").to_pylist() == [7, 7]
    assert widen.widened(again, pa.schema([("p", pa.int32())]), "t") is None  # narrower: kept
    with pytest.raises(SchemaChangeRefused, match="column 'p' is bigint in the table"):
        widen.widened(again, pa.schema([("p", pa.string())]), "t")


def test_a_mirror_takes_the_widest_of_its_table_and_its_newest_events():
    events = T.StructType([T.StructField("id", INT), T.StructField("n", INT)])
    grown = merged(events, {"id": INT, "n": LONG, "gone": TEXT}, "t")
    assert [f.dataType for f in grown] == [INT, LONG]  # held wider: kept
    assert merged(events, {"n": None}, "t") == events  # a store that cannot tell
    with pytest.raises(SchemaChangeRefused, match="column 'n' is string in the table"):
        merged(events, {"n": TEXT}, "t")


def mirror(*fields: T.StructField) -> Target:
    return Target("t", "upsert", "debezium", T.StructType(list(fields)), ("id",))


def test_iceberg_promotes_what_it_can_and_refuses_a_decimal_scale_change(tmp_path):
    sink = sink_from_url(f"iceberg:///{tmp_path}/lake")
    key = T.StructField("id", INT)
    sink.prepare(mirror(key, T.StructField("n", INT), T.StructField("p", dec(10, 2))))
    wider = mirror(key, T.StructField("n", LONG), T.StructField("p", dec(12, 2)))
    sink.check(wider)
    sink.prepare(wider)
    held = sink.table_types(wider)
    assert (held["n"], held["p"]) == (LONG, dec(12, 2))
    sink.check(mirror(key, T.StructField("n", INT)))  # narrower: the column stays long
    with pytest.raises(SchemaChangeRefused, match="Iceberg cannot widen a column that way"):
        sink.check(mirror(key, T.StructField("p", dec(14, 4))))
