"""foreachBatch over Spark Connect (`lagless import --master sc://host:port`).

Spark Connect runs foreachBatch in a Python process of the server: the function is pickled
there, and what it holds in this process (the sink's connection, the broker's client, the
progress bar, the stop request) cannot travel. So this process sends a recipe
(`ServerSideWriter`: the spec and what the checks found, plain data), the server's process
opens its own sink and broker and runs the very `BatchWriter` a local import runs, once per
batch, in the same process for the whole query. The two talk through a folder beside Spark's
checkpoint, which both must see at the same path (as Spark's checkpoint itself): the server
writes the running summary after each batch, this process writes a file there to ask for a
stop. An error leaves the server with its marker (exceptions.crossing_spark), which the
query's error carries back.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import threading
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lagless.exceptions import crossing_spark
from lagless.importer.plan import ImportPlan
from lagless.importer.spec import ImportSpec
from lagless.importer.write_path import WritePath
from lagless.kafka import TP, Offsets
from lagless.progress import Collector, Summary
from lagless.signals import StopFile
from lagless.source.data_loss import Lost

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lagless.importer.batch_writer import BatchWriter
    from lagless.importer.routing import Destination

log = logging.getLogger(__name__)

PROGRESS = "progress.pickle"
STOP = "stop"


@dataclass
class ServerSideWriter:
    """The foreachBatch function Spark Connect pickles: builds, on the server, the BatchWriter
    of this import on its first batch, and keeps it for the next ones."""

    spec: ImportSpec
    # Each table (its target, topics, decoding and what its ledger held).
    destinations: list[Destination]
    partitions: list[TP]
    lost: list[Lost]
    # The write path the import's plan decided for these tables (write_path.decide): the
    # source's options, made in the import's process, follow it.
    write_path: WritePath
    target_end: Offsets | None
    first_start: Offsets
    channel: str
    log_settings: str
    # The run's summary so far: the query may be started again (new topics: job.run_query).
    summary: Summary
    _writer: BatchWriter | None = field(default=None, repr=False)

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        with crossing_spark():
            if self._writer is None:
                self._writer = self._open()
            self._writer(records, batch_id)

    def _open(self) -> BatchWriter:
        from lagless import logs
        from lagless.importer.batch_writer import open_batch_writer
        from lagless.kafka.offset_reader import OffsetReader
        from lagless.sinks import sink_from_url

        logs.configure_from_environment(self.log_settings)
        spec = self.spec
        # Opened for the query's life, never closed here: the server ends this process when
        # the query stops.
        opened = ExitStack()
        sink = opened.enter_context(sink_from_url(spec.sink_url))
        sink.retry_s = spec.retry_seconds
        for each in self.destinations:  # idempotent: sets up what the sink keeps per target
            sink.prepare(each.target)
        reader = opened.enter_context(OffsetReader(spec.kafka, retry_s=spec.retry_seconds))
        plan = ImportPlan(
            spec, sink, reader, self.partitions, self.destinations, None, self.lost, self.write_path
        )
        writer = open_batch_writer(
            plan,
            ProgressFile(self.channel),
            self.target_end,
            self.first_start,
            opened,
            overlap=False,
        )
        writer.summary = self.summary
        writer.stop = StopFile(Path(self.channel, STOP))
        return writer.batch_function()


class ProgressFile(Collector):
    """On the server: the running summary and remaining lag after each batch, replaced whole."""

    def __init__(self, channel: str) -> None:
        self.path = Path(channel, PROGRESS)

    def batch(self, summary: Summary, lag: int) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_bytes(pickle.dumps((summary, lag)))
        os.replace(partial, self.path)


class ConnectWriter:
    """In this process: what job.py reads of a BatchWriter (summary, done, failure, stop),
    from the server's progress file; `refresh` polls it and passes a stop request on."""

    def __init__(
        self,
        plan: ImportPlan,
        collector: Collector,
        target_end: Offsets | None,
        first_start: Offsets,
    ) -> None:
        self.plan = plan
        self.collector = collector
        self.target_end = target_end
        self.first_start = first_start
        self.channel = Path(plan.spec.checkpoint, f"connect-{uuid.uuid4().hex[:12]}")
        self.channel.mkdir(parents=True)
        self.summary = Summary(skipped=sum(lost.skipped for lost in plan.lost))
        self.done = 0
        # A batch's error reaches this process inside the query's (job.stopped_by).
        self.failure: BaseException | None = None
        self.stop: threading.Event | None = None
        self._seen: Any = None

    def batch_function(self) -> ServerSideWriter:
        """The recipe for a query started now, with every table known now."""
        from lagless import logs

        plan = self.plan
        return ServerSideWriter(
            plan.spec,
            plan.destinations,
            plan.partitions,
            plan.lost,
            plan.write_path,
            self.target_end,
            self.first_start,
            str(self.channel),
            logs.settings(),
            self.summary,
        )

    # Nothing runs beside the query here (BatchWriter's overlap).
    tasks_running = False

    def drain(self) -> None:
        """Nothing runs beside the query here: the server's writer commits each batch in it."""

    def end(self) -> None:
        """Not waited for here: a fold the server's writer left under way commits at its next
        round if the server's writer lives on, else its files stay in no snapshot, which
        expiry removes, and the next import's round folds again."""

    def refresh(self) -> None:
        if self.stop is not None and self.stop.is_set():
            StopFile(Path(self.channel, STOP)).set()
        try:
            stat = Path(self.channel, PROGRESS).stat()
        except FileNotFoundError:
            return
        if (stat.st_ino, stat.st_mtime_ns) == self._seen:
            return
        self._seen = (stat.st_ino, stat.st_mtime_ns)
        self.summary, lag = pickle.loads(Path(self.channel, PROGRESS).read_bytes())
        self.done = self.summary.batches
        self.collector.batch(self.summary, lag)

    def close(self) -> None:
        shutil.rmtree(self.channel, ignore_errors=True)
