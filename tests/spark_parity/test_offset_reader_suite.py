"""Spark's KafkaOffsetReaderSuite on lagless-kafka: the offset ranges a query plans.

Spark's getOffsetRangesFromUnresolvedOffsets / getOffsetRangesFromResolvedOffsets are the
ranges of a batch query's or a micro-batch's tasks: here lagless's KafkaBatchReader and
KafkaStreamReader plan them, as Spark calls them. Each test runs twice in Spark (with and
without useDeprecatedOffsetFetching), an internal switch lagless has no counterpart of.
"""

from __future__ import annotations

import itertools
import json

import pytest

from lagless.exceptions import BadInput
from lagless.source.datasource import KafkaBatchReader, KafkaStreamReader
from lagless.source.options import SourceOptions
from tests.spark_parity.conftest import Topics


def planned(reader) -> list[tuple[str, int, int, int]]:  # type: ignore[no-untyped-def]
    return sorted(
        (piece.topic, piece.partition, piece.start, piece.end)
        for task in reader
        for piece in task.pieces
    )


def batch(topics: Topics, topic: str, **more: str) -> KafkaBatchReader:
    return KafkaBatchReader(SourceOptions.parse(topics.options(topic, **more), batch=True))


@pytest.mark.parametrize(
    ("given", "read_committed"),
    [
        ({}, True),
        ({"kafka.isolation.level": "read_uncommitted"}, False),
        ({"kafka.isolation.level": "read_committed"}, True),
    ],
)
def test_isolation_level(topics, given, read_committed):
    """KafkaOffsetReaderSuite: "isolationLevel must give back default isolation level when not
    set", "... READ_UNCOMMITTED when set", "... READ_COMMITTED when set". lagless's default is
    librdkafka's read_committed, Spark's the Java client's read_uncommitted (README's table)."""
    options = SourceOptions.parse(topics.options("t", **given))
    assert options.kafka.read_committed is read_committed


def test_isolation_level_invalid(topics):
    """KafkaOffsetReaderSuite: "isolationLevel must throw exception when invalid isolation
    level set"."""
    with pytest.raises(BadInput, match=r"isolation\.level"):
        SourceOptions.parse(
            topics.options("t", **{"kafka.isolation.level": "intentionally_invalid"})
        )


def test_unresolved_offsets_using_specific_offsets(topics):
    """KafkaOffsetReaderSuite: "SPARK-30656: getOffsetRangesFromUnresolvedOffsets - using
    specific offsets": 1..4 with minPartitions 3 is three ranges of one offset."""
    topic = topics.new(1)
    topics.send(topic, range(10), 0)
    reader = batch(
        topics,
        topic,
        minPartitions="3",
        startingOffsets=json.dumps({topic: {"0": 1}}),
        endingOffsets=json.dumps({topic: {"0": 4}}),
    )
    assert planned(reader.partitions()) == [(topic, 0, 1, 2), (topic, 0, 2, 3), (topic, 0, 3, 4)]


def test_unresolved_offsets_using_special_offsets(topics):
    """KafkaOffsetReaderSuite: "SPARK-30656: getOffsetRangesFromUnresolvedOffsets - using
    special offsets": earliest..latest of 4 records with minPartitions 3 is 3 ranges."""
    topic = topics.new(1)
    topics.send(topic, range(4), 0)
    ranges = planned(batch(topics, topic, minPartitions="3").partitions())
    assert len(ranges) == 3 and ranges[0][2] == 0 and ranges[-1][3] == 4
    assert all(a[3] == b[2] for a, b in itertools.pairwise(ranges))


def test_start_offset_does_not_match_assigned(topics):
    """KafkaOffsetReaderSuite: "SPARK-48383: START_OFFSET_DOES_NOT_MATCH_ASSIGNED error
    class": JSON offsets naming two of three partitions."""
    topic = topics.new(3)
    reader = batch(
        topics,
        topic,
        minPartitions="4",
        startingOffsets=json.dumps({topic: {"0": -2, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": -1, "1": 3}}),
    )
    with pytest.raises(BadInput, match=rf"must name every partition .* misses {topic}\[2\]"):
        reader.partitions()


def test_unresolved_offsets_multiple_topic_partitions(topics):
    """KafkaOffsetReaderSuite: "SPARK-30656: getOffsetRangesFromUnresolvedOffsets - multiple
    topic partitions": 100 and 4 records, the second ending at 3, minPartitions 4: Spark's
    ranges, offset for offset."""
    topic = topics.new(2)
    topics.send(topic, range(100), 0)
    topics.send(topic, range(4), 1)
    reader = batch(
        topics,
        topic,
        minPartitions="4",
        startingOffsets=json.dumps({topic: {"0": -2, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": -1, "1": 3}}),
    )
    ranges = planned(reader.partitions())
    assert (topic, 1, 0, 3) in ranges and len(ranges) == 4
    assert sum(end - start for _, p, start, end in ranges if p == 0) == 100


def test_resolved_offsets(topics):
    """KafkaOffsetReaderSuite: "SPARK-30656: getOffsetRangesFromResolvedOffsets": a
    micro-batch 0..100 and 0..3 with minPartitions 4."""
    topic = topics.new(2)
    topics.send(topic, range(100), 0)
    topics.send(topic, range(4), 1)
    reader = KafkaStreamReader(SourceOptions.parse(topics.options(topic, minPartitions="4")))
    ranges = planned(reader.partitions({topic: {"0": 0, "1": 0}}, {topic: {"0": 100, "1": 3}}))
    assert (topic, 1, 0, 3) in ranges and len(ranges) == 4
    assert sum(end - start for _, p, start, end in ranges if p == 0) == 100


@pytest.mark.parametrize("specified", [2, 4])
def test_timestamp_offset_does_not_match_assigned(topics, specified):
    """KafkaOffsetReaderSuite: "KAFKA_TIMESTAMP_OFFSET_DOES_NOT_MATCH_ASSIGNED error class -
    partitions assigned: 3, specified: 2 / 4"."""
    topic = topics.new(3)
    stamps = json.dumps({topic: {str(p): 1000 for p in range(specified)}})
    reader = batch(
        topics, topic, startingOffsetsByTimestamp=stamps, endingOffsetsByTimestamp=stamps
    )
    with pytest.raises(BadInput, match="startingOffsetsByTimestamp must name every partition"):
        reader.partitions()
