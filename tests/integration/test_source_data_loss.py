"""The source's own stream against a log that no longer holds its start: the stream reader's
driver-side methods called as Spark calls them (no Spark needed), on the embedded broker."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

from lagless.exceptions import DataLossError, TransientError
from lagless.gen import explicit, produce_profile
from lagless.source.datasource import KafkaStreamReader, RangePartition
from lagless.source.options import SourceOptions


def reader(bootstrap: str, topic: str, fail_on_data_loss: bool) -> KafkaStreamReader:
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "failOnDataLoss": str(fail_on_data_loss).lower(),
    }
    return KafkaStreamReader(SourceOptions.parse(options))


@pytest.mark.parametrize(
    ("start", "says"),
    [
        (
            {"0": 30, "1": 0},
            "t[0]: offset 30 is beyond the log's end 10 (was the topic recreated?)",
        ),
        ({"0": 3, "1": 0, "2": 4}, "t[2] is gone (it was read up to offset 4)"),
        ({"0": 1, "1": 0}, "t[0]: offsets 1..3 were deleted before lagless read them"),
    ],
)
def test_failondataloss_true_fails_as_sparks_source_does(broker, kafka, start, says):
    broker.create_topic("t", 2)
    produce_profile(kafka, "t", explicit([10, 0]))
    broker.delete_records("t", 0, before_offset=3)

    with pytest.raises(DataLossError, match=r"rerun with failOnDataLoss=false") as raised:
        reader(broker.bootstrap, "t", True).latestOffset({"t": start}, ReadAllAvailable())
    assert str(raised.value).startswith(says)


def test_failondataloss_false_reads_a_recreated_log_from_its_start(broker, kafka):
    broker.create_topic("t", 1)
    produce_profile(kafka, "t", explicit([10]))
    broker.delete_records("t", 0, before_offset=3)
    stream = reader(broker.bootstrap, "t", False)
    start = {"t": {"0": 30, "1": 7}}  # a checkpoint of the topic before it was recreated

    end = stream.latestOffset(start, ReadAllAvailable())
    tasks = stream.partitions(start, end)

    assert end == {"t": {"0": 10}}
    pieces = [piece for task in tasks if isinstance(task, RangePartition) for piece in task.pieces]
    read = sorted(o for p in pieces if p.key == ("t", 0) for o in range(p.start, p.end))
    assert read == list(range(3, 10)) and all(p.key == ("t", 0) for p in pieces)


def test_a_batch_no_record_of_which_can_be_read_to_size_it_is_a_transient_error(broker):
    """maxBytesPerBatch weighs a batch by records read where its partitions start. A broker
    that names a log start it no longer serves (the embedded one moves its start back below
    records it deleted; a broker deleting them meanwhile) leaves nothing to weigh: an error
    saying where (exit 75), not the planner's ValueError (exit 1)."""
    from confluent_kafka import Producer

    broker.create_topic("t", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for n in range(10):  # a produce batch each: the broker deletes whole batches
        producer.produce("t", b"%d" % n, partition=0)
        producer.flush(10)
    broker.delete_records("t", 0, before_offset=6)
    broker.delete_records("t", 0, before_offset=2)  # the log starts at 2 again; 2..5 are gone
    options = {
        "kafka.bootstrap.servers": broker.bootstrap,
        "subscribe": "t",
        "maxBytesPerBatch": "1000000",
    }
    stream = KafkaStreamReader(SourceOptions.parse(options))

    with pytest.raises(TransientError, match=r"cannot size the next batch") as raised:
        stream.latestOffset({"t": {"0": 2}}, ReadMaxBytes(1_000_000))
    assert "t[0] at offset 2" in str(raised.value)
    # Where records are there to weigh, the same stream plans the batch.
    assert stream.latestOffset({"t": {"0": 6}}, ReadMaxBytes(1_000_000)) == {"t": {"0": 10}}
