"""A Delta table's rules on rows (log.row_rules), as delta-rs writes them: its CHECK
constraints by name and its top-level columns' invariants, each a SQL condition; a table
with a rule nested in a struct, which lagless does not evaluate, is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, Field, Schema
from deltalake.schema import PrimitiveType, StructType

from lagless.sinks.base import RowRule
from lagless.sinks.delta.log import row_rules, unwritable


def invariant(condition: str) -> dict[str, str]:
    return {"delta.invariants": json.dumps({"expression": {"expression": condition}})}


def test_constraints_and_invariants_are_the_tables_rules(tmp_path: Path) -> None:
    schema = Schema(
        [
            Field("offset", PrimitiveType("long")),
            Field("n", PrimitiveType("long"), True, invariant("n > 0")),
        ]
    )
    path = str(tmp_path / "t")
    DeltaTable.create(path, schema=schema, description="lagless --write append")
    table = DeltaTable(path)
    table.alter.add_constraint({"small": "offset < 10"})
    table = DeltaTable(path)
    assert row_rules(table) == (RowRule("small", "offset < 10"), RowRule("invariant of n", "n > 0"))
    assert unwritable(table, "append") is None  # kept, not refused


def test_a_table_without_rules_has_none(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    DeltaTable.create(path, schema=pa.schema([("offset", pa.int64())]))
    assert row_rules(DeltaTable(path)) == ()


def test_an_invariant_inside_a_struct_is_refused(tmp_path: Path) -> None:
    inner = StructType([Field("n", PrimitiveType("long"), True, invariant("inner.n > 0"))])
    path = str(tmp_path / "t")
    DeltaTable.create(path, schema=Schema([Field("inner", inner)]))
    assert "invariants inside inner" in (unwritable(DeltaTable(path), "append") or "")
