"""arrow_batches: a batch's rows reach a driver-side store as Spark's tasks finish."""

from __future__ import annotations

import pytest

from lagless.sinks.arrow_stream import arrow_batches

pytestmark = pytest.mark.spark


def test_every_row_arrives_exactly_once_from_many_tasks(spark):
    frame = spark.range(0, 50_000, numPartitions=7).selectExpr("id", "cast(id AS string) AS text")

    with arrow_batches(frame) as batches:
        table = batches.read_all()

    assert table.schema.names == ["id", "text"]
    assert sorted(table.column("id").to_pylist()) == list(range(50_000))
    assert table.column("text").to_pylist()[:3] == [str(i) for i in table["id"].to_pylist()[:3]]


def test_no_rows_is_an_empty_reader_with_the_columns(spark):
    frame = spark.range(0, 10, numPartitions=2).where("id < 0")

    with arrow_batches(frame) as batches:
        table = batches.read_all()

    assert table.num_rows == 0
    assert table.schema.names == ["id"]


def test_a_failing_task_is_an_error_not_a_short_read(spark):
    frame = spark.range(0, 1000, numPartitions=4).selectExpr(
        "id", "assert_true(id < 900, 'lagless test failure') AS checked"
    )

    with (
        pytest.raises(Exception, match="lagless test failure"),  # Spark's exception types vary
        arrow_batches(frame) as batches,
    ):
        batches.read_all()
