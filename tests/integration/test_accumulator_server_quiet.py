"""A JVM that drops its connection to PySpark's accumulator server mid-update (a stop that
signals the import's process group ends the JVM first) leaves no traceback on stderr: the
error goes to lagless's log (importer/spark.py). Real Spark; the server's error path is taken by
hand (a connection of the test's own would wait behind the JVM's)."""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.spark


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_dropped_accumulator_connection_is_logged_not_printed(spark, capfd) -> None:
    # A handler on the logger itself, not caplog's on the root: what it receives does not
    # depend on how the tests before this one in the process left logging (logs.py).
    logger = logging.getLogger("lagless.importer.spark")
    kept = Kept()
    level = logger.level
    logger.addHandler(kept)
    logger.setLevel(logging.DEBUG)
    server = spark.sparkContext._accumulatorServer
    capfd.readouterr()
    # The server serves one connection at a time, and once a job ran, Spark's JVM holds it:
    # a connection made here would wait behind it. The server's own error path is taken
    # instead, as socketserver takes it when a handler's read meets the JVM's end.
    try:
        try:
            raise EOFError  # what the handler's read of an announced update meets
        except EOFError:
            server.handle_error(None, server.server_address)
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
    assert any(m.startswith("Spark's accumulator updates ended") for m in kept.messages)
    assert "Traceback" not in capfd.readouterr().err
