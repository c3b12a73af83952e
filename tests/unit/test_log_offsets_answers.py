"""How a broker's ListOffsets answers are read (kafka/log_offsets.py): by time, -1 is the answer
"no record at or after it"; any other negative offset is no answer (librdkafka leaves -1001 where
a broker stopped answering mid-request) and is asked again, never taken for "every record is
older" (an import from a time would then start at the log's end). A fake admin client stands in
for the broker: the answers it gives are what is under test."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaException

from lagless.kafka.log_offsets import LogOffsets


class _Answers:
    """An admin client whose list_offsets gives each partition the next of its answers."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.asked = 0

    def list_offsets(self, request: dict[Any, Any], **_: Any) -> dict[Any, Future[Any]]:
        self.asked += 1
        offset = self.answers.pop(0)
        futures = {}
        for tp in request:
            done: Future[Any] = Future()
            done.set_result(SimpleNamespace(offset=offset))
            futures[tp] = done
        return futures


class _Connection:
    def __init__(self, admin: _Answers) -> None:
        self.admin = admin
        self.timeout_s = 1.0
        self.config = SimpleNamespace(read_committed=True)

    def retried(self, attempt: Any, doing: str) -> Any:
        for _ in range(5):
            try:
                return attempt()
            except KafkaException:
                continue
        raise AssertionError(f"{doing}: no answer in 5 tries")


def by_time(answers: list[int]) -> tuple[dict[Any, int | None], int]:
    admin = _Answers(answers)
    log = LogOffsets(_Connection(admin))  # type: ignore[arg-type]
    return log.offsets_for_times({("t", 0): 1_700_000_000_000}), admin.asked


def test_by_time_minus_one_means_every_record_is_older():
    assert by_time([-1]) == ({("t", 0): None}, 1)


def test_by_time_an_invalid_offset_is_no_answer_and_is_asked_again():
    assert by_time([-1001, 4]) == ({("t", 0): 4}, 2)


def test_an_offset_by_time_is_taken_as_it_is():
    assert by_time([0]) == ({("t", 0): 0}, 1)
