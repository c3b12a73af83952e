"""A Debezium mirror's Delta table brought to the types of its change events
(cdc/schema_change.py). delta-rs 1.6 has no type widening (it reads Delta's `typeWidening`
table feature, and has no ALTER that changes a column's type), so a widening rewrites the
table in the wider types, in one commit (`write_deltalake` overwrite: the table's
description, partitioning and application transactions, its ledger, kept). A column the table
holds wider than the rows bring takes them cast (`as_held`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lagless.cdc.schema_change import check_widening, every_widening, refuse, widest

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql.types import DataType


def _spark(arrow_type: pa.DataType) -> DataType:
    from pyspark.sql.pandas.types import from_arrow_type

    return from_arrow_type(arrow_type)


def held_schema(delta: DeltaTable) -> pa.Schema:
    return pa.schema(delta.schema().to_arrow())


def widened(delta: DeltaTable, schema: pa.Schema, table: str) -> pa.Schema | None:
    """The table's columns, those `schema` brings wider widened (None: none is); a column the
    table holds as wide or wider stays. SchemaChangeRefused for a column of another type."""
    from pyspark.sql.pandas.types import to_arrow_type

    held = held_schema(delta)
    wider = held
    for field in schema:
        index = held.get_field_index(field.name)
        if index < 0 or _same(held.field(index).type, field.type):
            continue
        held_type, wanted_type = _spark(held.field(index).type), _spark(field.type)
        found = widest(held_type, wanted_type)
        if found is None:
            refuse(table, field.name, held_type, wanted_type)
        elif found != held_type:
            check_widening(table, field.name, held_type, found, "Delta", every_widening)
            wider = wider.set(index, held.field(index).with_type(to_arrow_type(found)))
    return None if wider.equals(held) else wider


def _same(held: pa.DataType, wanted: pa.DataType) -> bool:
    """Alike as Delta stores them (a text column reads back as large_string or string_view)."""
    if pa.types.is_string(held) or pa.types.is_large_string(held) or held == pa.string_view():
        return bool(pa.types.is_string(wanted) or pa.types.is_large_string(wanted))
    if pa.types.is_timestamp(held) and pa.types.is_timestamp(wanted):
        return (held.tz is None) == (wanted.tz is None)
    return bool(held == wanted)


def rewrite(delta: DeltaTable, schema: pa.Schema, fills: dict[str, Any]) -> None:
    """The table's rows rewritten in `schema` (its columns widened, then those added: each
    holds its default from `fills`, else NULL), one commit."""
    from deltalake import write_deltalake

    held = held_schema(delta)

    def rewritten(batch: pa.RecordBatch) -> pa.RecordBatch:
        arrays = []
        for field in schema:
            if field.name in held.names:
                arrays.append(batch.column(field.name).cast(field.type))
            else:
                arrays.append(pa.array([fills.get(field.name)] * batch.num_rows, field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    batches = (rewritten(batch) for batch in delta.to_pyarrow_dataset().to_batches())
    write_deltalake(
        delta,
        pa.RecordBatchReader.from_batches(schema, batches),
        mode="overwrite",
        schema_mode="overwrite",
        partition_by=delta.metadata().partition_columns or None,
    )
    delta.update_incremental()


def as_held(rows: pa.Table, delta: DeltaTable) -> pa.Table:
    """The rows with each column the table holds wider cast to its type."""
    held = held_schema(delta)
    for index, field in enumerate(rows.schema):
        at = held.get_field_index(field.name)
        if at >= 0 and not _same(held.field(at).type, field.type):
            rows = rows.set_column(index, field.name, rows.column(index).cast(held.field(at).type))
    return rows
