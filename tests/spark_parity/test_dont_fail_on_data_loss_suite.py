"""Spark's KafkaDontFailOnDataLossSuite on lagless-kafka, failOnDataLoss both ways.

Spark's suite waits for a broker with tiny segments to age records out; the embedded broker's
delete_records moves the log start as retention would. Not ported: the "microbatch v1" and
"batch v1" variants (Spark's V1 reader classes: lagless is one Python data source) and
"continuous processing" (a Python source has no continuous mode); "stress test for
failOnDataLoss=false" deletes and recreates topics, which the embedded broker cannot.
"""

from __future__ import annotations

import json

import pytest

from tests.spark_parity.conftest import StreamDriver, Topics, read_values, stream_batches

pytestmark = pytest.mark.spark


def aged_out(topics: Topics) -> str:
    """50 records, the first 20 gone."""
    topic = topics.new(1)
    topics.send(topic, range(50), 0)
    topics.broker.delete_records(topic, 0, 20)
    return topic


def from_zero(topics: Topics, topic: str, fail: bool) -> dict[str, str]:
    return topics.options(
        topic,
        startingOffsets=json.dumps({topic: {"0": 0}}),
        failOnDataLoss=str(fail).lower(),
        **{"kafkaConsumer.pollTimeoutMs": "1000"},
    )


def test_fail_on_data_loss_false_batch_has_no_duplicates(spark, topics):
    """KafkaDontFailOnDataLossSuite: "failOnDataLoss=false should not return duplicated
    records: batch v2"."""
    topic = aged_out(topics)
    values = read_values(spark, from_zero(topics, topic, False))
    assert len(set(values)) == len(values) and values == list(range(20, 50))


def test_fail_on_data_loss_true_batch_fails(spark, topics):
    """The same batch query with failOnDataLoss=true (Spark's default) fails."""
    topic = aged_out(topics)
    with pytest.raises(Exception, match="were deleted before lagless read them"):
        read_values(spark, from_zero(topics, topic, True))


def test_fail_on_data_loss_false_microbatch_has_no_duplicates(spark, topics, tmp_path):
    """KafkaDontFailOnDataLossSuite: "failOnDataLoss=false should not return duplicated
    records: microbatch v2"."""
    topic = aged_out(topics)
    batches = stream_batches(spark, from_zero(topics, topic, False), tmp_path)
    values = [v for batch in batches for v in batch]
    assert len(set(values)) == len(values) and sorted(values) == list(range(20, 50))


@pytest.mark.parametrize("fail", [True, False])
def test_records_deleted_between_micro_batches(topics, fail):
    """Records deleted between two batches of a running stream: failOnDataLoss=true fails the
    next batch, false skips what is gone and reads the rest once."""
    topic = topics.new(1)
    topics.send(topic, range(10), 0)
    driver = StreamDriver(
        topics.options(topic, startingOffsets="earliest", failOnDataLoss=str(fail).lower())
    )
    assert driver.trigger() == list(range(10))
    topics.send(topic, range(10, 50), 0)
    topics.broker.delete_records(topic, 0, 30)
    if fail:
        with pytest.raises(Exception, match="were deleted before lagless read them"):
            driver.trigger()
    else:
        assert driver.trigger() == list(range(30, 50))


@pytest.mark.parametrize("fail", [True, False])
def test_records_deleted_after_the_batch_was_planned(topics, fail):
    """Records deleted after a micro-batch was planned, before its task reads them (Spark's
    executor-side check): failOnDataLoss=true fails the task, false reads what is left."""
    topic = topics.new(1)
    topics.send(topic, range(50), 0)
    driver = StreamDriver(
        topics.options(topic, startingOffsets="earliest", failOnDataLoss=str(fail).lower())
    )
    reader = driver.reader
    end = reader.latestOffset(driver.offsets, reader.getDefaultReadLimit())
    tasks = reader.partitions(driver.offsets, end)
    topics.broker.delete_records(topic, 0, 30)

    def read() -> list[int]:
        return sorted(
            int(v)
            for task in tasks
            for b in reader.read(task)
            for v in b.column("value").to_pylist()
        )

    if fail:
        with pytest.raises(Exception, match="offsets before 30 were deleted"):
            read()
    else:
        assert read() == list(range(30, 50))


def test_rate_limit_counts_only_records_that_exist(topics):
    """lagless vs Spark (README's table): with failOnDataLoss=false, a stream's batch starts
    at the log start, so maxOffsetsPerTrigger counts records that exist. Spark counts the
    deleted offsets too (its first batches here would be empty: offsets 0..10, 10..20)."""
    topic = aged_out(topics)
    driver = StreamDriver({**from_zero(topics, topic, False), "maxOffsetsPerTrigger": "10"})
    assert driver.trigger() == list(range(20, 30))
    assert driver.trigger() == list(range(30, 40))


def test_fail_on_data_loss_true_microbatch_fails(spark, topics, tmp_path):
    """The same stream with failOnDataLoss=true (Spark's default) fails."""
    topic = aged_out(topics)
    with pytest.raises(Exception, match="were deleted before lagless read them"):
        stream_batches(spark, from_zero(topics, topic, True), tmp_path)
