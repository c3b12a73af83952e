"""A Spark Connect server (pyspark's own, `org.apache.spark.sql.connect.service.SparkConnectServer`)
for the tests and the bench: `lagless import --master sc://127.0.0.1:PORT`.

It runs in the foreground (spark-submit execs the JVM, so the process is the server) on a free
port bound to 127.0.0.1, with PYSPARK_PYTHON set to this interpreter so that its Python workers
(the source's tasks, foreachBatch) import lagless; its log goes to a temporary folder, removed
when it stops.
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

START_TIMEOUT_S = 180.0
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class ConnectServer:
    folder: str
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return Path(self.folder, "server.log").read_text(errors="replace")

    @classmethod
    def start_new(cls, cores: int = 2) -> ConnectServer:
        folder = tempfile.mkdtemp(prefix="lagless-connect-")
        for attempt in range(3):
            server = cls._start(folder, _free_port(), cores)
            try:
                server._wait_until_it_answers()
                return server
            except RuntimeError:
                server.stop()
                if attempt == 2 or "BindException" not in server.log:
                    shutil.rmtree(folder, ignore_errors=True)
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start(cls, folder: str, port: int, cores: int) -> ConnectServer:
        from lagless.importer.spark import quiet_logging_option

        env = {
            **os.environ,
            "SPARK_HOME": str(_spark_home()),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "LAGLESS_LOG_FILE": str(Path(folder, "lagless.log")),
        }
        conf = {
            "spark.master": f"local[{cores}]",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(port),
            "spark.ui.enabled": "false",
            "spark.driver.memory": "1g",
            "spark.sql.shuffle.partitions": str(cores),
            "spark.python.worker.reuse": "true",
            "spark.driver.extraJavaOptions": quiet_logging_option(),
        }
        command = [str(_spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        command.append("spark-internal")
        with open(Path(folder, "server.log"), "ab") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=folder,
                start_new_session=True,
            )
        return cls(folder, port, process)

    def _wait_until_it_answers(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Spark Connect server exited:\n{self.log[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"the Spark Connect server did not answer:\n{self.log[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to the server's process group (the JVM and its Python workers), SIGKILL if it
        lingers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


if __name__ == "__main__":  # a server by hand: prints its URL, runs until Ctrl-C
    running = ConnectServer.start_new()
    print(running.url, running.folder, flush=True)
    try:
        running.process.wait()
    except KeyboardInterrupt:
        running.destroy()
