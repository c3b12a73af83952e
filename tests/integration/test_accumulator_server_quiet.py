"""A JVM that drops its connection to PySpark's accumulator server mid-update (a stop that
signals the import's process group ends the JVM first) leaves no traceback on stderr: the
error goes to lagless's log (importer/spark.py). Real Spark; the dropped connection is made
by hand on the server's own socket, as a dying JVM leaves it."""

from __future__ import annotations

import logging
import socket
import struct
import time

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
    address = server.server_address
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    capfd.readouterr()
    try:
        with socket.socket(family, socket.SOCK_STREAM) as conn:
            conn.connect(address)
            if server.auth_token is not None:
                conn.sendall(server.auth_token.encode())
            conn.sendall(struct.pack("!i", 3))  # three updates announced, then the JVM is gone
        deadline = time.monotonic() + 30  # the server thread, on a loaded machine
        while not any("updates ended" in m for m in kept.messages) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        logger.removeHandler(kept)
        logger.setLevel(level)
    assert any(m.startswith("Spark's accumulator updates ended") for m in kept.messages)
    assert "Traceback" not in capfd.readouterr().err
