"""Every source option of Spark's "Structured Streaming + Kafka Integration Guide"
(docs/streaming/structured-streaming-kafka-integration.md): accepted with Spark's meaning, or
refused with the reason where lagless has a documented rule of its own (README's table
"lagless vs Spark's Kafka source"). Then lagless's own source options that differ on purpose.
"""

from __future__ import annotations

import json

import pytest

from lagless.exceptions import BadInput
from lagless.source import SOURCE_NAME
from lagless.source.options import SourceOptions
from tests.spark_parity.conftest import StreamDriver, read_values

pytestmark = pytest.mark.spark

BOOTSTRAP = {"kafka.bootstrap.servers": "127.0.0.1:9"}


def parse(batch: bool, **given: str) -> SourceOptions:
    subscription = {} if {"assign", "subscribePattern"} & set(given) else {"subscribe": "t"}
    return SourceOptions.parse({**BOOTSTRAP, **subscription, **given}, batch=batch)


# (option, value, batch query?, what lagless makes of it: Spark's meaning)
DOCUMENTED = [
    (
        "assign",
        '{"topicA":[0,1],"topicB":[2,4]}',
        False,
        lambda o: o.assign == {"topicA": (0, 1), "topicB": (2, 4)},
    ),
    ("subscribe", "topic1,topic2", False, lambda o: o.topics == ("topic1", "topic2")),
    ("subscribePattern", "topic.*", False, lambda o: o.pattern == "topic.*"),
    (
        "kafka.bootstrap.servers",
        "host1:9092,host2:9092",
        False,
        lambda o: o.kafka.bootstrap == "host1:9092,host2:9092",
    ),
    ("startingTimestamp", "1000", False, lambda o: o.starting_timestamps == 1000),
    (
        "startingOffsetsByTimestamp",
        '{"t":{"0":1000}}',
        False,
        lambda o: o.starting_timestamps == {"t": {"0": 1000}},
    ),
    ("startingOffsets", '{"t":{"0":23}}', False, lambda o: o.starting == {"t": {"0": 23}}),
    ("endingTimestamp", "1000", True, lambda o: o.ending_timestamps == 1000),
    (
        "endingOffsetsByTimestamp",
        '{"t":{"0":1000}}',
        True,
        lambda o: o.ending_timestamps == {"t": {"0": 1000}},
    ),
    ("endingOffsets", '{"t":{"0":50}}', True, lambda o: o.ending == {"t": {"0": 50}}),
    ("failOnDataLoss", "false", False, lambda o: o.fail_on_data_loss is False),
    ("kafkaConsumer.pollTimeoutMs", "5000", False, lambda o: o.poll_timeout_s == 5.0),
    ("fetchOffset.numRetries", "3", False, lambda o: True),
    ("fetchOffset.retryIntervalMs", "10", False, lambda o: True),
    ("maxOffsetsPerTrigger", "100", False, lambda o: o.max_offsets_per_trigger == 100),
    ("minOffsetsPerTrigger", "10", False, lambda o: o.min_offsets_per_trigger == 10),
    ("maxTriggerDelay", "15m", False, lambda o: o.max_trigger_delay_s == 900),
    ("minPartitions", "6", False, lambda o: o.min_partitions == 6),
    ("maxRecordsPerPartition", "1000", False, lambda o: o.max_records_per_partition == 1000),
    ("groupIdPrefix", "spark-kafka-source", False, lambda o: True),
    ("includeHeaders", "true", False, lambda o: o.include_headers is True),
    (
        "startingOffsetsByTimestampStrategy",
        "error",
        False,
        lambda o: o.starting_timestamp_strategy == "error",
    ),
]


@pytest.mark.parametrize(
    ("name", "value", "batch", "meaning"), DOCUMENTED, ids=[d[0] for d in DOCUMENTED]
)
def test_documented_option_is_accepted_with_sparks_meaning(name, value, batch, meaning):
    """Structured Streaming + Kafka Integration Guide: the source's options."""
    assert meaning(parse(batch, **{name: value}))


def test_kafka_group_id_is_refused_with_the_reason():
    """The guide's kafka.group.id: refused (README's table): lagless's readers join no group
    and commit a query's progress to a group only on request (lagless import --group)."""
    with pytest.raises(
        BadInput, match=r"kafka option group\.id cannot be set: tasks read assigned"
    ):
        parse(False, **{"kafka.group.id": "authorized"})


def test_a_batch_query_with_the_guides_example_options(spark, topics):
    """The guide's batch example: explicit starting and ending offsets over two topics, -2
    and -1 in the JSON."""
    topic1, topic2 = topics.new(2), topics.new(1)
    topics.send(topic1, range(0, 30), 0)
    topics.send(topic1, range(100, 110), 1)
    topics.send(topic2, range(200, 205), 0)
    options = topics.options(
        f"{topic1},{topic2}",
        startingOffsets=json.dumps({topic1: {"0": 23, "1": -2}, topic2: {"0": -2}}),
        endingOffsets=json.dumps({topic1: {"0": 25, "1": -1}, topic2: {"0": -1}}),
    )
    assert read_values(spark, options) == [23, 24, *range(100, 110), *range(200, 205)]


def test_held_offsets_is_a_floor_no_batch_reads_below(spark, topics):
    """lagless's heldOffsets (README's table; lagless import passes the store's ledger): no
    query reads below it, whatever startingOffsets or a checkpoint says."""
    topic = topics.new(2)
    topics.send(topic, range(10), 0)
    topics.send(topic, range(10, 20), 1)
    held = json.dumps({topic: {"0": 7}})
    assert read_values(spark, topics.options(topic, heldOffsets=held)) == [7, 8, 9, *range(10, 20)]
    driver = StreamDriver(topics.options(topic, startingOffsets="earliest", heldOffsets=held))
    assert driver.trigger() == [7, 8, 9, *range(10, 20)]


def test_max_bytes_per_batch_a_byte_limit_spark_lacks(topics):
    """lagless's maxBytesPerBatch (README's table): a micro-batch holds at most about that
    many bytes of records, shared over the partitions; Spark limits only offsets."""
    topic = topics.new(1)
    topics.send(topic, [f"{i:09d}" for i in range(100)], 0)  # ~9-byte values
    driver = StreamDriver(topics.options(topic, startingOffsets="earliest", maxBytesPerBatch="300"))
    first = driver.trigger()
    assert 0 < len(first) < 100 and first == list(range(len(first)))


def test_default_timestamp_strategy_is_latest(topics):
    """lagless's default startingOffsetsByTimestampStrategy is latest (README's table): a
    start by timestamp after a partition's last record starts there at its end, where Spark's
    default (error) fails the query."""
    topic = topics.new(1)
    topics.send(topic, range(3), 0, timestamp=1_000)
    driver = StreamDriver(topics.options(topic, startingTimestamp="5000"))
    assert driver.positions() == {(topic, 0): 3}
    topics.send(topic, [3], 0, timestamp=6_000)
    assert driver.trigger() == [3]


def test_schema_without_and_with_headers(spark, topics):
    """The guide's schema: headers is there only with includeHeaders=true."""
    topic = topics.new(1)
    reader = spark.read.format(SOURCE_NAME)
    without = reader.options(**topics.options(topic)).load().columns
    assert without == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    with_headers = reader.options(**topics.options(topic, includeHeaders="true")).load().columns
    assert with_headers == [*without, "headers"]
