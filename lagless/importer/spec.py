"""What an import is asked to do (ImportSpec), and every check of it before anything is written."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from lagless.cdc.schema_change import SCHEMA_CHANGES as SCHEMA_CHANGES
from lagless.cdc.schema_change import SchemaChanges
from lagless.exceptions import BadInput
from lagless.importer.routing import (
    TableTemplate,
)
from lagless.importer.write_path import WriteOptions
from lagless.kafka import TP
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.retry import DEFAULT_RETRY_S
from lagless.sinks import Sink, Target
from lagless.sinks.base import (
    Deletes,
    ValueFormat,
    WriteMode,
)
from lagless.sinks.maintenance import DEFAULT_KEEP_HISTORY_S, DEFAULT_TARGET_FILE_SIZE, Policy
from lagless.sinks.url import absolute

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)
# The fewest records the planner puts in a piece of a range (planner/split.py): a remainder
# smaller joins the piece before it. Each piece starts a fetch at a new offset, which a broker
# may take half a second to answer (Tansu on a 30M-record topic): a small first batch's
# remainders of 375 records, packed into one task, held the batch for 2.4 s. Four imports each
# of that topic: 32.9-35.5 s launch to exit with pieces of any size, 30.6-34.7 s with this.
MIN_TASK_RECORDS = 1000

RunMode = Literal["bulk", "continuous"]

# Seconds between maintenance rounds of an import (importer/maintenance.py).
DEFAULT_MAINTAIN_EVERY_S = 10.0

# Task slots per Spark core: a little more than one keeps a core busy while a task starts.
SLOTS_PER_CORE = 2


def slots_for(parallelism: int) -> int:
    return max(2, parallelism * SLOTS_PER_CORE)


@dataclass(frozen=True)
class BatchSettings:
    """What of the options the BatchWriter reads (ImportSpec.batch_settings), decided once and
    passed down: the writer sees these values, not the options."""

    checkpoint: str
    mode: RunMode
    trigger_seconds: float
    fail_on_data_loss: bool
    schema_changes: SchemaChanges
    max_record_bytes: int | None
    # Where the tasks write a mirror's change files (ImportSpec.changes_folder).
    changes_folder: str


@dataclass(frozen=True)
class ImportSpec:
    kafka: KafkaConfig
    topics: tuple[str, ...]
    sink_url: str
    checkpoint: str
    # A table, or a template of one per topic (routing.py: `{topic}`, `{schema}`, `{table}`).
    table: str | None = None
    write: WriteMode = "append"
    mode: RunMode = "bulk"
    value_format: ValueFormat = "raw"
    max_records_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    slots: int | None = None
    trigger_seconds: float = 0.5
    fail_on_data_loss: bool = True
    # A Debezium mirror's change of a column it cannot follow (cdc/schema_change.py): evolve
    # stops that table, fail the import.
    schema_changes: SchemaChanges = "evolve"
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
    # Spark settings (--spark-conf), set after lagless's own: spark.archives ships lagless.
    spark_conf: tuple[tuple[str, str], ...] = ()
    # The executors see the driver's filesystem at the same paths (--shared-disk).
    shared_disk: bool = False
    # Every topic whose whole name matches this regular expression, now and while the import
    # runs (Spark's subscribePattern); in place of `topics`.
    topic_pattern: str | None = None
    # Table maintenance between batches (importer/maintenance.py): files merged up to this
    # size, versions kept this long, a round at most this often (0: none).
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    keep_history_s: float = DEFAULT_KEEP_HISTORY_S
    maintain_every_s: float = DEFAULT_MAINTAIN_EVERY_S
    # Debezium: the mirror's own columns (_op, _source_ts_ms, _lsn); deletes kept as _deleted.
    cdc_columns: bool = False
    deletes: Deletes = "hard"

    @property
    def routed(self) -> bool:
        """Whether each topic goes to the table the template names for it (routing.py)."""
        if self.topic_pattern is not None:
            return True
        return self.table is not None and bool(TableTemplate.parse(self.table).names)

    @property
    def waits_for_topics(self) -> bool:
        """A continuous mirror starts like a service, before Debezium sent anything: a topic
        it names that does not exist yet is waited for, as one that is still empty."""
        return self.mode == "continuous" and self.value_format == "debezium"

    @property
    def subscription(self) -> tuple[tuple[str, ...], str | None]:
        """(topics, pattern) the import reads: a mirror that waits for its topics subscribes
        to their names as a pattern, which matches them once they exist."""
        if self.topic_pattern is None and self.waits_for_topics:
            return (), "|".join(re.escape(topic) for topic in self.topics)
        return self.topics, self.topic_pattern

    def partitions(self, reader: OffsetReader) -> list[TP]:
        """The partitions the import reads now."""
        return reader.cluster.partitions(*self.subscription)

    @property
    def one_topic_per_table(self) -> bool:
        """A routed table of rows by key (a mirror, an upsert) takes one topic's records:
        two sources' rows would overwrite and delete each other's (routing.route)."""
        return self.routed and (self.value_format == "debezium" or self.write == "upsert")

    @property
    def template(self) -> TableTemplate:
        return TableTemplate.parse(self.table or "{topic}")

    @property
    def maintenance_policy(self) -> Policy:
        return Policy(self.target_file_size, self.keep_history_s)

    def target(self, sink: Sink) -> Target:
        """The one table of an import that is not routed, before its value's columns are
        known (plan.target_for gives them)."""
        if self.table is None and len(self.topics) != 1:
            raise BadInput(
                "importing several topics needs --table: one table, or a table per topic "
                "with --table '{topic}'"
            )
        return Target(
            sink.table_name(self.table or self.topics[0]),
            self.write,
            self.value_format,
            None,
            self.key_fields,
            run_id=self.run_id,
            deletes=self.deletes,
            schema_registry=self.schema_registry,
        )

    @property
    def run_id(self) -> str:
        """What tells this import's staging folders and locks from another's (Target.run_id):
        a digest of its checkpoint's path, the same on every rerun."""
        return hashlib.sha256(os.path.abspath(self.checkpoint).encode()).hexdigest()[:12]

    @property
    def changes_folder(self) -> str:
        """Where the source's tasks write a mirror's change files (change_files.py)."""
        return os.path.join(os.path.abspath(self.checkpoint), "changes")

    @property
    def write_options(self) -> WriteOptions:
        """What of the options the write path depends on (write_path.decide)."""
        return WriteOptions(
            self.max_record_bytes,
            self.dead_letter_topic,
            self.routed,
            self.master,
            self.shared_disk,
            self.changes_folder,
        )

    @property
    def batch_settings(self) -> BatchSettings:
        """What of the options the BatchWriter reads."""
        return BatchSettings(
            self.checkpoint,
            self.mode,
            self.trigger_seconds,
            self.fail_on_data_loss,
            self.schema_changes,
            self.max_record_bytes,
            self.changes_folder,
        )

    def with_absolute_paths(self) -> ImportSpec:
        """The checkpoint and a local store's path made absolute (the same places)."""
        return replace(
            self, checkpoint=os.path.abspath(self.checkpoint), sink_url=absolute(self.sink_url)
        )
