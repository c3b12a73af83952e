"""What starts Spark's Python processes before an import's query needs them
(importer/warm_up.py), and a source that runs what an import's query runs without a broker.

The first task of a fresh session waits for a Python worker to start and import pyarrow,
confluent-kafka and this package. `start_worker` runs as a task of a job that needs no Python
planning (spark.range + mapInArrow), so it starts as soon as the session is up, and leaves a
worker per core with the Kafka source's modules imported: the source's tasks then take them
(Spark keys its pool of workers by interpreter and environment, which both share).

WarmUpSource, a data source of one tiny Arrow batch per task, as a batch and as a stream: its
batch read starts the process that plans a Python source's reads, and the class archive
(importer/class_archive.py) runs an import-like stream over it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

WARM_UP_SOURCE = "lagless-warm-up"
TASKS_OPTION = "tasks"
# What the Kafka source's tasks import (its reader pickles them in).
SOURCE_MODULES = ("lagless.source.datasource",)


def start_worker(
    modules: Sequence[str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A mapInArrow task: import `modules` in this worker, hand the rows back."""
    for module in modules:
        importlib.import_module(module)
    yield from batches


class WarmUpSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return WARM_UP_SOURCE

    def schema(self) -> str:
        return "task int"

    def reader(self, schema: StructType) -> DataSourceReader:
        return WarmUpReader(int(self.options.get(TASKS_OPTION, "1")))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return WarmUpStreamReader(int(self.options.get(TASKS_OPTION, "1")))


class WarmUpReader(DataSourceReader):
    def __init__(self, tasks: int) -> None:
        self.tasks = tasks

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(task) for task in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"task": pa.array([partition.value], pa.int32())})


class WarmUpStreamReader(DataSourceStreamReader):
    """One batch of `tasks` tasks, then nothing new."""

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks

    def initialOffset(self) -> dict[str, Any]:
        return {"batches": 0}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        return {"batches": 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return [InputPartition(task) for task in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"task": pa.array([partition.value], pa.int32())})
