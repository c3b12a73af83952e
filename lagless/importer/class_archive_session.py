"""The session whose classes lagless's class archive holds (importer/class_archive.py runs
it in a process of its own, twice: `dump` writes the archive as the JVM exits, `check` starts
from it): jobs like an import's, then the JVM's pid printed."""

from __future__ import annotations

import sys
import tempfile
from typing import TYPE_CHECKING

from lagless.importer.class_archive import SILENT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def session(java_option: str) -> None:
    """Start a session with `java_option`, run jobs like an import's (the warm-up's, a batch
    read of a Python source, a stream through foreachBatch into Arrow, as the query of an
    import runs), print the JVM's pid."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from lagless.importer.spark import quiet_logging_option, spark_session
    from lagless.importer.warm_up import WarmUp
    from lagless.source.warmup import SOURCE_MODULES, TASKS_OPTION, WARM_UP_SOURCE

    spark = spark_session(
        "local[2]",
        conf={"spark.driver.extraJavaOptions": f"{quiet_logging_option()} {java_option}"},
    )
    warm_up = WarmUp(spark, SOURCE_MODULES)
    warm_up.plan_reads()
    warm_up.join()
    frame = spark.read.format(WARM_UP_SOURCE).option(TASKS_OPTION, "2").load()
    frame.toArrow()
    frame.selectExpr("task + 1 AS next").write.format("noop").mode("overwrite").save()

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        counted = Observation(f"archive_{batch_id}")
        observed = batch.observe(counted, F.expr("count_if(task = 0) AS zero"))
        observed.selectExpr("task + 1 AS next").toArrow()
        counted.get  # noqa: B018 - reading it is the point

    with tempfile.TemporaryDirectory(prefix="lagless-archive-") as checkpoint:
        stream = spark.readStream.format(WARM_UP_SOURCE).option(TASKS_OPTION, "2").load()
        writer = stream.writeStream.foreachBatch(each_batch).option(
            "checkpointLocation", checkpoint
        )
        writer.trigger(availableNow=True).start().awaitTermination()
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    spark.stop()
    print(pid)


def main(argv: list[str]) -> int:
    step, archive = argv
    option = "-XX:ArchiveClassesAtExit" if step == "dump" else "-XX:SharedArchiveFile"
    session(f"{option}={archive} {SILENT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
