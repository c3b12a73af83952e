"""The Spark session lagless runs in, with the Kafka source registered."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Iterator, Mapping
from importlib import resources
from typing import TYPE_CHECKING

from lagless.exceptions import BadInput
from lagless.first_line import first_line
from lagless.importer.cluster import master_url
from lagless.logs import child_output_to_log, log_file, spark_log_level
from lagless.signals import kept_handlers
from lagless.source.worker_python import ARCHIVES, EXECUTOR_PYTHON, archive_alias

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


DRIVER_PYTHON = "PYSPARK_DRIVER_PYTHON"
# The JVM's optimizing compiler (C2) pays off where records pass through the JVM (typed columns,
# upserts, stores written from the driver: a typed import ran 1.6x longer without it). Where the
# source's tasks write the records themselves, the driver's JVM only plans batches, and C2's
# compiling at start-up cost an import of 20,000 records 1.4 s of its 8.0 s on 2 cores.
QUICK_START_JIT = "-XX:TieredStopAtLevel=1"
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


CONNECT_SCHEME = "sc://"


def is_connect(master: str | None) -> bool:
    """`sc://host:port`: a Spark Connect server runs the import (importer/connect_writer.py)."""
    return master_url(master).startswith(CONNECT_SCHEME)


def is_remote(spark: SparkSession) -> bool:
    """A Spark Connect session: no JVM in this process, no SparkContext, no py4j."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_session(
    master: str | None = None,
    parallelism: int | None = None,
    conf: Mapping[str, str] | None = None,
    records_in_jvm: bool = True,
) -> SparkSession:
    """A session on `master` (cluster.master_url): a Spark Connect session for sc://; `conf`
    is set after lagless's own settings, so it may override them. `records_in_jvm=False`: the
    driver's JVM moves no records (QUICK_START_JIT)."""
    master = master_url(master)
    if is_connect(master):
        return connect_session(master)
    require_java()
    conf = dict(conf or {})
    shipped = os.environ.get("PYSPARK_PYTHON")
    if shipped and archive_alias(shipped, conf.get(ARCHIVES)) is not None:
        # Spark's recipe for a packed environment (PYSPARK_PYTHON=./env/bin/python): that
        # Python exists only in each executor's folder. Their tasks get it this way; the
        # Python processes Spark starts on the driver (the source's planning) run this one.
        conf.setdefault(EXECUTOR_PYTHON, shipped)
        os.environ["PYSPARK_PYTHON"] = sys.executable
    # Workers must run this interpreter, or they miss lagless and its dependencies.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from lagless.source import KafkaDataSource
    from lagless.source.warmup import WarmUpSource

    builder = (
        SparkSession.builder.appName("lagless")
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", os.environ.get("LAGLESS_DRIVER_MEMORY", "2g"))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", driver_java_options(records_in_jvm))
        .config("spark.executor.extraJavaOptions", quiet_logging_option())
        .config("spark.sql.shuffle.partitions", str(parallelism or 4))
        .config("spark.sql.streaming.stopTimeout", "60s")
        .config("spark.python.worker.reuse", "true")
        # This process and its Python workers talk to the JVM over Unix sockets, not local TCP
        # ports: Spark's thread serving a toArrow() dies on a connection that fails its secret
        # check and leaves the call waiting forever (SocketAuthServer completes its result only
        # after the check). A client reconnecting to a port that Spark took over (librdkafka's,
        # to a broker gone) hung an import that way.
        .config("spark.python.unix.domain.socket.enabled", "true")
    )
    if parallelism:
        builder = builder.config("spark.default.parallelism", str(parallelism))
    for key, value in conf.items():
        builder = builder.config(key, value)
    # SparkContext installs a SIGINT handler of its own: lagless's are kept (signals.py).
    with kept_handlers(), _jvm_ended_if_interrupted():
        with child_output_to_log(), _no_python_data_source_lookup():
            spark = builder.getOrCreate()
        spark.dataSource.register(KafkaDataSource)
        spark.dataSource.register(WarmUpSource)
    _query_context_to_log()
    _accumulator_errors_to_log(spark)
    return spark


def _accumulator_errors_to_log(spark: SparkSession) -> None:
    """PySpark's accumulator server (a thread of this process the JVM sends task updates to)
    prints a traceback on stderr when the JVM drops its connection mid-update: a stop that
    signals the process group ends the JVM first. Told in lagless's log instead (exit codes
    and the one-line stop are the run's, exceptions.py)."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is None:
        return

    def logged(request: object, client_address: object) -> None:
        error = sys.exc_info()[1]
        log.debug("Spark's accumulator updates ended: %s", first_line(error or "no error"))

    server.handle_error = logged


# PySpark logs each SQL error it captures with a query context (an analysis error) on stderr,
# as JSON, through handlers of its own. lagless says an error in one line (exceptions.py): the
# record goes to lagless's log instead.
QUERY_CONTEXT_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def _query_context_to_log() -> None:
    from pyspark.logger import PySparkLogger

    handlers = logging.getLogger().handlers or [logging.NullHandler()]
    for name in QUERY_CONTEXT_LOGGERS:
        logger = PySparkLogger.getLogger(name)
        for each in list(logger.handlers):
            logger.removeHandler(each)
        for handler in handlers:  # logging's own addHandler: PySpark's sets its JSON format
            logging.Logger.addHandler(logger, handler)


def driver_java_options(records_in_jvm: bool = True) -> str:
    from lagless.importer.class_archive import java_options

    quick_start = "" if records_in_jvm else QUICK_START_JIT
    return " ".join(filter(None, (quiet_logging_option(), java_options(), quick_start)))


@contextlib.contextmanager
def _jvm_ended_if_interrupted() -> Iterator[None]:
    """A stop (SIGINT, SIGTERM) while Spark's JVM starts ends the JVM too. It ends by itself
    when this process does only once its gateway is up (it waits for its stdin to close);
    one interrupted before, its connection file removed by PySpark on the way out, was seen
    to stay, an orphan, for good."""
    before = set(_children())
    try:
        yield
    except KeyboardInterrupt:
        for pid in set(_children()) - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        raise


def _children() -> list[int]:
    """This process's children (Linux's /proc; none elsewhere)."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == os.getpid():
            found.append(int(stat.split("/")[2]))
    return found


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


def connect_session(url: str) -> SparkSession:
    """A session of the Spark Connect server at `url`, with the sources registered there (the
    server's Python workers must import lagless). One that does not answer is bad input, as an
    unreachable broker at the start is."""
    from pyspark.sql import SparkSession

    try:
        import pyspark.sql.connect.session  # noqa: F401 - fails without the client's packages
    except ImportError as exc:
        raise BadInput(
            f"--master {url} needs Spark Connect's client: pip install 'lagless[connect]' "
            f"({first_line(exc)})"
        ) from None
    from lagless.source import KafkaDataSource
    from lagless.source.warmup import WarmUpSource

    # A server that is down would be retried for about a minute by the client's default
    # policy: asked once here, with a short deadline, before anything else.
    _require_answer(url)
    spark = SparkSession.builder.remote(url).getOrCreate()
    try:
        spark.dataSource.register(KafkaDataSource)
        spark.dataSource.register(WarmUpSource)
    except Exception as exc:
        raise BadInput(
            f"the Spark Connect server at {url} cannot register lagless's source: {first_line(exc)}"
        ) from None
    return spark


def _require_answer(url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 15002), timeout=5):
            pass
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BadInput(f"the Spark Connect server at {url} does not answer: {reason}") from None


def parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism: the SparkContext's, or, over Spark Connect (which has
    none), the partitions the server gives a range by default."""
    if not is_remote(spark):
        return int(spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    ids = spark.range(1024).select(F.spark_partition_id().alias("p")).distinct()
    return max(1, ids.count())
