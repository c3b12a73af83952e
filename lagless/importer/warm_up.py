"""What an import's first batch would otherwise wait for, started while its query starts.

On a fresh session the first batch waits for Spark to start Python processes: a worker per core
(which imports pyarrow, confluent-kafka and lagless) and the process that plans a Python
source's reads. Started here in the background, they are up by the time the query needs them
(source/warmup.py tells how).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from lagless.source.warmup import TASKS_OPTION, WARM_UP_SOURCE, start_worker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class WarmUp:
    """Started as soon as the session is up: a Python worker per core, importing `modules`.
    `plan_reads()`, once the query's source is loaded (its planning processes are then up and
    idle): the process that plans a Python source's reads. A failure only means the first batch
    starts them itself, so it is not reported."""

    def __init__(self, spark: SparkSession, modules: Sequence[str]) -> None:
        self.spark = spark
        self.modules = tuple(modules)
        self._threads = [_background(self.start_workers)]

    def plan_reads(self) -> None:
        self._threads.append(_background(self.start_planner))

    def join(self) -> None:
        for thread in self._threads:
            thread.join()

    def start_workers(self) -> None:
        with contextlib.suppress(Exception):
            tasks = self.spark.sparkContext.defaultParallelism
            rows = self.spark.range(tasks, numPartitions=tasks)
            started = rows.mapInArrow(functools.partial(start_worker, self.modules), "id long")
            started.write.format("noop").mode("overwrite").save()

    def start_planner(self) -> None:
        # Planned, not run (no task takes a slot): Spark keeps the process that planned it
        # for the query's first batch.
        with contextlib.suppress(Exception):
            frame = self.spark.read.format(WARM_UP_SOURCE).option(TASKS_OPTION, "1").load()
            frame.rdd.getNumPartitions()


def _background(work: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=work, name=f"lagless-warm-up-{work.__name__}", daemon=True)
    thread.start()
    return thread
