"""The lagless Kafka source for Spark: `spark.readStream.format("lagless-kafka")`.

The driver decides offsets (initialOffset, latestOffset, partitions); executors only read the
ranges they are handed (read). Offsets travel as {"topic": {"partition": next_offset}}.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from lagless.exceptions import BadInput, DataLossError
from lagless.planner import limit_batch, plan_tasks
from lagless.planner.pack import pack_tasks
from lagless.planner.ranges import OffsetRange
from lagless.source.executor_write import RECEIPT_SCHEMA, load_writer, write_task
from lagless.source.offsets import TP, OffsetReader, Offsets
from lagless.source.options import EARLIEST, LATEST, SourceOptions
from lagless.source.reader import read_ranges
from lagless.source.sampling import sample_bytes_per_record
from lagless.source.schema import SPARK_SCHEMA

SOURCE_NAME = "lagless-kafka"


def to_json_offsets(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json_offsets(doc: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {(t, int(p)): int(o) for t, parts in doc.items() for p, o in parts.items()}


class RangePartition(InputPartition):
    """One Spark task: the pieces it reads, in turn."""

    def __init__(self, pieces: tuple[OffsetRange, ...]) -> None:
        super().__init__(pieces)
        self.pieces = pieces


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        if "executorWriter" in self.options:
            return RECEIPT_SCHEMA
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options))


class _Planning:
    """Offset decisions shared by the batch and the stream reader (driver side)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._broker: OffsetReader | None = None
        self._bytes_per_record: dict[TP, float] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; the admin client stays on the driver.
        return {**self.__dict__, "_broker": None}

    @property
    def broker(self) -> OffsetReader:
        if self._broker is None:
            self._broker = OffsetReader(self.options.kafka)
        return self._broker

    def partitions(self) -> list[TP]:
        return self.broker.partitions(self.options.topics, self.options.pattern)

    def resolve(
        self, spec: str | dict[str, dict[str, int]], low: Offsets, high: Offsets
    ) -> Offsets:
        if spec == "earliest":
            return dict(low)
        if spec == "latest":
            return dict(high)
        assert isinstance(spec, dict)
        given = from_json_offsets(spec)
        unknown = sorted(set(given) - set(high))
        if unknown:
            topic, partition = unknown[0]
            raise BadInput(f"offsets name {topic}[{partition}], which does not exist")
        resolved = {}
        for tp in high:
            offset = given.get(tp, EARLIEST)
            if offset == EARLIEST:
                offset = low[tp]
            elif offset == LATEST:
                offset = high[tp]
            resolved[tp] = offset
        return resolved

    def check_data_loss(self, start: Offsets, low: Offsets) -> Offsets:
        """Move starts that retention already deleted to the log start, or fail."""
        moved = dict(start)
        for tp, offset in start.items():
            if tp in low and offset < low[tp]:
                if self.options.fail_on_data_loss:
                    raise DataLossError(
                        f"{tp[0]}[{tp[1]}]: offsets {offset}..{low[tp]} were deleted before "
                        "lagless read them; rerun with failOnDataLoss=false to skip what is gone"
                    )
                moved[tp] = low[tp]
        return moved

    def bytes_per_record(self, ranges: Sequence[OffsetRange]) -> dict[TP, float]:
        unknown = [r for r in ranges if r.records and r.key not in self._bytes_per_record]
        if unknown:
            self._bytes_per_record.update(sample_bytes_per_record(self.options.kafka, unknown))
        return dict(self._bytes_per_record)

    def plan(self, start: Offsets, end: Offsets) -> list[RangePartition]:
        ranges = [
            OffsetRange(t, p, start.get((t, p), until), until)
            for (t, p), until in sorted(end.items())
            if until > start.get((t, p), until)
        ]
        sizes = self.bytes_per_record(ranges)
        pieces = plan_tasks(
            ranges, self.options.slots, sizes, min_task_records=self.options.min_task_records
        )
        return [
            RangePartition(task) for task in pack_tasks(pieces, self.options.min_task_bytes, sizes)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        options = self.options
        if options.executor_writer is None:
            yield from self._read(partition.pieces)
            return
        writer = load_writer(options.executor_writer, options.executor_writer_config)
        yield from write_task(writer, partition.pieces, lambda piece: self._read([piece]))

    def _read(self, pieces: Sequence[OffsetRange]) -> Iterator[pa.RecordBatch]:
        return read_ranges(
            self.options.kafka,
            pieces,
            fail_on_data_loss=self.options.fail_on_data_loss,
            poll_timeout_s=self.options.poll_timeout_s,
        )


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self._planning = _Planning(options)

    def partitions(self) -> Sequence[InputPartition]:
        planning = self._planning
        low, high = planning.broker.watermarks(planning.partitions())
        start = planning.check_data_loss(
            planning.resolve(planning.options.starting, low, high), low
        )
        end = planning.resolve(planning.options.ending, low, high)
        return planning.plan(start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._planning.read(partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self._planning = _Planning(options)
        self._target: Offsets | None = None

    def initialOffset(self) -> dict[str, Any]:
        planning = self._planning
        low, high = planning.broker.watermarks(planning.partitions())
        return to_json_offsets(planning.resolve(planning.options.starting, low, high))

    def prepareForTriggerAvailableNow(self) -> None:
        planning = self._planning
        self._target = planning.broker.latest(planning.partitions())

    def getDefaultReadLimit(self) -> ReadLimit:
        options = self._planning.options
        if options.max_records_per_batch:
            return ReadMaxRows(options.max_records_per_batch)
        if options.max_bytes_per_batch:
            return ReadMaxBytes(options.max_bytes_per_batch)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        planning = self._planning
        low, high = planning.broker.watermarks(planning.partitions())
        if self._target is not None:
            high = {tp: min(h, self._target.get(tp, low[tp])) for tp, h in high.items()}
        begun = from_json_offsets(start)
        # Partitions that appeared since the query started are read from their beginning.
        begun = {tp: begun.get(tp, low[tp]) for tp in high}
        begun = planning.check_data_loss(begun, low)
        latest = {tp: max(h, begun[tp]) for tp, h in high.items()}
        if isinstance(limit, ReadAllAvailable):
            return to_json_offsets(latest)
        options = planning.options
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        if max_records is None:
            max_records = options.max_records_per_batch
        if max_bytes is None:
            max_bytes = options.max_bytes_per_batch
        ranges = [OffsetRange(t, p, begun[(t, p)], latest[(t, p)]) for t, p in latest]
        end = limit_batch(
            begun,
            latest,
            max_records=max_records,
            max_bytes=max_bytes,
            bytes_per_record=planning.bytes_per_record(ranges) if max_bytes else None,
        )
        return to_json_offsets(end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        planning = self._planning
        return to_json_offsets(planning.broker.latest(planning.partitions()))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return self._planning.plan(from_json_offsets(start), from_json_offsets(end))

    def estimated_bytes(self, piece: OffsetRange) -> int:
        """What reading `piece` should bring, by the sizes the plan was weighed with."""
        return round(piece.records * self._planning.bytes_per_record([piece]).get(piece.key, 0.0))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._planning.read(partition)
