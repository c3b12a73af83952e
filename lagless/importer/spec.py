"""What an import is asked to do (ImportSpec), and every check of it before anything is written."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lagless.exceptions import BadInput
from lagless.importer.decode import AvroDecoding
from lagless.importer.value_schema import ValueSchema, resolve
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader, Offsets
from lagless.retry import DEFAULT_RETRY_S
from lagless.sinks import Sink, Target, check_identifier, sink_from_url
from lagless.sinks.base import TaskWriter, ValueFormat, WriteMode, check_writable_path
from lagless.source.options import RETRY_SECONDS

RunMode = Literal["bulk", "continuous"]

# Task slots per Spark core: a little more than one keeps a core busy while a task starts.
SLOTS_PER_CORE = 2


def slots_for(parallelism: int) -> int:
    return max(2, parallelism * SLOTS_PER_CORE)


@dataclass(frozen=True)
class ImportSpec:
    kafka: KafkaConfig
    topics: tuple[str, ...]
    sink_url: str
    checkpoint: str
    table: str | None = None
    write: WriteMode = "append"
    mode: RunMode = "bulk"
    value_format: ValueFormat = "raw"
    max_records_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    slots: int | None = None
    trigger_seconds: float = 0.5
    fail_on_data_loss: bool = True
    master: str | None = None
    group: str | None = None
    max_record_bytes: int | None = None
    dead_letter_topic: str | None = None
    # Milliseconds since the epoch: start at the first record this recent; in bulk mode, stop
    # before the first one that recent (Spark's startingTimestamp / endingTimestamp).
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    extra_source_options: dict[str, str] = field(default_factory=dict)
    # A Spark DDL schema, @file of one, "infer" (JSON); an Avro schema file (Avro).
    value_schema: str | None = None
    schema_registry: str | None = None
    key_fields: tuple[str, ...] = ()
    # How long a broker or database that is away is waited for (lagless/retry.py).
    retry_seconds: float = DEFAULT_RETRY_S

    def target(self, value_schema: ValueSchema | None = None) -> Target:
        if self.table is None and len(self.topics) != 1:
            raise BadInput("importing several topics needs --table")
        return Target(
            check_identifier(self.table or self.topics[0]),
            self.write,
            self.value_format,
            value_schema.fields if value_schema else None,
            self.key_fields,
        )

    def source_options(self, slots: int) -> dict[str, str]:
        options = self.kafka.source_options()
        options.update(
            {
                "kafka.bootstrap.servers": self.kafka.bootstrap,
                "subscribe": ",".join(self.topics),
                "startingOffsets": "earliest",
                "failOnDataLoss": str(self.fail_on_data_loss).lower(),
                "slots": str(slots),
                RETRY_SECONDS: str(self.retry_seconds),
            }
        )
        writer = self.executor_writer()
        if self.max_records_per_batch:
            options["maxRecordsPerBatch"] = str(self.max_records_per_batch)
        else:
            sink = sink_from_url(self.sink_url)
            # Records the source's tasks write themselves never wait in the driver's memory.
            default = Sink.max_batch_bytes if writer is not None else sink.max_batch_bytes
            options["maxBytesPerBatch"] = str(self.max_bytes_per_batch or default)
            options["firstBatchMaxBytes"] = str(sink.FIRST_BATCH_MAX_BYTES)
        if self.starting_timestamp is not None:
            options["startingTimestamp"] = str(self.starting_timestamp)
        if self.ending_timestamp is not None:
            options["availableNowEndingTimestamp"] = str(self.ending_timestamp)
        if writer is not None:
            options["executorWriter"] = writer.name
            options["executorWriterConfig"] = writer.config
            if writer.secret is not None:
                options["executorWriterSecret"] = writer.secret.reveal()
        options.update(self.extra_source_options)
        return options

    def executor_writer(self) -> TaskWriter | None:
        """The store's writer for the source's tasks, when they may write records themselves:
        no record can be rejected (raw values, no size limit), none goes to a dead-letter topic,
        nothing needs Spark's rows (append). Else None: rows go through Spark."""
        target = self.target()
        if (
            target.value_format != "raw"
            or target.mode != "append"
            or self.max_record_bytes is not None
            or self.dead_letter_topic is not None
        ):
            return None
        return sink_from_url(self.sink_url).executor_writer(target)


@dataclass
class Checked:
    """What validation found, so the run does not ask the broker twice."""

    sink: Sink
    target: Target
    broker: OffsetReader
    partitions: list[tuple[str, int]]
    avro: AvroDecoding | None = None


def check(spec: ImportSpec) -> Checked:
    """Every bad-input check, before anything is written to the sink or the checkpoint."""
    spec.target()  # the table name, before anything is asked of the broker
    sink = sink_from_url(spec.sink_url)
    check_writable_path(spec.checkpoint, "checkpoint directory", folder=True)
    broker = OffsetReader(spec.kafka, retry_s=spec.retry_seconds)
    partitions = broker.partitions(spec.topics)
    if spec.dead_letter_topic is not None:
        if spec.dead_letter_topic in spec.topics:
            raise BadInput(f"--dead-letter-topic {spec.dead_letter_topic!r} is being imported")
        broker.partitions([spec.dead_letter_topic])
    value_schema = resolve(spec, partitions)
    target = spec.target(value_schema)
    sink.check(target)
    return Checked(sink, target, broker, partitions, value_schema.avro)


def timestamp_offsets(checked: Checked, ms: int, low: Offsets, high: Offsets) -> Offsets:
    """Each partition's first offset at or after ms, else its high offset."""
    found = checked.broker.offsets_for_times(dict.fromkeys(high, ms), high)
    resolved = {}
    for tp, h in high.items():
        offset = found.get(tp)
        resolved[tp] = h if offset is None else min(max(offset, low[tp]), h)
    return resolved
