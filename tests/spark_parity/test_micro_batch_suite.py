"""Spark's KafkaMicroBatchSourceSuite (streams, `spark.readStream`) on lagless-kafka.

Spark's tests step a query trigger by trigger on a manual clock; PySpark cannot, so those run
lagless's stream reader through Spark's micro-batch calls one trigger at a time (StreamDriver,
conftest.py), a restart being a new reader from the last offsets; the others run real Spark
queries (availableNow, Trigger.Once, foreachBatch, checkpoints).

Not ported, and why (README, "What the embedded broker cannot show" and "What lagless cannot
do as Spark does"): the steps and tests that delete, recreate or add partitions to a topic
while a query runs ("Query with Trigger.AvailableNow should throw error when topic partitions
got unavailable" and "... offset(s) in planned topic partitions got unavailable", "subscribing
topic by pattern with topic deletions", "SPARK-41375", "subscribe topic by pattern with topic
recreation between batches", "delete a topic when a Spark job is running", "SPARK-53560", the
"Add partitions" step of the from-offsets tests): the mock cluster cannot delete topics or
add partitions. Transactions ("read Kafka transactional messages", "SPARK-25495"): no
transaction markers. Spark internals with no lagless counterpart: "async progress tracking"
(Kafka sink), "(de)serialization of initial offsets" and the SPARK-19517 / 2.1.0 / future
version offset files and the 2.4.3 checkpoint (KafkaSource V1's own files), "V1/V2 Source is
used", "test custom metrics" (a Python stream reader reports no custom metrics), "ensure
stream-stream self-join ..." (Spark's exchange reuse).
"""

from __future__ import annotations

import json
import time

import pytest

from lagless.source import SOURCE_NAME
from tests.spark_parity.conftest import StreamDriver, Topics, stream_batches

pytestmark = pytest.mark.spark


def earliest(topics: Topics, topic: str, **more: str) -> dict[str, str]:
    return topics.options(topic, startingOffsets="earliest", **more)


def test_trigger_available_now(spark, topics, tmp_path):
    """KafkaMicroBatchSourceSuite: "Trigger.AvailableNow": 15 records, maxOffsetsPerTrigger 5,
    3 batches."""
    topic = topics.new(5)
    topics.send(topic, range(15), 0)
    batches = stream_batches(spark, earliest(topics, topic, maxOffsetsPerTrigger="5"), tmp_path)
    assert batches == [list(range(0, 5)), list(range(5, 10)), list(range(10, 15))]


def test_rate_limit_set_to_long_max_does_not_overflow(topics):
    """KafkaMicroBatchSourceSuite: "SPARK-26718 Rate limit set to Long.Max should not overflow
    integer during end offset calculation"."""
    topic = topics.new(1)
    topics.send(topic, range(5), 0)
    options = topics.options(
        topic,
        startingOffsets=json.dumps({topic: {"0": 5}}),
        maxOffsetsPerTrigger=str(2**63 - 1),
    )
    driver = StreamDriver(options)
    assert driver.trigger() == []
    topics.send(topic, range(30, 35), 0)
    assert driver.trigger() == list(range(30, 35))


def rate_limited_topic(topics: Topics, big: range, middle: range, small: list[int]) -> str:
    topic = topics.new(3)
    topics.send(topic, big, 0)
    topics.send(topic, middle, 1)
    topics.send(topic, small, 2)
    return topic


def test_max_offsets_per_trigger(spark, topics, tmp_path):
    """KafkaMicroBatchSourceSuite: "maxOffsetsPerTrigger": 1 from the smallest partition, 1
    from the middle, 8 from the biggest; then 1 and 9; the same after a restart; Trigger.Once
    ignores the limit."""
    topic = rate_limited_topic(topics, range(100, 201), range(10, 21), [1])
    options = earliest(topics, topic, maxOffsetsPerTrigger="10")

    driver = StreamDriver(options)
    assert driver.trigger() == [1, 10, *range(100, 108)]
    assert driver.trigger() == [11, *range(108, 117)]
    driver.stop()
    restarted = StreamDriver(options, driver.offsets)
    assert restarted.trigger() == [12, *range(117, 126)]
    assert restarted.trigger() == [13, *range(126, 135)]

    every = sorted([1, *range(10, 21), *range(100, 201)])
    once = {"once": True}
    assert stream_batches(spark, options, tmp_path, once) == [every]
    topics.send(topic, range(1000, 1011), 0)
    assert stream_batches(spark, options, tmp_path, once) == [list(range(1000, 1011))]


def test_min_offsets_per_trigger(topics):
    """KafkaMicroBatchSourceSuite: "minOffsetsPerTrigger": the first batch always runs; fewer
    records than the minimum wait until there are enough, or until maxTriggerDelay passed
    (3 s here, Spark's test: 5 s on a manual clock)."""
    topic = rate_limited_topic(topics, range(100, 110), range(10, 15), [1])
    driver = StreamDriver(earliest(topics, topic, minOffsetsPerTrigger="15", maxTriggerDelay="3s"))
    assert driver.trigger() == sorted([1, *range(10, 15), *range(100, 110)])

    topics.send(topic, range(15, 21), 1)
    assert driver.trigger() == []  # 6 < 15 and the delay has not passed
    topics.send(topic, range(110, 121), 0)
    topics.send(topic, [2], 2)
    assert driver.trigger() == sorted([*range(15, 21), *range(110, 121), 2])

    topics.send(topic, range(121, 126), 0)
    topics.send(topic, range(21, 26), 1)
    assert driver.trigger() == []
    time.sleep(3.1)
    assert driver.trigger() == sorted([*range(121, 126), *range(21, 26)])


def test_min_offsets_per_trigger_first_batch_runs_below_the_minimum(topics):
    """KafkaMicroBatchSourceSuite: "minOffsetsPerTrigger" ("First Batch is always processed"):
    a first trigger with fewer records than the minimum still runs its batch."""
    topic = topics.new(1)
    topics.send(topic, range(3), 0)
    driver = StreamDriver(earliest(topics, topic, minOffsetsPerTrigger="100", maxTriggerDelay="1h"))
    assert driver.trigger() == [0, 1, 2]
    topics.send(topic, range(3, 6), 0)
    assert driver.trigger() == []


def test_composite_read_limit(topics):
    """KafkaMicroBatchSourceSuite: "compositeReadLimit": minOffsetsPerTrigger 15 with
    maxOffsetsPerTrigger 20 and maxTriggerDelay (3 s here, 5 s on Spark's mocked clock)."""
    topic = rate_limited_topic(topics, range(100, 121), range(10, 21), [1])
    driver = StreamDriver(
        earliest(
            topics,
            topic,
            minOffsetsPerTrigger="15",
            maxOffsetsPerTrigger="20",
            maxTriggerDelay="3s",
        )
    )
    assert driver.trigger() == sorted([1, 10, *range(100, 112), 11, 12, 13, 14, 15])
    assert driver.trigger() == []  # 14 left < 15
    topics.send(topic, range(121, 129), 0)
    topics.send(topic, range(21, 31), 1)
    topics.send(topic, [2], 2)
    assert driver.trigger() == sorted([*range(112, 122), 2, *range(16, 25)])
    assert driver.trigger() == []  # 12 left
    time.sleep(3.1)
    assert driver.trigger() == sorted([*range(122, 129), *range(25, 31)])


def test_input_row_metrics(spark, topics, tmp_path):
    """KafkaMicroBatchSourceSuite: "input row metrics": the records read are the input rows
    Spark's progress reports."""
    topic = topics.new(5)
    topics.send(topic, ["-1"], 0)
    query = (
        spark.readStream.format(SOURCE_NAME)
        .options(**topics.options(topic))
        .load()
        .writeStream.format("memory")
        .queryName("input_row_metrics")
        .option("checkpointLocation", str(tmp_path))
        .start()
    )
    try:
        query.processAllAvailable()
        topics.send(topic, [1, 2], 0)
        topics.send(topic, [3], 3)
        query.processAllAvailable()
        rows = spark.table("input_row_metrics").selectExpr("CAST(value AS STRING) AS v")
        assert sorted(int(r.v) for r in rows.collect()) == [1, 2, 3]
        assert sum(p["numInputRows"] for p in query.recentProgress) == 3
    finally:
        query.stop()


def test_topic_level_offsets_tolerate_a_new_topic_matching_subscribe_pattern(topics):
    """KafkaMicroBatchSourceSuite: "topic-level offsets tolerate a new topic matching
    subscribePattern after the start": the new topic is read from its earliest offset."""
    prefix = f"pattern-{time.time_ns()}"
    first = f"{prefix}-a"
    topics.create(first, 1)
    topics.send(first, [1], 0)
    options = topics.options(
        subscribePattern=f"{prefix}-.*", startingOffsets=json.dumps({first: "earliest"})
    )
    driver = StreamDriver(options)
    assert driver.trigger() == [1]
    topics.create(f"{prefix}-b", 1)
    topics.send(f"{prefix}-b", [2], 0)
    assert driver.trigger() == [2]


def test_current_partition_offsets_set_when_no_new_data(topics):
    """KafkaMicroBatchSourceSuite: "SPARK-22956: currentPartitionOffsets should be set when no
    new data comes in": two sources, maxOffsetsPerTrigger 5 each, batch by batch, across a
    restart."""
    small, big = topics.new(1), topics.new(1)
    topics.send(small, range(10), 0)
    topics.send(big, range(100, 200), 0)
    limited = {"maxOffsetsPerTrigger": "5"}
    drivers = [StreamDriver(earliest(topics, t, **limited)) for t in (small, big)]

    def trigger() -> list[int]:
        return sorted(v for driver in drivers for v in driver.trigger())

    assert trigger() == [*range(5), *range(100, 105)]
    assert trigger() == [*range(5, 10), *range(105, 110)]
    assert trigger() == list(range(110, 115))
    drivers = [
        StreamDriver(earliest(topics, t, **limited), d.offsets)
        for t, d in zip((small, big), drivers, strict=True)
    ]
    assert trigger() == list(range(115, 120))
    assert trigger() == list(range(120, 125))


def test_allow_group_id_prefix(spark, topics, tmp_path):
    """KafkaMicroBatchSourceSuite: "allow group.id prefix": accepted; lagless's readers join
    no consumer group, so no group is created (Spark checks only with its deprecated
    consumer-based offset fetching)."""
    topic = topics.new(3)
    topics.send(topic, range(1, 11), 0)
    topics.send(topic, range(11, 21), 1)
    topics.send(topic, range(21, 31), 2)
    options = earliest(topics, topic, groupIdPrefix="id-prefix")
    batches = stream_batches(spark, options, tmp_path)
    assert sorted(v for batch in batches for v in batch) == list(range(1, 31))


def test_allow_group_id_override(spark, topics):
    """KafkaMicroBatchSourceSuite: "allow group.id override": refused with the reason, a
    documented difference (README's table): lagless commits a query's progress to a group
    only on request (lagless import --group), and its readers never join one."""
    topic = topics.new(1)
    reader = spark.readStream.format(SOURCE_NAME).options(
        **earliest(topics, topic, **{"kafka.group.id": "custom"})
    )
    with pytest.raises(Exception, match=r"kafka option group\.id cannot be set: tasks read"):
        reader.load()


def test_read_kafka_record_containing_null_key_values(spark, topics, tmp_path):
    """KafkaMicroBatchSourceSuite: "SPARK-27494: read kafka record containing null
    key/values" (without the transactional producer, which the embedded broker lacks)."""
    topic = topics.new(1)
    topics.send(topic, [None] * 5, 0)
    for i in range(1, 6):
        topics.send(topic, [None], 0, key=str(i).encode())
    topics.send(topic, range(6, 11), 0)
    rows: list = []
    query = (
        spark.readStream.format(SOURCE_NAME)
        .options(**earliest(topics, topic))
        .load()
        .selectExpr("CAST(key AS STRING) AS k", "CAST(value AS STRING) AS v")
        .writeStream.foreachBatch(lambda frame, _: rows.extend(frame.collect()))
        .option("checkpointLocation", str(tmp_path))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    got = sorted(((r.k, r.v) for r in rows), key=str)
    expected = [(None, None)] * 5 + [(str(i), None) for i in range(1, 6)]
    expected += [(None, str(i)) for i in range(6, 11)]
    assert got == sorted(expected, key=str)


def test_min_partitions_stream(spark, topics, tmp_path):
    """KafkaMicroBatchSourceSuite: "SPARK-30656: minPartitions"."""
    topic = topics.new(3)
    topics.send(topic, range(10), 0)
    topics.send(topic, range(10, 20), 1)
    topics.send(topic, [20], 2)
    seen: list[list[int]] = []

    def check(frame, _: int) -> None:  # type: ignore[no-untyped-def]
        parts = frame.selectExpr("CAST(value AS STRING) AS v").rdd.glom().collect()
        seen.append([len(parts), *sorted(int(r.v) for part in parts for r in part)])

    query = (
        spark.readStream.format(SOURCE_NAME)
        .options(**earliest(topics, topic, minPartitions="6"))
        .load()
        .writeStream.foreachBatch(check)
        .option("checkpointLocation", str(tmp_path))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert len(seen) == 1 and seen[0][0] >= 6 and seen[0][1:] == list(range(21))


def test_malformed_record_timestamp_throws_detailed_error(topics):
    """KafkaMicroBatchSourceSuite: "SPARK-56243: malformed record timestamp throws detailed
    error": a nanosecond timestamp overflows the conversion to microseconds; the error names
    the topic and the timestamp."""
    topic = topics.new(1)
    nanos = 1712345678123456789
    topics.send(topic, ["value"], 0, timestamp=nanos)
    driver = StreamDriver(earliest(topics, topic))
    with pytest.raises(Exception, match=rf"{topic}.*{nanos}"):
        driver.trigger()


@pytest.mark.parametrize(("min_partitions", "tasks"), [(None, 1), ("1", 1), ("4", 4)])
def test_min_partitions_is_supported(topics, min_partitions, tasks):
    """KafkaMicroBatchV2SourceSuite: "minPartitions is supported": the tasks planned for
    offsets 0..100 of one partition (which holds them here: lagless weighs records by size
    when it plans)."""
    topic = topics.new(1)
    topics.send(topic, range(100), 0)
    options = topics.options(topic)
    if min_partitions is not None:
        options["minPartitions"] = min_partitions
    reader = StreamDriver(options, {topic: {"0": 0}}).reader
    assert len(reader.partitions({topic: {"0": 0}}, {topic: {"0": 100}})) == tasks


@pytest.mark.parametrize("value", ["a", "1.0", "0", "-1"])
def test_min_partitions_is_supported_illegal_values(topics, value):
    """KafkaMicroBatchV2SourceSuite: "minPartitions is supported" (illegal values)."""
    with pytest.raises(Exception, match="minPartitions must be"):
        StreamDriver(topics.options("t", minPartitions=value), {})


def test_cannot_stop_kafka_stream(spark, topics, tmp_path):
    """KafkaSourceSuiteBase: "cannot stop Kafka stream": a running stream stops."""
    topic = topics.new(5)
    topics.send(topic, range(101, 106), 0)
    query = (
        spark.readStream.format(SOURCE_NAME)
        .options(**topics.options(subscribePattern=f"{topic}.*"))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path))
        .start()
    )
    query.processAllAvailable()
    query.stop()
    assert not query.isActive and query.exception() is None
