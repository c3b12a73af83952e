"""The log time a batch's partitions carry from the batches before (rows.carried_log_time_sql),
evaluated by Spark as an import evaluates it: each row gets its own partition's, of its own
topic; a partition not carried gets NULL (greatest() then keeps the batch's running maximum)."""

from __future__ import annotations

from lagless.importer.rows import carried_log_time_sql


def test_each_row_gets_its_own_partitions_carried_log_time(spark) -> None:  # type: ignore[no-untyped-def]
    carried = {("orders", 0): 1_700_000_000_123, ("orders", 3): 5, ("it's", 0): 2**40}
    rows = spark.createDataFrame(
        [("orders", 0), ("orders", 3), ("orders", 1), ("it's", 0), ("it's", 3), ("other", 0)],
        "topic STRING, partition INT",
    )
    found = rows.selectExpr("topic", "partition", f"{carried_log_time_sql(carried)} AS ms")
    assert {(r.topic, r.partition): r.ms for r in found.collect()} == {
        ("orders", 0): 1_700_000_000_123,
        ("orders", 3): 5,
        ("orders", 1): None,
        ("it's", 0): 2**40,
        ("it's", 3): None,
        ("other", 0): None,
    }
