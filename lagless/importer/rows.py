"""What a batch of Kafka records becomes before a sink sees it: typed columns and, for a
record the target cannot take, the reason it is rejected."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lagless.sinks.base import Target

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

INVALID_UTF8 = "value is not valid UTF-8"
INVALID_JSON = "value is not valid JSON"
NULL_KEY = "null key in upsert mode"


def rejection(target: Target) -> Column:
    """NULL for a record the target accepts, else why not; evaluated in the JVM, not in Python."""
    from pyspark.sql import functions as F

    checks: list[tuple[Column, str]] = []
    if target.mode == "upsert":
        checks.append((F.col("key").isNull(), NULL_KEY))
    if target.value_format == "json":
        value = F.col("value")
        checks.append((value.isNotNull() & ~F.is_valid_utf8(value), INVALID_UTF8))
        checks.append(
            (value.isNotNull() & F.try_parse_json(value.cast("string")).isNull(), INVALID_JSON)
        )
    reason = F.lit(None).cast("string")
    for condition, text in reversed(checks):
        reason = F.when(condition, F.lit(text)).otherwise(reason)
    return reason


def shape(records: DataFrame, target: Target) -> DataFrame:
    """Sink columns plus `bytes` (key + value size, for progress) and `rejected`."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string") if target.value_format == "json" else F.col("value")
    return records.select(
        "topic",
        "partition",
        "offset",
        "key",
        value.alias("value"),
        F.unix_millis("timestamp").alias("timestamp"),
        (
            F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length(F.col("value")), F.lit(0))
        ).alias("bytes"),
        rejection(target).alias("rejected"),
    )
