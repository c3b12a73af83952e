"""Spark's Kafka source options on the embedded broker: start and end by timestamp, assign,
includeHeaders, maxOffsetsPerTrigger, minPartitions and maxRecordsPerPartition."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from confluent_kafka import Producer

from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.kafka.embedded_log_offsets import EmbeddedLogOffsets
from lagless.kafka.offset_reader import OffsetReader
from lagless.source import SOURCE_NAME
from lagless.source.datasource import KafkaStreamReader
from lagless.source.options import SourceOptions

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


def produce_timed(kafka: KafkaConfig, topic: str, partitions: int, per_partition: int) -> None:
    """Record i of each partition has timestamp T0 + i * 1000, value b"<partition>:<i>", and a
    header ("n", i)."""
    producer = Producer(kafka.producer())
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(
                topic,
                key=f"k{i}".encode(),
                value=f"{p}:{i}".encode(),
                partition=p,
                timestamp=T0 + i * 1000,
                headers=[("n", str(i).encode())],
            )
    assert producer.flush(30) == 0


def options(kafka: KafkaConfig, topic: str, **more: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": kafka.bootstrap, "subscribe": topic, **more}


def batch_rows(spark, kafka: KafkaConfig, topic: str, **more: str) -> list:  # type: ignore[no-untyped-def]
    frame = spark.read.format(SOURCE_NAME).options(**options(kafka, topic, **more)).load()
    columns = ["partition", "offset", "value"] + (["headers"] if "headers" in frame.columns else [])
    return sorted(frame.select(*columns).collect())


def test_offsets_for_times_on_the_embedded_broker(broker, kafka, topic_name):
    broker.create_topic(topic_name, 2)
    produce_timed(kafka, topic_name, 2, 10)

    reader = OffsetReader(kafka)
    found = reader.log.offsets_for_times(
        {(topic_name, 0): T0 + 3500, (topic_name, 1): T0 + 10 * 1000}
    )

    # The mock cluster answers no ListOffsets by time: the embedded broker's logs are scanned.
    assert isinstance(reader.log, EmbeddedLogOffsets)
    assert found == {(topic_name, 0): 4, (topic_name, 1): None}


def test_stopping_a_stream_closes_every_offset_reader_it_opened(
    broker, kafka, topic_name, monkeypatch
):
    """Spark calls the stream reader's stop() when the query ends."""
    broker.create_topic(topic_name, 2)
    produce_timed(kafka, topic_name, 2, 10)
    opened: list[OffsetReader] = []
    closed: list[OffsetReader] = []
    real_init, real_close = OffsetReader.__init__, OffsetReader.close

    def init(self: OffsetReader, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(self)

    def close(self: OffsetReader) -> None:
        real_close(self)
        closed.append(self)

    monkeypatch.setattr(OffsetReader, "__init__", init)
    monkeypatch.setattr(OffsetReader, "close", close)
    stream = KafkaStreamReader(
        SourceOptions.parse(options(kafka, topic_name, maxBytesPerBatch="99"))
    )

    stream.stop()  # nothing opened yet
    start = stream.initialOffset()
    stream.latestOffset(start, stream.getDefaultReadLimit())  # plans, samples record sizes
    stream.stop()

    assert opened and closed == opened
    stream.initialOffset()  # a stopped stream that plans again opens a new one
    assert len(opened) == 2


def test_registering_the_source_tells_a_worker_python_without_lagless(spark, tmp_path, monkeypatch):
    """Spark's own registration, on the driver, with workers set to a Python that cannot import
    lagless: one line naming the fix, before any query."""
    from lagless import KafkaDataSource
    from lagless.exceptions import BadInput
    from tests.unit.test_worker_python import python_without_lagless

    python = python_without_lagless(tmp_path)
    monkeypatch.setattr(spark.sparkContext, "pythonExec", python)
    with pytest.raises(BadInput, match="cannot import lagless; set PYSPARK_PYTHON"):
        spark.dataSource.register(KafkaDataSource)


def test_batch_query_starts_and_ends_by_timestamp(broker, kafka, topic_name, spark):
    broker.create_topic(topic_name, 2)
    produce_timed(kafka, topic_name, 2, 20)

    rows = batch_rows(
        spark,
        kafka,
        topic_name,
        startingTimestamp=str(T0 + 5000),
        endingTimestamp=str(T0 + 8000),
    )
    assert [(r.partition, r.offset) for r in rows] == [(p, o) for p in (0, 1) for o in (5, 6, 7)]

    by_partition = batch_rows(
        spark,
        kafka,
        topic_name,
        startingOffsetsByTimestamp=f'{{"{topic_name}": {{"0": {T0 + 18000}, "1": {T0}}}}}',
        endingOffsetsByTimestamp=f'{{"{topic_name}": {{"0": {T0 + 10**9}, "1": {T0 + 2000}}}}}',
    )
    assert [(r.partition, r.offset) for r in by_partition] == [(0, 18), (0, 19), (1, 0), (1, 1)]

    # After the last record: the start is the end offset, so nothing is read (and "error"
    # fails, as Spark's default strategy does).
    assert batch_rows(spark, kafka, topic_name, startingTimestamp=str(T0 + 10**9)) == []
    with pytest.raises(Exception, match="no record at or after timestamp"):
        batch_rows(
            spark,
            kafka,
            topic_name,
            startingTimestamp=str(T0 + 10**9),
            startingOffsetsByTimestampStrategy="error",
        )


def test_assign_reads_only_the_assigned_partitions(broker, kafka, topic_name, spark):
    broker.create_topic(topic_name, 3)
    produce_timed(kafka, topic_name, 3, 4)

    frame = (
        spark.read.format(SOURCE_NAME)
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("assign", f'{{"{topic_name}": [0, 2]}}')
        .load()
    )

    assert sorted((r.partition, r.offset) for r in frame.collect()) == [
        (p, o) for p in (0, 2) for o in range(4)
    ]


def test_include_headers(broker, kafka, topic_name, spark):
    broker.create_topic(topic_name, 1)
    produce_timed(kafka, topic_name, 1, 3)

    without = batch_rows(spark, kafka, topic_name)
    with_headers = batch_rows(spark, kafka, topic_name, includeHeaders="true")

    assert ["headers" in r.asDict() for r in without] == [False, False, False]
    assert [[(h.key, bytes(h.value)) for h in r.headers] for r in with_headers] == [
        [("n", str(i).encode())] for i in range(3)
    ]


def micro_batch_sizes(spark, kafka, topic: str, tmp_path: Path, **more: str) -> list[int]:  # type: ignore[no-untyped-def]
    """Records per micro-batch of a stream under the availableNow trigger."""
    return [sum(counts.values()) for counts in micro_batches(spark, kafka, topic, tmp_path, **more)]


def micro_batches(spark, kafka, topic: str, tmp_path: Path, **more: str) -> list[dict[int, int]]:  # type: ignore[no-untyped-def]
    """Records per partition of each micro-batch of a stream under the availableNow trigger."""
    sizes: list[dict[int, int]] = []
    stream = (
        spark.readStream.format(SOURCE_NAME)
        .options(**options(kafka, topic, startingOffsets="earliest", **more))
        .load()
    )
    query = (
        stream.writeStream.foreachBatch(
            lambda frame, _: sizes.append(
                {
                    row.partition: row["count"]
                    for row in frame.groupBy("partition").count().collect()
                }
            )
        )
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return sizes


def test_max_offsets_per_trigger_caps_each_micro_batch(broker, kafka, topic_name, spark, tmp_path):
    broker.create_topic(topic_name, 2)
    produce_timed(kafka, topic_name, 2, 250)
    sizes = micro_batch_sizes(spark, kafka, topic_name, tmp_path, maxOffsetsPerTrigger="120")

    assert sizes == [120, 120, 120, 120, 20]


def test_first_batch_max_bytes_caps_only_the_first_micro_batch(
    broker, kafka, topic_name, spark, tmp_path
):
    """lagless's firstBatchMaxBytes: the first batch is small and reads from as many partitions
    as there are slots (each range a task starts costs a fetch at a new offset), those with the
    most records left; the next ones use maxBytesPerBatch (here: everything left)."""
    broker.create_topic(topic_name, 4)
    produce_timed(kafka, topic_name, 4, 250)
    produce_timed(kafka, topic_name, 1, 50)  # partition 0 has the most left
    batches = micro_batches(
        spark,
        kafka,
        topic_name,
        tmp_path,
        slots="2",
        maxBytesPerBatch=str(1 << 30),
        firstBatchMaxBytes="1000",  # ~100 of these ~10-byte records
    )

    sizes = [sum(counts.values()) for counts in batches]
    assert len(sizes) == 2 and 0 < sizes[0] < 250 and sum(sizes) == 1050, batches
    assert sorted(batches[0]) == [0, 1], batches  # 300 left, then the first of the 250s
    assert sorted(batches[1]) == [0, 1, 2, 3], batches


def test_min_partitions_and_max_records_per_partition_shape_the_tasks(
    broker, kafka, topic_name, spark
):
    broker.create_topic(topic_name, 2)
    produce_timed(kafka, topic_name, 2, 30)

    def tasks(**more: str) -> list[int]:
        frame = spark.read.format(SOURCE_NAME).options(**options(kafka, topic_name, **more))
        counts = frame.load().rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
        assert sum(counts) == 60
        return counts

    assert len(tasks(minPartitions="7")) >= 7
    assert max(tasks(maxRecordsPerPartition="8")) <= 8


def test_import_between_two_timestamps(broker, kafka, topic_name, spark, tmp_path: Path):
    broker.create_topic(topic_name, 2)
    produce_timed(kafka, topic_name, 2, 20)

    summary = run_import(
        ImportSpec(
            kafka=kafka,
            topics=(topic_name,),
            sink_url=f"sqlite:///{tmp_path}/out.db",
            checkpoint=str(tmp_path / "ckpt"),
            starting_timestamp=T0 + 10_000,
            ending_timestamp=T0 + 15_000,
        ),
        spark=spark,
    )

    with sqlite3.connect(tmp_path / "out.db") as conn:
        rows = conn.execute(f'SELECT partition, "offset" FROM "{topic_name}" ORDER BY 1, 2')
        stored = rows.fetchall()
    assert stored == [(p, o) for p in (0, 1) for o in range(10, 15)]
    assert summary.records == 10
