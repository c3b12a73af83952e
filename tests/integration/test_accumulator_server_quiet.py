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


def test_a_dropped_accumulator_connection_is_logged_not_printed(spark, capfd, caplog) -> None:
    server = spark.sparkContext._accumulatorServer
    address = server.server_address
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG, logger="lagless.importer.spark"):
        with socket.socket(family, socket.SOCK_STREAM) as conn:
            conn.connect(address)
            if server.auth_token is not None:
                conn.sendall(server.auth_token.encode())
            conn.sendall(struct.pack("!i", 3))  # three updates announced, then the JVM is gone
        deadline = time.monotonic() + 10
        while "accumulator updates ended" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "Spark's accumulator updates ended" in caplog.text
    assert "Traceback" not in capfd.readouterr().err
