"""DescribeGroups in a child process of its own.

librdkafka's admin client aborts the whole process when a connection drops during a request to
a group's coordinator (`rd_kafka_enq_once_del_source_return: Assertion 'eonce->refcnt > 0'
failed`: librdkafka issue 4605, open in 2.16; a use-after-free in the coordinator request's
error path, fix proposed in PR 5397). `lagless serve` describes its groups every few seconds,
so a broker that went away and came back killed it (a test saw it in CI; flapping the
embedded broker under it brought it about within minutes). Here the abort takes only this
child: the caller gets "the broker did not tell" for that round, and the next request starts
a new child.

The child speaks JSON lines: the client settings first, then one request per line (a group and
a timeout), each answered by one line (the description, or null).
"""

from __future__ import annotations

import json
import logging
import select
import subprocess
import sys
import tempfile
import threading
from contextlib import suppress
from dataclasses import asdict
from typing import IO, Any

from lagless.failpoints import failpoint

log = logging.getLogger(__name__)

# How long past the request's own timeout an answer is waited for before the child is taken
# for hung and ended.
ANSWER_MARGIN_S = 5.0


class GroupDescriber:
    """Describes groups through a child process, started at the first request and again after
    one ended. Safe to call from several threads (one request at a time)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = settings
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self._lock = threading.Lock()

    def describe(self, group: str, timeout_s: float) -> dict[str, Any] | None:
        """The group as DescribeGroups tells it (plain data), or None: the broker did not tell,
        or the child ended while asking (logged)."""
        with self._lock:
            process = self._started()
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(json.dumps({"group": group, "timeout_s": timeout_s}) + "\n")
                process.stdin.flush()
                ready, _, _ = select.select([process.stdout], [], [], timeout_s + ANSWER_MARGIN_S)
                line = process.stdout.readline() if ready else ""
            except OSError:  # the child is gone: its stdin closed
                ready, line = [process.stdout], ""
            if not line:
                self._ended(group, hung=not ready)
                return None
            answer: dict[str, Any] | None = json.loads(line)
            return answer

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._stop()
            self._stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in _stop
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
            )
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(self._settings) + "\n")
            self._process.stdin.flush()
        return self._process

    def _ended(self, group: str, hung: bool) -> None:
        """The child gave no answer: it ended (its stdout closed: it may not be reaped yet,
        so it is waited for) or, hung, is ended."""
        process = self._process
        assert process is not None
        if hung:
            process.kill()
        try:
            code = process.wait(timeout=ANSWER_MARGIN_S)
        except subprocess.TimeoutExpired:  # its stdout closed, yet it lives on
            process.kill()
            code = process.wait()
        said = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            lines = [line.strip() for line in self._stderr if line.strip()]
            said = lines[-1] if lines else ""
        log.warning(
            "describing group %r: its process %s (exit %s%s); the next request starts another",
            group,
            "did not answer and was ended" if hung else "ended",
            code,
            f": {said}" if said else "",
        )
        self._stop()

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    with suppress(OSError):  # a child that died leaves a broken pipe
                        stream.close()
            if process.poll() is None:
                process.kill()
            process.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def _serve(requests: IO[str], answers: IO[str]) -> None:
    """The child: answer each request line until stdin closes."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    from lagless.kafka.cluster_info import describe_found

    settings = json.loads(requests.readline())
    admin = AdminClient(settings)
    for line in requests:
        request = json.loads(line)
        group = request["group"]
        failpoint("describe-group")
        future = admin.describe_consumer_groups([group], request_timeout=request["timeout_s"])
        try:
            answer: dict[str, Any] | None = asdict(describe_found(group, future[group].result()))
        except KafkaException:
            answer = None
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    _serve(sys.stdin, sys.stdout)
