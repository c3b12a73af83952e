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
from pyspark.sql.functions import window

from lagless.source import SOURCE_NAME
from tests.spark_parity.conftest import StreamDriver, Topics, last_offsets, stream_batches

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


STRATEGIES = ["assign", "subscribe", "subscribePattern"]
# Spark runs each from-offsets test for every subscription and failOnDataLoss both ways; the
# default run keeps subscribe with failOnDataLoss=true, the matrix the other five.
SUBSCRIPTIONS = [
    pytest.param(
        strategy,
        fail,
        id=f"{strategy}-failOnDataLoss={str(fail).lower()}",
        marks=() if (strategy, fail) == ("subscribe", True) else pytest.mark.matrix,
    )
    for strategy in STRATEGIES
    for fail in (True, False)
]


def subscription(strategy: str, topic: str, partitions: int = 5) -> dict[str, str]:
    """Spark's three ways to name the topic: assign all partitions, subscribe, a pattern."""
    if strategy == "assign":
        return {"assign": json.dumps({topic: list(range(partitions))})}
    if strategy == "subscribe":
        return {"subscribe": topic}
    return {"subscribePattern": f"{topic.rsplit('-', 1)[0]}-.*"}


def strategy_topic(topics: Topics, strategy: str) -> str:
    # A pattern's topic gets a prefix of its own, as Spark's "$topicPrefix-suffix".
    if strategy == "subscribePattern":
        name = f"prefix{time.time_ns()}-suffix"
        topics.create(name, 5)
        return name
    return topics.new(5)


def spread(topics: Topics, topic: str, values: list[int]) -> None:
    """Spark's AddKafkaData: values over several partitions."""
    for value in values:
        topics.send(topic, [value], value % 5)


def from_options(topics: Topics, strategy: str, topic: str, fail: bool, **more: str):  # type: ignore[no-untyped-def]
    return {
        "kafka.bootstrap.servers": topics.bootstrap,
        "failOnDataLoss": str(fail).lower(),
        **subscription(strategy, topic),
        **more,
    }


@pytest.mark.parametrize(("strategy", "fail"), SUBSCRIPTIONS)
def test_from_latest_offsets(topics, strategy, fail):
    """KafkaSourceSuiteBase: "assign from latest offsets", "subscribing topic by name from
    latest offsets", "subscribing topic by pattern from latest offsets" (failOnDataLoss: both):
    records before the start are skipped; a restart resumes; data added while stopped is read."""
    topic = strategy_topic(topics, strategy)
    topics.send(topic, ["-1"], 0)
    options = from_options(topics, strategy, topic, fail, startingOffsets="latest")
    driver = StreamDriver(options)
    spread(topics, topic, [1, 2, 3])
    assert driver.trigger() == [1, 2, 3]
    restarted = StreamDriver(options, driver.offsets)
    assert restarted.trigger() == []
    spread(topics, topic, [4, 5, 6])
    again = StreamDriver(options, restarted.offsets)
    assert again.trigger() == [4, 5, 6]
    spread(topics, topic, [7, 8])
    assert again.trigger() == [7, 8]


@pytest.mark.parametrize(("strategy", "fail"), SUBSCRIPTIONS)
def test_from_earliest_offsets(topics, strategy, fail):
    """KafkaSourceSuiteBase: "... from earliest offsets" (assign, subscribe, pattern;
    failOnDataLoss: both)."""
    topic = strategy_topic(topics, strategy)
    spread(topics, topic, [1, 2, 3])
    options = from_options(topics, strategy, topic, fail, startingOffsets="earliest")
    driver = StreamDriver(options)
    spread(topics, topic, [4, 5, 6])
    assert driver.trigger() == [1, 2, 3, 4, 5, 6]
    restarted = StreamDriver(options, driver.offsets)
    spread(topics, topic, [7, 8])
    assert restarted.trigger() == [7, 8]


def specific_offsets_topic(topics: Topics, topic: str) -> None:
    topics.send(topic, [-20, -21, -22], 0)  # starts at earliest: all seen
    topics.send(topic, [-10, -11, -12], 1)  # starts at latest: all skipped
    topics.send(topic, [0, 1, 2], 2)  # starts at 0: all seen
    topics.send(topic, [10, 11, 12], 3)  # starts at 1: the first skipped
    topics.send(topic, [20, 21, 22], 4)  # starts at 2: two skipped


@pytest.mark.parametrize(("strategy", "fail"), SUBSCRIPTIONS)
def test_from_specific_offsets(topics, strategy, fail):
    """KafkaSourceSuiteBase: "... from specific offsets" (-2, -1, 0, 1, 2)."""
    topic = strategy_topic(topics, strategy)
    specific_offsets_topic(topics, topic)
    starting = {topic: {"0": -2, "1": -1, "2": 0, "3": 1, "4": 2}}
    options = from_options(topics, strategy, topic, fail, startingOffsets=json.dumps(starting))
    driver = StreamDriver(options)
    assert driver.trigger() == sorted([-20, -21, -22, 0, 1, 2, 11, 12, 22])
    assert {p: o for (_, p), o in driver.positions().items()} == dict.fromkeys(range(5), 3)
    restarted = StreamDriver(options, driver.offsets)
    assert restarted.trigger() == []
    spread(topics, topic, [30, 31, 32, 33, 34])
    assert restarted.trigger() == [30, 31, 32, 33, 34]


def timed_messages(topics: Topics, topic: str) -> tuple[int, int]:
    """Spark's setupTestMessagesForTestOnTimestampOffsets: nothing after the second timestamp
    in partition 4."""
    first = int(time.time() * 1000) - 5000
    second = first + 1000
    for partition, values in enumerate(([-20], [-10], [0, 1], [10, 11], [20, 21, 22])):
        topics.send(topic, values, partition, timestamp=first)
    for partition, values in enumerate(([-21, -22], [-11, -12], [2], [12])):
        topics.send(topic, values, partition, timestamp=second)
    return first, second


@pytest.mark.parametrize(("strategy", "fail"), SUBSCRIPTIONS)
def test_from_specific_timestamps(topics, strategy, fail):
    """KafkaSourceSuiteBase: "... from specific timestamps": partitions 0-3 from the second
    timestamp, partition 4 from the first."""
    topic = strategy_topic(topics, strategy)
    first, second = timed_messages(topics, topic)
    by_time = {topic: {**{str(p): second for p in range(4)}, "4": first}}
    options = from_options(
        topics, strategy, topic, fail, startingOffsetsByTimestamp=json.dumps(by_time)
    )
    driver = StreamDriver(options)
    assert driver.trigger() == sorted([-21, -22, -11, -12, 2, 12, 20, 21, 22])
    restarted = StreamDriver(options, driver.offsets)
    assert restarted.trigger() == []
    spread(topics, topic, [30, 31, 32])
    again = StreamDriver(options, restarted.offsets)
    assert again.trigger() == [30, 31, 32]
    spread(topics, topic, [40, 41, 42, 43, 44])
    assert again.trigger() == [40, 41, 42, 43, 44]


@pytest.mark.parametrize(("strategy", "fail"), SUBSCRIPTIONS)
def test_from_global_timestamp(topics, strategy, fail):
    """KafkaSourceSuiteBase: "... from global timestamp per topic"."""
    topic = strategy_topic(topics, strategy)
    _, second = timed_messages(topics, topic)
    topics.send(topic, [23, 24], 4, timestamp=second)
    options = from_options(topics, strategy, topic, fail, startingTimestamp=str(second))
    driver = StreamDriver(options)
    assert driver.trigger() == sorted([-21, -22, -11, -12, 2, 12, 23, 24])
    restarted = StreamDriver(options, driver.offsets)
    assert restarted.trigger() == []
    spread(topics, topic, [30, 31, 32])
    again = StreamDriver(options, restarted.offsets)
    assert again.trigger() == [30, 31, 32]


def test_subscribing_topics_from_topic_level_offsets(topics):
    """KafkaSourceSuiteBase: "subscribing topics from topic-level offsets"."""
    first, second = topics.new(3), topics.new(2)
    topics.send(first, [1, 2, 3], 0)
    topics.send(second, ["11"], 0)
    options = topics.options(
        f"{first},{second}",
        startingOffsets=json.dumps({first: "earliest", second: "latest"}),
    )
    driver = StreamDriver(options)
    topics.send(second, ["12"], 0)
    topics.send(first, [4], 1)
    assert driver.trigger() == [1, 2, 3, 4, 12]
    assert StreamDriver(options, driver.offsets).trigger() == []


@pytest.mark.parametrize(
    ("strategy", "timestamps"),
    [
        ("subscribe", "specific"),
        pytest.param("subscribe", "global", marks=pytest.mark.matrix),
        pytest.param("subscribePattern", "specific", marks=pytest.mark.matrix),
        pytest.param("subscribePattern", "global", marks=pytest.mark.matrix),
    ],
)
def test_from_timestamps_with_non_matching_starting_offset(topics, strategy, timestamps):
    """KafkaSourceSuiteBase: "subscribing topic by name / by pattern from specific timestamps /
    global timestamp per topic with non-matching starting offset": partition 4 has no record
    at the second timestamp. startingOffsetsByTimestampStrategy=error fails (Spark's default);
    latest starts that partition at its end (lagless's default, README's table)."""
    for strategy_option in ("error", "latest", None):
        topic = strategy_topic(topics, strategy)
        _, second = timed_messages(topics, topic)
        every = {topic: {str(p): second for p in range(5)}}
        given = (
            {"startingOffsetsByTimestamp": json.dumps(every)}
            if timestamps == "specific"
            else {"startingTimestamp": str(second)}
        )
        if strategy_option is not None:
            given["startingOffsetsByTimestampStrategy"] = strategy_option
        options = from_options(topics, strategy, topic, True, **given)
        if strategy_option == "error":
            with pytest.raises(Exception, match="has no record at or after timestamp"):
                StreamDriver(options)
            continue
        driver = StreamDriver(options)
        assert driver.trigger() == sorted([-21, -22, -11, -12, 2, 12])
        topics.send(topic, [23, 24, 25], 4, timestamp=second)
        assert driver.trigger() == [23, 24, 25]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            {"subscribe": "t", "endingOffsets": "latest"},
            "endingOffsets is not supported in streaming",
        ),
        (
            {"subscribe": "t", "endingOffsetsByTimestamp": '{"t": {"0": 1000}}'},
            "endingOffsetsByTimestamp is not supported in streaming",
        ),
        ({}, "exactly one of the options subscribe, subscribePattern and assign"),
        ({"subscribe": "t", "subscribePattern": "t.*"}, "exactly one of the options"),
        ({"subscribe": "t", "assign": '{"a": [0]}'}, "exactly one of the options"),
        ({"assign": ""}, "no topic partitions to assign"),
        ({"subscribePattern": ""}, "pattern to subscribe is empty"),
        ({"subscribe": ""}, "no topics to subscribe"),
        (
            {"subscribe": "t", "minOffsetsPerTrigger": "20", "maxOffsetsPerTrigger": "15"},
            "minOffsetsPerTrigger \\(20\\) is higher than maxOffsetsPerTrigger \\(15\\)",
        ),
    ],
)
def test_bad_source_options(spark, topics, options, says):
    """KafkaSourceSuiteBase: "bad source options". Spark refuses them at load(); lagless at
    load() too, except the batch-only ending options, which a Python source can only tell
    apart when the stream starts (before anything is read)."""
    reader = spark.readStream.format(SOURCE_NAME).options(**topics.options(**options))
    with pytest.raises(Exception, match=says):
        reader.load().writeStream.format("noop").start().awaitTermination(60)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("kafka.auto.offset.reset", "someValue"),
        ("kafka.enable.auto.commit", "someValue"),
        ("kafka.interceptor.classes", "someValue"),
        ("kafka.key.deserializer", "someValue"),
        ("kafka.value.deserializer", "someValue"),
        ("kafka.auto.offset.reset", "none"),
        ("kafka.auto.offset.reset", "earliest"),
        ("kafka.auto.offset.reset", "latest"),
    ],
)
def test_unsupported_kafka_configs(spark, topics, key, value):
    """KafkaSourceSuiteBase: "unsupported kafka configs": refused at load(), with the reason."""
    reader = spark.readStream.format(SOURCE_NAME).options(**topics.options("topic", **{key: value}))
    with pytest.raises(Exception, match=f"kafka option {key.removeprefix('kafka.')} cannot be set"):
        reader.load()


def test_get_offsets_from_case_insensitive_parameters():
    """KafkaSourceSuiteBase: "get offsets from case insensitive parameters"."""
    from lagless.source.options import SourceOptions

    def parse(**given: str) -> SourceOptions:
        return SourceOptions.parse({"kafka.bootstrap.servers": "b:9092", "subscribe": "t", **given})

    assert parse(startingOffsets="earLiEst").starting == "earliest"
    assert (
        SourceOptions.parse(
            {"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "endingOffsets": "laTest"},
            batch=True,
        ).ending
        == "latest"
    )
    assert parse(startingOffsets='{"topic-A":{"0":23}}').starting == {"topic-A": {"0": 23}}
    mixed = parse(startingOffsets='{"topic-A":"eArLiEst","topic-B":{"0":23}}').starting
    assert mixed == {"topic-A": -2, "topic-B": {"0": 23}}
    assert parse().starting == "latest"


def test_kafka_column_types(spark, topics, tmp_path):
    """KafkaSourceSuiteBase: "Kafka column types": Spark's schema and values, headers
    included: a null key, timestampType 0 (CreateTime)."""
    now = int(time.time() * 1000)
    topic = topics.new(1)
    topics.send(topic, ["1"], 0, headers=[("a", b"b"), ("c", b"d")])
    rows: list = []
    frame = (
        spark.readStream.format(SOURCE_NAME)
        .options(**earliest(topics, topic, includeHeaders="true"))
        .load()
    )
    assert frame.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    query = (
        frame.writeStream.foreachBatch(lambda batch, _: rows.extend(batch.collect()))
        .option("checkpointLocation", str(tmp_path))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    [row] = rows
    assert row.key is None and bytes(row.value) == b"1"
    assert (row.topic, row.partition, row.offset, row.timestampType) == (topic, 0, 0, 0)
    assert row.timestamp.timestamp() * 1000 >= now
    assert [(h.key, bytes(h.value)) for h in row.headers] == [("a", b"b"), ("c", b"d")]


@pytest.mark.matrix
def test_kafka_source_with_watermark(spark, topics, tmp_path):
    """KafkaSourceSuiteBase: "KafkaSource with watermark": a windowed count over the
    timestamp column."""
    now = int(time.time() * 1000)
    topic = topics.new(1)
    topics.send(topic, ["1"], 0)
    counted = (
        spark.readStream.format(SOURCE_NAME)
        .options(**earliest(topics, topic))
        .load()
        .withWatermark("timestamp", "10 seconds")
        .groupBy(window("timestamp", "5 seconds"))
        .count()
        .selectExpr("window.start AS start", "count")
    )
    query = (
        counted.writeStream.format("memory")
        .outputMode("complete")
        .queryName("kafka_watermark")
        .option("checkpointLocation", str(tmp_path))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    [row] = spark.table("kafka_watermark").collect()
    assert row.start.timestamp() * 1000 >= now - 5000 and row["count"] == 1


def test_restart_from_a_checkpoint_keeps_sparks_offset_layout(spark, topics, tmp_path):
    """KafkaSourceSuiteBase: "subscribing topic by name from specific offsets" on real Spark,
    stopped and restarted from its checkpoint ("Should get the data back on recovery"), whose
    offset log holds Spark's KafkaSourceOffset JSON: {"topic": {"partition": offset}}."""
    topic = topics.new(5)
    specific_offsets_topic(topics, topic)
    starting = {topic: {"0": -2, "1": -1, "2": 0, "3": 1, "4": 2}}
    options = topics.options(topic, startingOffsets=json.dumps(starting))
    first = stream_batches(spark, options, tmp_path)
    assert sorted(v for batch in first for v in batch) == sorted(
        [-20, -21, -22, 0, 1, 2, 11, 12, 22]
    )
    assert last_offsets(tmp_path) == {topic: {str(p): 3 for p in range(5)}}
    spread(topics, topic, [30, 31, 32, 33, 34])
    assert stream_batches(spark, options, tmp_path) == [[30, 31, 32, 33, 34]]
