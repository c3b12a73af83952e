"""noida-db's Kafka for the scenarios: a broker with a real group coordinator (the embedded
broker answers no DescribeGroups), started in a temporary folder and stopped with it.

noida-db is a dev dependency (scripts/setup installs it into .venv); the demo finds it beside
the running Python, then on PATH, and says in one line how to install it when it is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka.admin import AdminClient

from lagless.exceptions import BadInput, TransientError

START_TIMEOUT_S = 30.0


def noida_binary() -> str:
    beside = Path(sys.executable).parent / "noida-db"
    found = str(beside) if beside.exists() else shutil.which("noida-db")
    if not found:
        raise BadInput(
            "the scenarios need noida-db (a Kafka broker with a group coordinator): "
            "pip install noida-db, or run scripts/setup in a clone"
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def noida_kafka() -> Iterator[str]:
    """A running noida-db Kafka; yields its bootstrap address."""
    folder = tempfile.mkdtemp(prefix="lagless-scenario-broker-")
    port = _free_port()
    log_path = os.path.join(folder, "log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [noida_binary(), "start", "--only", "kafka", "--data-dir", os.path.join(folder, "data"),
             "--kafka-port", str(port), "--host", "127.0.0.1"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        _wait_until_it_answers(process, port, log_path)
        yield f"127.0.0.1:{port}"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _wait_until_it_answers(process: subprocess.Popen[bytes], port: int, log_path: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = Path(log_path).read_text(errors="replace").strip().splitlines()[-1:]
            raise TransientError(f"noida-db exited with {process.returncode}: {' '.join(tail)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                pass
        except OSError:
            time.sleep(0.1)
            continue
        # The port opens before the Kafka protocol answers.
        AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
        return
    raise TransientError(f"noida-db did not answer on port {port} within {START_TIMEOUT_S:g} s")
