"""A data source of one tiny Arrow batch per task, read to start Spark's Python workers early.

The first task of a fresh session waits about 3 s for a Python worker to start and import
pyarrow, confluent-kafka and this package, and for the JVM to load the Python data source's
classes. Reading this source while the import's query starts takes that wait off the first
batch (spark.warm_up_in_background). It lives in lagless.source so its workers import exactly
what the Kafka source's workers need.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

WARM_UP_SOURCE = "lagless-warm-up"
TASKS_OPTION = "tasks"


class WarmUpSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return WARM_UP_SOURCE

    def schema(self) -> str:
        return "task int"

    def reader(self, schema: StructType) -> DataSourceReader:
        return WarmUpReader(int(self.options.get(TASKS_OPTION, "1")))


class WarmUpReader(DataSourceReader):
    def __init__(self, tasks: int) -> None:
        self.tasks = tasks

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(task) for task in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"task": pa.array([partition.value], pa.int32())})
