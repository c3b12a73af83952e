"""Shared pieces of the ports of Spark's Kafka source suites (apache/spark,
connector/kafka-0-10-sql/src/test/scala/org/apache/spark/sql/kafka010/).

One embedded broker serves the whole package (each test makes its own topics) and the Spark
session is the session-scoped `spark` fixture. Spark's KafkaTestUtils becomes `Topics`:
create a topic, send values to a partition with a timestamp, headers or nulls.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from lagless.broker import EmbeddedBroker
from lagless.kafka.config import KafkaConfig
from lagless.source import SOURCE_NAME
from lagless.source.datasource import KafkaStreamReader, from_json_offsets
from lagless.source.options import SourceOptions

_ids = itertools.count()


class Topics:
    """Spark's KafkaTestUtils on the embedded broker."""

    def __init__(self, broker: EmbeddedBroker) -> None:
        self.broker = broker
        self.bootstrap = broker.bootstrap
        self._producer = Producer(KafkaConfig(broker.bootstrap).producer())

    def new(self, partitions: int = 1, prefix: str = "topic") -> str:
        name = f"{prefix}-{next(_ids)}"
        self.create(name, partitions)
        return name

    def create(self, name: str, partitions: int = 1) -> None:
        self.broker.create_topic(name, partitions)

    def send(
        self,
        topic: str,
        values: Iterable[object],
        partition: int = 0,
        *,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        key: bytes | None = None,
    ) -> None:
        for value in values:
            extra: dict[str, Any] = {}
            if timestamp is not None:
                extra["timestamp"] = timestamp
            if headers is not None:
                extra["headers"] = list(headers)
            self._producer.produce(
                topic,
                key=key,
                value=None if value is None else str(value).encode(),
                partition=partition,
                **extra,
            )
        assert self._producer.flush(30) == 0

    def options(self, topic: str | None = None, **more: str) -> dict[str, str]:
        given = {"kafka.bootstrap.servers": self.bootstrap, **more}
        if topic is not None:
            given["subscribe"] = topic
        return given


@pytest.fixture(scope="session")
def parity_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def topics(parity_broker: EmbeddedBroker) -> Topics:
    return Topics(parity_broker)


def read_values(spark, options: dict[str, str]) -> list[int]:  # type: ignore[no-untyped-def]
    """A batch query's values as sorted ints: Spark's checkAnswer on CAST(value AS STRING)."""
    frame = spark.read.format(SOURCE_NAME).options(**options).load()
    return sorted(int(r.value) for r in frame.selectExpr("CAST(value AS STRING)").collect())


def stream_batches(  # type: ignore[no-untyped-def]
    spark, options: dict[str, str], checkpoint: Path, trigger: dict[str, Any] | None = None
) -> list[list[int]]:
    """Run a stream to its end (availableNow unless told) and return each micro-batch's values,
    sorted, in batch order: Spark's CheckLastBatch, batch by batch."""
    batches: list[tuple[int, list[int]]] = []

    def collect(frame, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        values = frame.selectExpr("CAST(value AS STRING) AS v").collect()
        batches.append((batch_id, sorted(int(r.v) for r in values)))

    query = (
        spark.readStream.format(SOURCE_NAME)
        .options(**options)
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"availableNow": True}))
        .start()
    )
    try:
        query.awaitTermination(120)
    finally:
        query.stop()
    error = query.exception()
    if error is not None:
        raise error
    return [values for _, values in sorted(batches)]


def last_offsets(checkpoint: Path) -> dict[str, dict[str, int]]:
    """The source offsets of the last batch in a Spark checkpoint's offset log."""
    logs = sorted(
        (p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    return json.loads(logs[-1].read_text().splitlines()[-1])


class StreamDriver:
    """Spark's micro-batch loop over lagless's stream reader, step by step: each `trigger()` is
    one trigger of a query (latestOffset with the source's default read limit, then the batch's
    partitions read as Spark's tasks read them). A new driver from `offsets` is a restart from a
    checkpoint. For the tests that need Spark's manual clock (batch-by-batch limits, trigger
    delays): a real Spark query cannot be stepped one trigger at a time from Python."""

    def __init__(self, options: dict[str, str], offsets: dict[str, Any] | None = None) -> None:
        self.reader = KafkaStreamReader(SourceOptions.parse(options))
        self.offsets = offsets if offsets is not None else self.reader.initialOffset()

    def trigger(self) -> list[int]:
        """The values of the batch this trigger runs (empty when it runs none)."""
        end = self.reader.latestOffset(self.offsets, self.reader.getDefaultReadLimit())
        if end == self.offsets:
            return []
        values = self.read(self.offsets, end)
        self.offsets = end
        return values

    def read(self, start: dict[str, Any], end: dict[str, Any]) -> list[int]:
        values: list[int] = []
        for partition in self.reader.partitions(start, end):
            for batch in self.reader.read(partition):
                values.extend(int(v) for v in batch.column("value").to_pylist())
        return sorted(values)

    def positions(self) -> dict[tuple[str, int], int]:
        return from_json_offsets(self.offsets)

    def stop(self) -> None:
        self.reader.stop()
