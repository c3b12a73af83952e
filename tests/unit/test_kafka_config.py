"""The range reader's fetch bound (kafka/config.py READER_FETCH_BYTES) against the user's
librdkafka settings: checked by librdkafka itself (from_options builds a consumer)."""

from __future__ import annotations

import pytest

from lagless.exceptions import BadInput
from lagless.kafka.config import READER_FETCH_BYTES, KafkaConfig


def test_a_reader_fetches_one_partition_s_bound_at_a_time() -> None:
    assert KafkaConfig("127.0.0.1:9").reader()["fetch.max.bytes"] == READER_FETCH_BYTES


@pytest.mark.parametrize(
    "key", ["message.max.bytes", "fetch.message.max.bytes", "max.partition.fetch.bytes"]
)
def test_a_raised_bound_raises_the_reader_s_fetch(key: str) -> None:
    # librdkafka refuses a consumer whose fetch.max.bytes is under message.max.bytes: this
    # would be a BadInput if the reader kept its own bound.
    config = KafkaConfig.from_options("127.0.0.1:9", {key: "5000000"})

    assert config.reader()["fetch.max.bytes"] == 5_000_000


def test_the_user_s_fetch_max_bytes_is_taken_as_given() -> None:
    config = KafkaConfig.from_options("127.0.0.1:9", {"fetch.max.bytes": "3000000"})

    assert config.reader()["fetch.max.bytes"] == "3000000"


def test_a_bound_librdkafka_cannot_read_is_named_by_librdkafka() -> None:
    with pytest.raises(BadInput, match=r"message\.max\.bytes"):
        KafkaConfig.from_options("127.0.0.1:9", {"message.max.bytes": "lots"})


def test_sampling_fetches_every_partition_at_once_beyond_a_reader_s_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lagless.kafka import records

    built: list[dict[str, object]] = []

    class Refused(Exception):
        pass

    def consumer(settings: dict[str, object]) -> None:
        built.append(settings)
        raise Refused  # the settings are what is asserted; no broker is asked

    monkeypatch.setattr(records, "Consumer", consumer)
    with pytest.raises(Refused):
        records.Records(KafkaConfig("127.0.0.1:9")).at({("t", 0): 0, ("t", 1): 0})

    (settings,) = built
    assert settings["max.partition.fetch.bytes"] == 4096
    assert settings["fetch.max.bytes"] == records.FEW_RECORDS_FETCH_BYTES > READER_FETCH_BYTES
