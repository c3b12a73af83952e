"""A table's rules on rows (Target.row_rules: a Delta table's CHECK constraints and
invariants), evaluated by rows.shape in a real Spark session: a row for which a rule is false
or NULL is rejected with that rule as its reason (the first it breaks); a row rejected for
another reason keeps that reason; a tombstone is no row and breaks nothing; a rule Spark
cannot evaluate is one line of bad input."""

from __future__ import annotations

from typing import Any

import pytest

from lagless.exceptions import BadInput
from lagless.importer import rows
from lagless.sinks.base import RowRule, Target

RULES = (RowRule("positive", "n > 0"), RowRule("small", "n < 100"))


def records(spark: Any, values: list[bytes | None]) -> Any:
    return spark.createDataFrame(
        [("t", 0, offset, f"k{offset}".encode(), value, 0) for offset, value in enumerate(values)],
        "topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY, ts BIGINT",
    ).selectExpr("*", "timestamp_millis(ts) AS timestamp")


def reasons(spark: Any, target: Target, values: list[bytes | None]) -> list[str | None]:
    shaped = rows.shape(records(spark, values), target)
    return [row[rows.ERROR] for row in shaped.orderBy("offset").collect()]


def test_each_row_is_held_to_the_tables_rules(spark) -> None:
    from pyspark.sql.types import _parse_datatype_string

    fields = _parse_datatype_string("n INT")
    values = [b'{"n": 5}', b'{"n": -1}', b'{"n": 500}', b'{"n": null}', b'{"n": "x"}', None]
    append = Target("t", "append", "json", fields, row_rules=RULES)
    positive, small = (rule.broken for rule in RULES)
    assert reasons(spark, append, values[:5]) == [
        None, positive, small, positive, rows.wrong_type("n", "int"),
    ]  # fmt: skip
    upsert = Target("t", "upsert", "json", fields, row_rules=RULES)
    assert reasons(spark, upsert, values)[-1] is None  # a tombstone: no row to hold to a rule
    assert rows.rejection_reasons(append)[-2:] == [positive, small]


def test_a_rule_spark_cannot_evaluate_is_bad_input(spark) -> None:
    target = Target("t", "append", "raw", row_rules=(RowRule("odd", "arrow_typeof(offset) = 'x'"),))
    with pytest.raises(BadInput, match=r"sets the rule odd \(arrow_typeof\(offset\) = 'x'\)"):
        rows.shape(records(spark, [b"v"]), target)
