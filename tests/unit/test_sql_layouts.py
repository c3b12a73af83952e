"""Table layouts of the SQL stores: JSON values without a schema are jsonb in PostgreSQL."""

from __future__ import annotations

import pytest

from lagless.exceptions import BadInput
from lagless.sinks.base import Target
from lagless.sinks.sql import create_table, evolve, insert, target_layout


def value_type(target: Target, dialect: str) -> str:
    return dict(target_layout(target, dialect).columns)["value"]  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_json_values_are_jsonb_in_postgresql_and_text_in_sqlite(mode: str) -> None:
    target = Target("deals", mode, "json")  # type: ignore[arg-type]
    assert value_type(target, "postgresql") == "jsonb"
    assert value_type(target, "sqlite") == "TEXT"
    assert target_layout(target, "postgresql").casts_on_insert
    assert 'CAST(s."value" AS jsonb)' in insert(target_layout(target, "postgresql"), "stage")


def test_raw_values_stay_bytes_and_are_copied_as_they_are() -> None:
    layout = target_layout(Target("deals", "append", "raw"), "postgresql")
    assert dict(layout.columns)["value"] == "bytea" and not layout.casts_on_insert


def test_a_json_table_of_text_values_names_the_conversion() -> None:
    """A table an earlier lagless made keeps working only once converted: one line says how."""
    layout = target_layout(Target("deals", "append", "json"), "postgresql")
    earlier = [(name, "text" if kind == "jsonb" else kind) for name, kind in layout.columns]

    with pytest.raises(BadInput) as raised:
        evolve(layout, earlier, layout.unique)

    message = str(raised.value)
    assert "\n" not in message
    assert 'ALTER TABLE "deals" ALTER COLUMN "value" TYPE jsonb USING "value"::jsonb' in message
    assert evolve(layout, list(layout.columns), layout.unique) == []
    assert evolve(layout, [], layout.unique) == [create_table(layout)]
