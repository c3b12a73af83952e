"""noida-db's Kafka: a second broker, with a real group coordinator, for the tests that need
one (ListGroups, DescribeGroups, live consumer groups), started once per test session.

`noida-db start --only kafka` runs in the foreground in a session of its own (its Python
launcher starts the binary as a child: both are stopped together); it prints a harmless glibc
warning at start. The data folder is a temporary one, removed at the end.
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
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 30.0


def _binary() -> str:
    beside = Path(sys.executable).parent / "noida-db"
    found = str(beside) if beside.exists() else shutil.which("noida-db")
    if not found:
        raise RuntimeError("noida-db not found: it is a dev dependency, run scripts/setup")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NoidaKafka:
    folder: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return Path(self.folder, "log").read_text(errors="replace")

    @classmethod
    def start_new(cls) -> NoidaKafka:
        folder = tempfile.mkdtemp(prefix="lagless-noida-")
        for attempt in range(3):
            server = cls._start(folder, _free_port())
            try:
                server._wait_until_it_answers()
                return server
            except AssertionError:
                server.stop()
                # Another process may have bound the port between the probe and the start.
                if attempt == 2:
                    shutil.rmtree(folder, ignore_errors=True)
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start(cls, folder: str, port: int) -> NoidaKafka:
        with open(os.path.join(folder, "log"), "wb") as log:
            process = subprocess.Popen(
                [_binary(), "start", "--only", "kafka", "--data-dir", os.path.join(folder, "data"),
                 "--kafka-port", str(port), "--host", "127.0.0.1"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        return cls(folder, port, process)

    def _wait_until_it_answers(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"noida-db exited with {self.process.returncode}: {self.log}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.1)
                continue
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            admin.list_topics(timeout=10)
            return
        raise AssertionError(f"noida-db did not answer within {START_TIMEOUT_S} s: {self.log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
