"""The Spark session lagless runs in, with the Kafka source registered."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import TYPE_CHECKING

from lagless.exceptions import BadInput
from lagless.logs import child_output_to_log, log_file, spark_log_level

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


DRIVER_PYTHON = "PYSPARK_DRIVER_PYTHON"
NO_LOOKUP = "lagless-looks-up-no-python-data-source"


def require_java() -> None:
    java_home = os.environ.get("JAVA_HOME")
    if not shutil.which("java") and not (
        java_home and os.path.exists(os.path.join(java_home, "bin", "java"))
    ):
        raise BadInput(
            "Java 17 is needed for Spark and was not found: apt-get install openjdk-17-jre-headless"
        )


def quiet_logging_option() -> str:
    """Spark's log into lagless's log file (logs.py), quiet unless lagless logs at debug."""
    log_config = resources.files("lagless.importer").joinpath("log4j2.properties")
    option = (
        f"-Dlog4j2.configurationFile=file:{log_config} -Dlagless.spark.level={spark_log_level()}"
    )
    where = log_file()
    if where and " " not in where:
        option += f" -Dlagless.log.file={where}"
    return option


def spark_session(
    master: str | None = None,
    parallelism: int | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A session on `master` (default: LAGLESS_SPARK_MASTER, else local[*]); `conf` is set
    after lagless's own settings, so it may override them."""
    require_java()
    # Workers must run this interpreter, or they miss lagless and its dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from lagless.importer.class_archive import java_options
    from lagless.source import KafkaDataSource
    from lagless.source.warmup import WarmUpSource

    builder = (
        SparkSession.builder.appName("lagless")
        .master(master or os.environ.get("LAGLESS_SPARK_MASTER", "local[*]"))
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", os.environ.get("LAGLESS_DRIVER_MEMORY", "2g"))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"{quiet_logging_option()} {java_options()}")
        .config("spark.executor.extraJavaOptions", quiet_logging_option())
        .config("spark.sql.shuffle.partitions", str(parallelism or 4))
        .config("spark.sql.streaming.stopTimeout", "60s")
        .config("spark.python.worker.reuse", "true")
    )
    if parallelism:
        builder = builder.config("spark.default.parallelism", str(parallelism))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    with child_output_to_log(), _no_python_data_source_lookup():
        spark = builder.getOrCreate()
    spark.dataSource.register(KafkaDataSource)
    spark.dataSource.register(WarmUpSource)
    return spark


@contextlib.contextmanager
def _no_python_data_source_lookup() -> Iterator[None]:
    """While the JVM is launched: the first source registered in a JVM makes it look for Python
    data sources installed as packages, in a Python process of its own, before the query can
    start (half a second to seconds here); lagless registers its own and uses no other. The
    JVM reads PYSPARK_DRIVER_PYTHON for that lookup only (the driver is this process, workers
    run PYSPARK_PYTHON), and skips the lookup when it names no command."""
    saved = os.environ.get(DRIVER_PYTHON)
    os.environ[DRIVER_PYTHON] = NO_LOOKUP
    try:
        yield
    finally:
        if saved is None:
            del os.environ[DRIVER_PYTHON]
        else:
            os.environ[DRIVER_PYTHON] = saved
