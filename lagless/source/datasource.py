"""The lagless Kafka source for Spark: `spark.readStream.format("lagless-kafka")`.

The driver decides offsets (initialOffset, latestOffset, partitions); executors only read the
ranges they are handed (read). Offsets travel as {"topic": {"partition": next_offset}}.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from lagless.exceptions import (
    BadInput,
    DataLossError,
    TransientError,
    crosses_spark,
    crossing_spark,
)
from lagless.kafka import TP, Offsets
from lagless.kafka.offset_reader import OffsetReader
from lagless.logs import configure_from_environment
from lagless.planner import fewest_partitions, limit_batch, plan_tasks, rate_limit
from lagless.planner.pack import pack_tasks, pack_tasks_per_topic
from lagless.planner.ranges import OffsetRange
from lagless.signals import StopFile
from lagless.source import avro_values, json_values
from lagless.source.data_loss import lost_offsets, resumed
from lagless.source.executor_write import RANGE_RECEIPT_SCHEMA, load_writer, write_task
from lagless.source.options import (
    AVAILABLE_NOW_ENDING_TIMESTAMP,
    EARLIEST,
    ENDING_OFFSETS,
    ENDING_OFFSETS_BY_TIMESTAMP,
    EXECUTOR_WRITER,
    LATEST,
    STARTING_OFFSETS,
    STARTING_OFFSETS_BY_TIMESTAMP,
    OffsetsSpec,
    SourceOptions,
    TimestampSpec,
    include_headers,
)
from lagless.source.reader import gathered, read_ranges
from lagless.source.sampling import SAMPLE_WAIT_S, sample_bytes_per_record
from lagless.source.schema import ARROW_SCHEMA, SPARK_SCHEMA, SPARK_SCHEMA_WITH_HEADERS
from lagless.source.worker_python import check_worker_python

SOURCE_NAME = "lagless-kafka"
log = logging.getLogger(__name__)

log = logging.getLogger(__name__)


def _check_names_every_partition(option: str, named: Iterable[TP], assigned: Iterable[TP]) -> None:
    """Spark's rule for JSON offsets and timestamps: exactly the partitions the query reads."""
    missing, unknown = sorted(set(assigned) - set(named)), sorted(set(named) - set(assigned))
    if missing or unknown:
        problems = [
            f"{what} {', '.join(f'{t}[{p}]' for t, p in tps)}"
            for what, tps in (("misses", missing), ("names unknown", unknown))
            if tps
        ]
        raise BadInput(
            f"option {option} must name every partition the query reads (-2 earliest, "
            f"-1 latest), as in Spark: it {' and '.join(problems)}"
        )


def to_json_offsets(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def from_json_offsets(doc: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {(t, int(p)): int(o) for t, parts in doc.items() for p, o in parts.items()}


class RangePartition(InputPartition):
    """One Spark task: the pieces it reads (at once: source/reader.py)."""

    def __init__(self, pieces: tuple[OffsetRange, ...]) -> None:
        super().__init__(pieces)
        self.pieces = pieces


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        # Spark asks the name when the source is registered, on the driver: the moment to
        # tell a worker Python without lagless in one line.
        check_worker_python()
        return SOURCE_NAME

    def schema(self) -> str:
        # Spark calls this at load(): bad options fail there, as Spark's Kafka source's do.
        fields = SourceOptions.parse(self.options, batch=None).decode_json_values
        if EXECUTOR_WRITER in self.options:  # Spark's options: names in any case
            return RANGE_RECEIPT_SCHEMA
        schema = SPARK_SCHEMA_WITH_HEADERS if include_headers(self.options) else SPARK_SCHEMA
        if fields is not None:
            schema += f", {json_values.COLUMN} {json_values.spark_type(fields)}"
        return schema

    @crosses_spark
    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(SourceOptions.parse(self.options, batch=True))

    @crosses_spark
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options))


class _Planning:
    """Offset decisions shared by the batch and the stream reader (driver side)."""

    def __init__(self, options: SourceOptions) -> None:
        # In Spark's Python runner: the driver's log settings.
        configure_from_environment(options.log_to)
        self.options = options
        self._reader: OffsetReader | None = None
        self._bytes_per_record: dict[TP, float] = {
            tp: float(size) for tp, size in from_json_offsets(options.bytes_per_record).items()
        }
        self._held = from_json_offsets(options.held)

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; the admin client stays on the driver.
        return {**self.__dict__, "_reader": None}

    @property
    def reader(self) -> OffsetReader:
        if self._reader is None:
            # The import checked the broker before the query started: from here on, a broker
            # that does not answer is away, and waited for (retrySeconds).
            self._reader = OffsetReader(
                self.options.kafka, retry_s=self.options.retry_s, reached=True, stop=self.stop
            )
        return self._reader

    @property
    def stop(self) -> StopFile | None:
        """The import's stop request (stopFile), which ends a wait for a broker that is away."""
        return StopFile(self.options.stop_file) if self.options.stop_file else None

    def close(self) -> None:
        """Release the clients the driver opened; planning again opens new ones."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def partitions(self) -> list[TP]:
        options = self.options
        return self.reader.cluster.partitions(options.topics, options.pattern, options.assign)

    def starting_offsets(self, low: Offsets, high: Offsets) -> Offsets:
        """Where a query starts: by time (startingTimestamp, startingOffsetsByTimestamp) when
        given, else by startingOffsets; never below what the store holds (heldOffsets)."""
        return self.above_held(self.requested_start(low, high))

    def requested_start(self, low: Offsets, high: Offsets) -> Offsets:
        """Where the options say a query starts, whatever the store holds."""
        options = self.options
        if options.starting_timestamps is not None:
            return self.by_time(options.starting_timestamps, low, high, starting=True)
        return self.resolve(options.starting, low, high, STARTING_OFFSETS)

    def above_held(self, offsets: Offsets) -> Offsets:
        """Offsets raised to what the store holds already (heldOffsets): those are not read
        again, whatever the checkpoint says."""
        held = self._held
        return {tp: max(offset, held.get(tp, offset)) for tp, offset in offsets.items()}

    def ending_offsets(self, low: Offsets, high: Offsets) -> Offsets:
        """Where a batch query ends: by time (endingTimestamp, endingOffsetsByTimestamp) when
        given, else by endingOffsets."""
        options = self.options
        if options.ending_timestamps is not None:
            return self.by_time(options.ending_timestamps, low, high, starting=False)
        return self.resolve(options.ending, low, high, ENDING_OFFSETS)

    def by_time(
        self, spec: TimestampSpec, low: Offsets, high: Offsets, *, starting: bool
    ) -> Offsets:
        """Each partition's first offset at or after its timestamp (the broker's ListOffsets by
        time). A partition whose records are all older ends at its latest offset; it starts
        there too, unless startingOffsetsByTimestampStrategy is error. JSON timestamps name
        every partition the query reads, as Spark requires."""
        if isinstance(spec, int):
            wanted = dict.fromkeys(high, spec)
        else:
            wanted = from_json_offsets(spec)
            name = STARTING_OFFSETS_BY_TIMESTAMP if starting else ENDING_OFFSETS_BY_TIMESTAMP
            _check_names_every_partition(name, wanted.keys(), high.keys())
        found = self.reader.log.offsets_for_times(wanted, high)
        resolved = {}
        for tp in high:
            offset = found.get(tp)
            if offset is None:
                if starting and self.options.starting_timestamp_strategy == "error":
                    raise BadInput(
                        f"{tp[0]}[{tp[1]}] has no record at or after timestamp {wanted[tp]} "
                        "(startingOffsetsByTimestampStrategy is error)"
                    )
                offset = high[tp]
            resolved[tp] = min(max(offset, low[tp]), high[tp])
        return resolved

    def resolve(self, spec: OffsetsSpec, low: Offsets, high: Offsets, name: str) -> Offsets:
        """Offsets by earliest, latest or JSON, which names every partition the query reads
        (a topic given whole names all of its partitions), as Spark requires."""
        if spec == "earliest":
            return dict(low)
        if spec == "latest":
            return dict(high)
        assert isinstance(spec, dict)
        given: Offsets = {}
        for topic, parts in spec.items():
            if isinstance(parts, int):
                given.update({tp: parts for tp in high if tp[0] == topic})
            else:
                given.update({(topic, int(p)): o for p, o in parts.items()})
        _check_names_every_partition(name, given.keys(), high.keys())
        resolved = {}
        for tp in high:
            offset = given[tp]
            if offset == EARLIEST:
                offset = low[tp]
            elif offset == LATEST:
                offset = high[tp]
            resolved[tp] = offset
        return resolved

    def check_data_loss(self, start: Offsets, low: Offsets, high: Offsets) -> Offsets:
        """Where reading goes on from `start`: offsets the log no longer holds (deleted by
        retention, beyond a recreated log's end, a partition gone) fail, as in Spark's source,
        unless failOnDataLoss=false, which goes on from the log's start (gone partitions are
        dropped). Partitions `start` does not name begin at the log's start."""
        lost = lost_offsets(start, low, high)
        if lost and self.options.fail_on_data_loss:
            raise DataLossError(f"{lost[0]}; rerun with failOnDataLoss=false to skip what is gone")
        for each in lost:
            log.warning("%s: skipped, reading on from the log's start", each)
        moved = resumed(start, lost)
        return {tp: moved.get(tp, low[tp]) for tp in high}

    def bytes_per_record(self, ranges: Sequence[OffsetRange]) -> dict[TP, float]:
        unknown = [r for r in ranges if r.records and r.key not in self._bytes_per_record]
        if unknown:
            self._bytes_per_record.update(sample_bytes_per_record(self.reader.records, unknown))
        return dict(self._bytes_per_record)

    def plan(self, start: Offsets, end: Offsets) -> list[RangePartition]:
        start = self.above_held(start)
        ranges = [
            OffsetRange(t, p, start.get((t, p), until), until)
            for (t, p), until in sorted(end.items())
            if until > start.get((t, p), until)
        ]
        sizes = self.bytes_per_record(ranges)
        options = self.options
        pieces = plan_tasks(
            ranges,
            options.slots,
            sizes,
            min_task_records=options.min_task_records,
            min_tasks=options.min_partitions or 1,
            max_task_records=options.max_records_per_partition,
        )
        if (options.min_partitions or 0) > 1 or options.max_records_per_partition:
            # A Spark task per piece: packing would undo minPartitions and maxRecordsPerPartition.
            return [RangePartition((piece,)) for piece in pieces]
        if options.one_topic_per_task:
            tasks = pack_tasks_per_topic(pieces, options.min_task_bytes, sizes)
        else:
            tasks = pack_tasks(pieces, options.min_task_bytes, sizes)
        return [RangePartition(task) for task in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """A task's records (or its receipts, when it writes them itself); runs on an
        executor, so lagless's errors leave it marked (exceptions.crossing_spark)."""
        if not isinstance(partition, RangePartition):
            # A batch query with nothing to read: PySpark then runs one task of its own.
            return
        options = self.options
        configure_from_environment(options.log_to)
        with crossing_spark():
            if options.executor_writer is None:
                yield from self._read(partition.pieces)
                return
            writer = load_writer(
                options.executor_writer,
                options.executor_writer_config,
                options.executor_writer_secret,
            )
            yield from write_task(writer, partition.pieces, self._read)

    def _read(
        self,
        pieces: Sequence[OffsetRange],
        each: Callable[[pa.RecordBatch], None] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The pieces' records gathered into fewer batches (reader.gathered), decoded where
        the options ask; `each` sees every batch as read, of one piece."""
        batches: Iterator[pa.RecordBatch] = read_ranges(
            self.options.kafka,
            pieces,
            fail_on_data_loss=self.options.fail_on_data_loss,
            poll_timeout_s=self.options.poll_timeout_s,
            retry_s=self.options.retry_s,
            stop=self.stop,
        )
        if each is not None:
            batches = _seen_by(batches, each)
        batches = gathered(batches)
        if not self.options.include_headers:
            batches = (batch.remove_column(_HEADERS) for batch in batches)
        if self.options.decode_json_values is not None:
            batches = json_values.JsonValues(self.options.decode_json_values).added_to(batches)
        if self.options.decode_avro_values is not None:
            batches = avro_values.AvroValues.from_option(self.options.decode_avro_values)(batches)
        return batches


def _seen_by(
    batches: Iterator[pa.RecordBatch], each: Callable[[pa.RecordBatch], None]
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        each(batch)
        yield batch


# includeHeaders=false (Spark's default): no headers column, as in Spark's schema.
_HEADERS = ARROW_SCHEMA.get_field_index("headers")


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self._planning = _Planning(options)

    @crosses_spark
    def partitions(self) -> Sequence[InputPartition]:
        planning = self._planning
        low, high = planning.reader.log.watermarks(planning.partitions())
        requested = planning.requested_start(low, high)
        end = planning.ending_offsets(low, high)
        for (topic, partition), offset in sorted(requested.items()):
            if offset > end[(topic, partition)]:
                raise BadInput(
                    f"the resolved start offset {offset} is greater than the resolved end "
                    f"offset {end[(topic, partition)]} for {topic}[{partition}]"
                )
        start = planning.check_data_loss(planning.above_held(requested), low, high)
        return planning.plan(start, {tp: max(e, start[tp]) for tp, e in end.items()})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._planning.read(partition)


def _unweighed(ranges: Sequence[OffsetRange]) -> TransientError:
    """No record of the batch could be read where its partitions start (sampling.py asks for a
    few seconds), so its size against maxBytesPerBatch is unknown: a broker slow to answer, or
    one that names a log start it no longer serves (retention deleting meanwhile)."""
    waiting = [r for r in ranges if r.records]
    first = waiting[0]
    return TransientError(
        f"cannot size the next batch: no record of its {len(waiting)} partition(s) could be read "
        f"where they start ({first.topic}[{first.partition}] at offset {first.start}) within "
        f"{SAMPLE_WAIT_S:.0f} s: the broker was slow to answer, or no longer held them"
    )


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self._planning = _Planning(options)
        self._target: Offsets | None = None
        # When minOffsetsPerTrigger last let a trigger run (None: never, so the first trigger
        # runs whatever it finds, as in Spark).
        self._last_trigger_at: float | None = None
        self._planned_a_batch = False

    @crosses_spark
    def initialOffset(self) -> dict[str, Any]:
        planning = self._planning
        low, high = planning.reader.log.watermarks(planning.partitions())
        return to_json_offsets(planning.starting_offsets(low, high))

    @crosses_spark
    def prepareForTriggerAvailableNow(self) -> None:
        planning = self._planning
        self._target = planning.reader.log.latest(planning.partitions())
        stop_at = planning.options.available_now_ending_timestamp
        if stop_at is not None:
            low, high = planning.reader.log.watermarks(list(self._target))
            high = {tp: min(h, self._target[tp]) for tp, h in high.items()}
            self._target = planning.by_time(stop_at, low, high, starting=False)

    def getDefaultReadLimit(self) -> ReadLimit:
        """A limit whenever an option sets one; the options themselves say how much each batch
        reads. Spark passes ReadAllAvailable instead under Trigger.Once, which reads all."""
        options = self._planning.options
        maximum = options.max_offsets_per_trigger or options.max_records_per_batch
        if maximum:
            return ReadMaxRows(maximum)
        if options.max_bytes_per_batch:
            return ReadMaxBytes(options.max_bytes_per_batch)
        if options.min_offsets_per_trigger:
            return ReadMinRows(options.min_offsets_per_trigger)
        return ReadAllAvailable()

    @crosses_spark
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        planning = self._planning
        options = planning.options
        if options.available_now_ending_timestamp is not None and self._target is None:
            raise BadInput(
                f"option {AVAILABLE_NOW_ENDING_TIMESTAMP} needs the availableNow trigger"
            )
        low, high = planning.reader.log.watermarks(planning.partitions())
        # Against the log itself: an ending timestamp may stop short of the checkpoint. Then
        # not below what the store holds already.
        begun = planning.above_held(planning.check_data_loss(from_json_offsets(start), low, high))
        if self._target is not None:
            high = {tp: min(h, self._target.get(tp, low[tp])) for tp, h in high.items()}
        latest = {tp: max(h, begun[tp]) for tp, h in high.items()}
        if isinstance(limit, ReadAllAvailable):
            return to_json_offsets(latest)
        if self._delayed(begun, latest):
            return start
        if options.max_offsets_per_trigger:
            latest = rate_limit(begun, latest, options.max_offsets_per_trigger)
        max_bytes = options.max_bytes_per_batch
        if max_bytes is not None and options.first_batch_max_bytes and not self._planned_a_batch:
            max_bytes = min(max_bytes, options.first_batch_max_bytes)
            latest = fewest_partitions(begun, latest, options.slots)
        ranges = [OffsetRange(t, p, begun[(t, p)], latest[(t, p)]) for t, p in latest]
        sizes = planning.bytes_per_record(ranges) if max_bytes else None
        if max_bytes and not sizes and any(r.records for r in ranges):
            raise _unweighed(ranges)
        end = limit_batch(
            begun,
            latest,
            max_records=options.max_records_per_batch,
            max_bytes=max_bytes,
            bytes_per_record=sizes,
        )
        self._planned_a_batch = self._planned_a_batch or end != begun
        return to_json_offsets(end)

    def _delayed(self, begun: Offsets, latest: Offsets) -> bool:
        """Whether to skip this trigger, as Spark's KafkaMicroBatchStream.delayBatch decides:
        never once maxTriggerDelay has passed since the last trigger let through (the first
        trigger of a query always runs), else when fewer than minOffsetsPerTrigger offsets are
        available. Never under availableNow."""
        options = self._planning.options
        if options.min_offsets_per_trigger is None or self._target is not None:
            return False
        now = time.monotonic()
        last = self._last_trigger_at
        if last is None or now - last >= options.max_trigger_delay_s:
            self._last_trigger_at = now
            return False
        if sum(latest[tp] - begun[tp] for tp in latest) < options.min_offsets_per_trigger:
            return True
        self._last_trigger_at = now
        return False

    @crosses_spark
    def reportLatestOffset(self) -> dict[str, Any] | None:
        planning = self._planning
        return to_json_offsets(planning.reader.log.latest(planning.partitions()))

    @crosses_spark
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        planning = self._planning
        begun, until = from_json_offsets(start), from_json_offsets(end)
        # A partition that appeared since the last batch (a new topic matching the pattern)
        # is read from offset 0, as Spark's planInputPartitions does.
        begun = {tp: begun.get(tp, 0) for tp in until}
        low, high = planning.reader.log.watermarks(list(until))
        # An end before the start: latestOffset found the start lost (failOnDataLoss=false) and
        # went on from the log's start, which Spark does not know: read from there.
        begun.update({tp: min(low[tp], until[tp]) for tp in until if until[tp] < begun[tp]})
        # Offsets retention deleted since latestOffset are a data loss: the query fails, or
        # (failOnDataLoss=false) the batch starts at the log start.
        return planning.plan(planning.check_data_loss(begun, low, high), until)

    def estimated_bytes(self, piece: OffsetRange) -> int:
        """What reading `piece` should bring, by the sizes the plan was weighed with."""
        return round(piece.records * self._planning.bytes_per_record([piece]).get(piece.key, 0.0))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._planning.read(partition)

    def stop(self) -> None:
        """Spark calls this when the query ends, as its KafkaMicroBatchStream.stop closes the
        admin client the stream opened."""
        self._planning.close()
