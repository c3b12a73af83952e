"""Requests to groups' coordinators (DescribeGroups, ListConsumerGroupOffsets) in a child
process of its own, one request line for all the groups of a sampling round.

librdkafka's admin client aborts the whole process when a connection drops during a request to
a group's coordinator, or one times out (`rd_kafka_enq_once_del_source_return: Assertion
'eonce->refcnt > 0' failed`: librdkafka issue 4605, open in 2.16; a use-after-free in the
coordinator request's error path, fix proposed in PR 5397). `lagless serve` describes its
groups every few seconds, so a broker that went away and came back killed it (a test saw it in
CI; flapping the embedded broker under it brought it about within minutes); 2,000 groups'
ListConsumerGroupOffsets on a loaded machine brought it about in-process within three rounds
(and a "double free or corruption" once). Here the abort takes only this child: the caller
gets "the broker did not tell" for that round, and the next request starts a new child. One
child serves every group of a process: librdkafka sends the descriptions as one DescribeGroups
per coordinator, and the offsets as one ListConsumerGroupOffsets per group (it takes one group
per request), all in flight together; the child's CPU runs beside the caller's.

The child speaks JSON lines: the client settings first, then one request per line (the groups,
what to ask of them and a timeout), each answered by one line: each group's description (or
null), and its committed offsets (or why the broker did not tell them).
"""

from __future__ import annotations

import json
import logging
import selectors
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from lagless.failpoints import failpoint

log = logging.getLogger(__name__)

# How long past the request's own timeout an answer is waited for before the child is taken
# for hung and ended.
ANSWER_MARGIN_S = 5.0
# ListConsumerGroupOffsets requests the child has in flight at once (see _in_flight).
MOST_IN_FLIGHT = 200

Described = dict[str, dict[str, Any] | None]
CommittedOffsets = dict[str, list[tuple[str, int, int]] | str]


@dataclass(frozen=True)
class GroupsAnswer:
    """What the child found: descriptions (None: not told), committed offsets (a list of
    (topic, partition, offset), or the reason the broker did not tell them) and the metadata
    committed with them, where there is some."""

    described: Described
    offsets: CommittedOffsets
    metadata: dict[str, str] = field(default_factory=dict)


class GroupDescriber:
    """Describes groups through a child process, started at the first request and again after
    one ended. Safe to call from several threads (one request at a time)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._settings = settings
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self._lock = threading.Lock()

    def ask(
        self,
        groups: Sequence[str],
        timeout_s: float,
        describe: bool,
        offsets: bool,
        partitions: Sequence[tuple[str, int]] | None = None,
    ) -> GroupsAnswer:
        """The groups' descriptions and committed offsets, as asked: of every partition they
        committed on, or of `partitions` only (for a broker that answers "every partition"
        with none). A group the child could not ask about (it ended, logged) is described
        None, its offsets a reason."""
        wanted = list(dict.fromkeys(groups))
        if not wanted or not (describe or offsets):
            return GroupsAnswer({}, {})
        request = {
            "groups": wanted,
            "timeout_s": timeout_s,
            "describe": describe,
            "offsets": offsets,
            "partitions": None if partitions is None else list(partitions),
        }
        with self._lock:
            process = self._started()
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.flush()
                # poll(2) underneath, not select(2): a process holding more than 1,024 file
                # descriptors made select() refuse ("filedescriptor out of range").
                with selectors.DefaultSelector() as selector:
                    selector.register(process.stdout, selectors.EVENT_READ)
                    ready = bool(selector.select(timeout_s + ANSWER_MARGIN_S))
                line = process.stdout.readline() if ready else ""
            except OSError:  # the child is gone: its stdin closed
                ready, line = True, ""
            if not line:
                why = self._ended(len(wanted), hung=not ready)
                return GroupsAnswer(
                    dict.fromkeys(wanted) if describe else {},
                    dict.fromkeys(wanted, why) if offsets else {},
                )
            answer = json.loads(line)
        return GroupsAnswer(
            {group: answer["described"].get(group) for group in wanted} if describe else {},
            {
                group: found if isinstance(found, str) else [tuple(entry) for entry in found]
                for group, found in answer["offsets"].items()
            },
            answer["metadata"],
        )

    def describe(self, groups: Sequence[str], timeout_s: float) -> Described:
        """Each group as DescribeGroups tells it (plain data), or None: the broker did not
        tell, or the child ended while asking (logged)."""
        return self.ask(groups, timeout_s, describe=True, offsets=False).described

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

    def _ended(self, groups: int, hung: bool) -> str:
        """The child gave no answer: it ended (its stdout closed: it may not be reaped yet,
        so it is waited for) or, hung, is ended. Says why, in a few words."""
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
        what = "did not answer and was ended" if hung else "ended"
        log.warning(
            "asking the coordinators of %d group%s: its process %s (exit %s%s); the next "
            "request starts another",
            groups,
            "" if groups == 1 else "s",
            what,
            code,
            f": {said}" if said else "",
        )
        self._stop()
        return f"the process asking the group coordinators {what} (exit {code})"

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
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    from lagless.kafka.connection import reason
    from lagless.kafka.groups import describe_found

    settings = json.loads(requests.readline())
    admin = AdminClient(settings)
    for line in requests:
        request = json.loads(line)
        groups, timeout_s = request["groups"], request["timeout_s"]
        failpoint("describe-group")
        # Everything in flight at once, then gathered.
        described = (
            admin.describe_consumer_groups(groups, request_timeout=timeout_s)
            if request["describe"]
            else {}
        )
        named = request["partitions"]
        partitions = None if named is None else [TopicPartition(t, p) for t, p in named]

        def list_offsets(
            group: str, partitions: list[Any] | None = partitions, timeout_s: float = timeout_s
        ) -> Future[Any]:
            return admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, partitions)], request_timeout=timeout_s
            )[group]

        listed = _in_flight(groups if request["offsets"] else [], list_offsets)
        answer: dict[str, dict[str, Any]] = {"described": {}, "offsets": {}, "metadata": {}}
        for group, future in described.items():
            try:
                answer["described"][group] = asdict(describe_found(group, future.result()))
            except KafkaException:
                answer["described"][group] = None
        for group, future in listed.items():
            try:
                found = future.result()
            except KafkaException as exc:
                answer["offsets"][group] = reason(exc)
                continue
            told = [tp for tp in found.topic_partitions or [] if tp.offset >= 0 or tp.error]
            errors = [tp.error for tp in told if tp.error is not None]
            answer["offsets"][group] = (
                f"{errors[0].str()} ({len(errors)} partitions)"
                if errors
                else [(tp.topic, tp.partition, tp.offset) for tp in told]
            )
            # The group's mark where every offset carries the same one (an import commits all
            # the partitions it reads; a consumer's commit leaves none).
            marks = {tp.metadata or "" for tp in told}
            if len(marks) == 1 and "" not in marks:
                answer["metadata"][group] = marks.pop()
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _in_flight(groups: Sequence[str], ask: Callable[[str], Future[Any]]) -> dict[str, Future[Any]]:
    """ask(group) for every group, at most MOST_IN_FLIGHT at a time: a request's timeout runs
    from when it is made, so 2,000 made at once on a loaded broker timed the last ones out
    (476 of 2,000 at a load average of 25) where a window of them all got answers."""
    futures: dict[str, Future[Any]] = {}
    pending: set[Future[Any]] = set()
    for group in groups:
        if len(pending) >= MOST_IN_FLIGHT:
            _, pending = wait(pending, return_when=FIRST_COMPLETED)
        futures[group] = ask(group)
        pending.add(futures[group])
    wait(pending)
    return futures


if __name__ == "__main__":
    _serve(sys.stdin, sys.stdout)
