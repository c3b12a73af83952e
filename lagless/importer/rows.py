"""What a batch of Kafka records becomes before a sink sees it: typed columns, the reason a
record is rejected, and, in upsert mode, one row per key. All of it runs in the JVM."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lagless.sinks.base import COLUMNS, DEAD_LETTER_COLUMNS, Target

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

INVALID_UTF8 = "value is not valid UTF-8"
INVALID_JSON = "value is not valid JSON"
NULL_KEY = "null key in upsert mode"
VALIDATE = "validate"


def too_large(limit: int) -> str:
    return f"value is larger than --max-record-bytes {limit}"


def _checks(target: Target, max_record_bytes: int | None) -> list[tuple[Column, str]]:
    from pyspark.sql import functions as F

    value = F.col("value")
    checks: list[tuple[Column, str]] = []
    if target.mode == "upsert":
        checks.append((F.col("key").isNull(), NULL_KEY))
    if max_record_bytes is not None:
        checks.append((F.length(value) > max_record_bytes, too_large(max_record_bytes)))
    if target.value_format == "json":
        checks.append((value.isNotNull() & ~F.is_valid_utf8(value), INVALID_UTF8))
        checks.append(
            (value.isNotNull() & F.try_parse_json(value.cast("string")).isNull(), INVALID_JSON)
        )
    return checks


def rejection_reasons(target: Target, max_record_bytes: int | None = None) -> list[str]:
    """Every error text `rejection` can give for this target."""
    return [text for _, text in _checks(target, max_record_bytes)]


def rejection(target: Target, max_record_bytes: int | None = None) -> Column:
    """NULL for a record the target accepts, else the first reason it does not."""
    from pyspark.sql import functions as F

    reason = F.lit(None).cast("string")
    for condition, text in reversed(_checks(target, max_record_bytes)):
        reason = F.when(condition, F.lit(text)).otherwise(reason)
    return reason


def shape(records: DataFrame, target: Target, max_record_bytes: int | None = None) -> DataFrame:
    """Sink columns, plus `raw` (the value as read), `bytes` (key + value) and `error`."""
    from pyspark.sql import functions as F

    value = F.col("value").cast("string") if target.value_format == "json" else F.col("value")
    size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
    return records.select(
        "topic",
        "partition",
        "offset",
        "key",
        value.alias("value"),
        F.unix_millis("timestamp").alias("timestamp"),
        F.col("value").alias("raw"),
        size.alias("bytes"),
        rejection(target, max_record_bytes).alias("error"),
    )


def accepted(shaped: DataFrame, target: Target) -> DataFrame:
    """Rows for the target; in upsert mode only the newest record of each key (coalescing).

    Newest follows the sinks' rule: the highest offset within a partition, then across
    partitions the latest timestamp, then the highest partition.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = shaped.where(F.col("error").isNull()).select(*COLUMNS)
    if target.mode != "upsert":
        return rows
    in_partition = Window.partitionBy("key", "partition").orderBy(F.col("offset").desc())
    across = Window.partitionBy("key").orderBy(F.col("timestamp").desc(), F.col("partition").desc())
    return (
        rows.withColumn("_n", F.row_number().over(in_partition))
        .where("_n = 1")
        .withColumn("_n", F.row_number().over(across))
        .where("_n = 1")
        .drop("_n")
    )


def dead_letters(shaped: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    rejected = shaped.where(F.col("error").isNotNull())
    return rejected.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        F.col("raw").alias("value"),
        F.lit(VALIDATE).alias("stage"),
        "error",
    ).select(*DEAD_LETTER_COLUMNS)
