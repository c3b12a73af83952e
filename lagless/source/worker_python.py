"""Spark runs the source in Python workers of their own interpreter (PYSPARK_PYTHON, else
`python3` from PATH). One that cannot import lagless fails in the worker, thirty lines deep:
checked once on the driver instead, when the source is registered.

A worker Python shipped in spark.archives (`./env/bin/python` with `spark.archives
ENV.tar.gz#env`: README, Cluster deployment) exists only in each executor's folder, once Spark
has unpacked the archive there: then a small job asks the executors themselves. The executors'
tasks take it from spark.sql.execution.pyspark.python (EXECUTOR_PYTHON); the Python processes
Spark starts on the driver (the source's planning) run PYSPARK_PYTHON, the driver's own."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from pathlib import PurePosixPath

from lagless.exceptions import BadInput
from lagless.first_line import first_line
from lagless.source import executor_probe

CHECK_TIMEOUT_S = 60
ARCHIVES = "spark.archives"
# The Python of the executors' SQL tasks (the source's reads, mapInArrow); Spark falls back to
# spark.pyspark.python, then to PYSPARK_PYTHON as the driver saw it.
EXECUTOR_PYTHON = "spark.sql.execution.pyspark.python"

log = logging.getLogger(__name__)


def check_worker_python() -> None:
    """On the driver: the interpreter Spark gives its Python workers imports lagless. Does
    nothing in a worker (no SparkContext there) or when it is this interpreter."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return
    conf = context.getConf()
    executable = conf.get(EXECUTOR_PYTHON) or conf.get("spark.pyspark.python") or context.pythonExec
    if archive_alias(executable, conf.get(ARCHIVES)) is None:
        check_imports_lagless(executable)
    else:
        check_executors_import_lagless(context.applicationId, executable)


def archive_alias(executable: str, archives: str | None) -> str | None:
    """The alias of the spark.archives entry `executable` is inside (`env` for ./env/bin/python
    and `ENV.tar.gz#env`); None when it is not a relative path into one."""
    if not archives or os.path.isabs(executable):
        return None
    first = PurePosixPath(executable).parts[0]
    for entry in archives.split(","):
        path, _, alias = entry.strip().partition("#")
        if first == (alias or PurePosixPath(path).name):
            return first
    return None


@functools.cache
def check_executors_import_lagless(application: str, executable: str) -> None:
    """BadInput, in one line, unless a task on the executors imports lagless with
    `executable`; logs where it found it."""
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    tasks = max(1, spark.sparkContext.defaultParallelism)
    cloudpickle.register_pickle_by_value(executor_probe)
    try:
        rows = (
            spark.range(tasks, numPartitions=tasks)
            .mapInArrow(executor_probe.where_lagless, executor_probe.SCHEMA)
            .collect()
        )
        found: list[str] = [row.place for row in rows]
    except Exception as exc:
        raise BadInput(
            f"Spark's executors could not run {executable!r} from {ARCHIVES} "
            f"({first_line(_java_cause(exc))}); see README, Cluster deployment"
        ) from None
    finally:
        cloudpickle.unregister_pickle_by_value(executor_probe)
    missing = [line for line in found if line.startswith(executor_probe.MISSING)]
    if missing:
        why = missing[0].removeprefix(executor_probe.MISSING)
        raise BadInput(
            f"Spark's Python workers run {executable!r} from {ARCHIVES}, which cannot import "
            f"lagless ({why}); pack an environment with lagless installed (README, Cluster "
            "deployment)"
        )
    places = sorted({line.removeprefix(executor_probe.FOUND) for line in found})
    log.info("the executors' Python (%s) imports lagless from %s", executable, ", ".join(places))


def _java_cause(exc: Exception) -> BaseException | str:
    """A py4j error's Java exception, whose first line says what failed; else the error."""
    java = getattr(exc, "java_exception", None)
    return str(java.toString()) if java is not None else exc


@functools.cache
def check_imports_lagless(executable: str) -> None:
    """BadInput, in one line, when `executable` cannot import lagless."""
    found = shutil.which(executable)
    if found is not None and os.path.abspath(found) == os.path.abspath(sys.executable):
        return
    fix = f"set PYSPARK_PYTHON to a Python that has lagless installed (e.g. {sys.executable})"
    try:
        result = subprocess.run(
            [executable, "-c", "import lagless"], capture_output=True, timeout=CHECK_TIMEOUT_S
        )
    except OSError as exc:
        raise BadInput(
            f"Spark's Python workers would run {executable!r}: {exc.strerror}; {fix}"
        ) from None
    if result.returncode != 0:
        raise BadInput(
            f"Spark's Python workers run {executable!r}, which cannot import lagless; {fix}"
        )
