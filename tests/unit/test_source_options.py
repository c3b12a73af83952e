"""SourceOptions.parse: every option of Spark's Kafka source that lagless honours, its bad
values, an unknown option, and the librdkafka settings lagless refuses."""

from __future__ import annotations

import json
import pickle

import pytest

from lagless.exceptions import BadInput
from lagless.kafka.config import REFUSED, KafkaConfig
from lagless.secret import Secret
from lagless.source import options as o
from lagless.source.options import SourceOptions

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"}


def parse(batch: bool = False, drop: tuple[str, ...] = (), **given: str) -> SourceOptions:
    options = {k: v for k, v in BASE.items() if k not in drop}
    options.update({k.replace("__", "."): v for k, v in given.items()})
    return SourceOptions.parse(options, batch=batch)


def test_defaults_follow_spark() -> None:
    stream, batch = parse(), parse(batch=True)
    assert stream.topics == ("t",) and stream.pattern is None and stream.assign is None
    assert stream.starting == "latest" and batch.starting == "earliest"
    assert batch.ending == "latest"
    assert not stream.include_headers and stream.fail_on_data_loss
    assert stream.max_records_per_batch is None and stream.min_partitions is None
    assert stream.max_trigger_delay_s == 900
    assert stream.starting_timestamp_strategy == "latest"
    assert (stream.slots, stream.min_task_records, stream.poll_timeout_s) == (2, 1, 60)
    assert stream.min_task_bytes == 8 * 1024 * 1024 and stream.executor_writer_config == "{}"
    assert stream.executor_writer is None and stream.executor_writer_secret is None


def test_subscriptions() -> None:
    assert parse(subscribe="a, b,").topics == ("a", "b")
    assert parse(drop=("subscribe",), subscribePattern="or.*").pattern == "or.*"
    assigned = parse(drop=("subscribe",), assign='{"a": [1, 0, 1], "b": [2]}').assign
    assert assigned == {"a": (0, 1), "b": (2,)}


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"subscribePattern": "x"},
        {"assign": '{"t": [0]}'},
    ],
)
def test_exactly_one_subscription(given: dict[str, str]) -> None:
    drop = ("subscribe",) if not given else ()
    with pytest.raises(BadInput, match="exactly one of the options subscribe"):
        parse(drop=drop, **given)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("assign", "[0, 1]", "option assign must be JSON"),
        ("assign", '{"t": []}', "option assign must be JSON"),
        ("assign", '{"t": [-1]}', "option assign must be JSON"),
        ("assign", '{"t": ["0"]}', "option assign must be JSON"),
        ("subscribePattern", "(", "not a regular expression"),
    ],
)
def test_bad_subscription(name: str, value: str, says: str) -> None:
    with pytest.raises(BadInput, match=says):
        parse(drop=("subscribe",), **{name: value})


def test_offsets() -> None:
    given = parse(startingOffsets='{"t": {"0": 23, "1": -2}}', batch=True)
    assert given.starting == {"t": {"0": 23, "1": -2}}
    assert parse(startingOffsets="EARLIEST").starting == "earliest"
    ending = parse(batch=True, endingOffsets='{"t": {"0": 50, "1": -1}}').ending
    assert ending == {"t": {"0": 50, "1": -1}}


@pytest.mark.parametrize(
    ("batch", "given", "says"),
    [
        (False, {"startingOffsets": "first"}, "startingOffsets must be earliest, latest or JSON"),
        (False, {"startingOffsets": '{"t": {"0": "x"}}'}, "startingOffsets must be"),
        (False, {"startingOffsets": '{"t": {"0": -3}}'}, "at least -2"),
        (True, {"startingOffsets": "latest"}, "cannot be latest in batch queries"),
        (True, {"startingOffsets": '{"t": {"0": -1}}'}, "cannot use -1"),
        (True, {"endingOffsets": "earliest"}, "endingOffsets cannot be earliest"),
        (True, {"endingOffsets": '{"t": {"0": -2}}'}, "endingOffsets cannot be earliest"),
        (False, {"endingOffsets": "latest"}, "endingOffsets is not supported in streaming"),
        (False, {"endingTimestamp": "1"}, "endingTimestamp is not supported in streaming"),
        (
            False,
            {"endingOffsetsByTimestamp": '{"t": {"0": 1}}'},
            "endingOffsetsByTimestamp is not supported in streaming",
        ),
        (True, {"availableNowEndingTimestamp": "1"}, "not supported in batch queries"),
    ],
)
def test_bad_offsets(batch: bool, given: dict[str, str], says: str) -> None:
    with pytest.raises(BadInput, match=says):
        parse(batch=batch, **given)


def test_timestamps_and_their_precedence() -> None:
    assert parse(startingTimestamp="1000").starting_timestamps == 1000
    by_partition = parse(startingOffsetsByTimestamp='{"t": {"0": 5, "1": 6}}')
    assert by_partition.starting_timestamps == {"t": {"0": 5, "1": 6}}
    both = parse(startingTimestamp="7", startingOffsetsByTimestamp='{"t": {"0": 5}}')
    assert both.starting_timestamps == 7  # startingTimestamp wins, as in Spark
    batch = parse(batch=True, endingTimestamp="9")
    assert batch.ending_timestamps == 9
    assert parse(batch=True, endingOffsetsByTimestamp='{"t": {"0": 8}}').ending_timestamps == {
        "t": {"0": 8}
    }
    assert parse(availableNowEndingTimestamp="11").available_now_ending_timestamp == 11
    strategy = parse(startingOffsetsByTimestampStrategy="ERROR").starting_timestamp_strategy
    assert strategy == "error"


@pytest.mark.parametrize(
    ("batch", "given", "says"),
    [
        (False, {"startingTimestamp": "yesterday"}, "startingTimestamp must be milliseconds"),
        (False, {"startingTimestamp": "-5"}, "startingTimestamp must be milliseconds"),
        (False, {"startingOffsetsByTimestamp": "[1]"}, "startingOffsetsByTimestamp must be JSON"),
        (False, {"startingOffsetsByTimestamp": '{"t": {"0": -1}}'}, "milliseconds since"),
        (True, {"endingTimestamp": "1.5"}, "endingTimestamp must be milliseconds"),
        (True, {"endingOffsetsByTimestamp": '{"t": 3}'}, "endingOffsetsByTimestamp must be JSON"),
        (False, {"startingOffsetsByTimestampStrategy": "skip"}, "must be latest or error"),
    ],
)
def test_bad_timestamps(batch: bool, given: dict[str, str], says: str) -> None:
    with pytest.raises(BadInput, match=says):
        parse(batch=batch, **given)


def test_batch_limits() -> None:
    assert parse(maxOffsetsPerTrigger="100").max_offsets_per_trigger == 100
    both = parse(maxOffsetsPerTrigger="100", maxRecordsPerBatch="40")
    assert (both.max_offsets_per_trigger, both.max_records_per_batch) == (100, 40)
    assert parse(maxBytesPerBatch="4096").max_bytes_per_batch == 4096
    assert parse(firstBatchMaxBytes="512").first_batch_max_bytes == 512
    waiting = parse(minOffsetsPerTrigger="10", maxTriggerDelay="30s")
    assert waiting.min_offsets_per_trigger == 10 and waiting.max_trigger_delay_s == 30
    for raw, seconds in (("500ms", 0.5), ("2m", 120), ("1h", 3600), ("1d", 86400), ("250", 0.25)):
        assert parse(maxTriggerDelay=raw).max_trigger_delay_s == seconds


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger must be at least 1"),
        ({"maxOffsetsPerTrigger": "many"}, "maxOffsetsPerTrigger must be a whole number"),
        ({"minOffsetsPerTrigger": "-1"}, "minOffsetsPerTrigger must be at least 1"),
        (
            {"minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"},
            "minOffsetsPerTrigger \\(50\\) is higher than maxOffsetsPerTrigger \\(10\\)",
        ),
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay must be a duration"),
        ({"maxTriggerDelay": "5 weeks"}, "maxTriggerDelay must be a duration"),
        ({"maxRecordsPerBatch": "0"}, "maxRecordsPerBatch must be at least 1"),
        ({"maxBytesPerBatch": "1k"}, "maxBytesPerBatch must be a whole number"),
        ({"firstBatchMaxBytes": "0"}, "firstBatchMaxBytes must be at least 1"),
        ({"slots": "0"}, "slots must be at least 1"),
        ({"pollTimeoutMs": "x"}, "pollTimeoutMs must be a whole number"),
    ],
)
def test_bad_limits(given: dict[str, str], says: str) -> None:
    with pytest.raises(BadInput, match=says):
        parse(**given)


def test_planning_and_reading_options() -> None:
    options = parse(
        minPartitions="12",
        maxRecordsPerPartition="1000",
        includeHeaders="true",
        failOnDataLoss="false",
        pollTimeoutMs="1500",
    )
    assert options.min_partitions == 12 and options.max_records_per_partition == 1000
    assert options.include_headers and not options.fail_on_data_loss
    assert options.poll_timeout_s == 1.5
    assert parse(**{"kafkaConsumer.pollTimeoutMs": "2000"}).poll_timeout_s == 2.0
    sized = parse(bytesPerRecord='{"t": {"0": 104, "3": 800000}}')
    assert sized.bytes_per_record == {"t": {"0": 104, "3": 800000}}
    fields = '{"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": true}]}'
    assert parse(decodeJsonValues=fields).decode_json_values == fields
    avro = json.dumps({"reader_schema": '"long"', "registry_url": None, "fields": fields})
    written = parse(decodeAvroValues=avro, executorWriter="m:f")
    assert written.decode_avro_values == avro


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"minPartitions": "0"}, "minPartitions must be at least 1"),
        ({"maxRecordsPerPartition": "ten"}, "maxRecordsPerPartition must be a whole number"),
        ({"includeHeaders": "maybe"}, "includeHeaders must be true or false"),
        ({"failOnDataLoss": "sometimes"}, "failOnDataLoss must be true or false"),
        ({"bytesPerRecord": '{"t": {"0": 1.5}}'}, "bytesPerRecord must be JSON like"),
        ({"decodeJsonValues": "id BIGINT"}, "decodeJsonValues must be a Spark schema"),
        (
            {"decodeJsonValues": '{"type": "struct", "fields": [{"name": "d", "type": "date"}]}'},
            "of INT, BIGINT, DOUBLE, BOOLEAN and STRING columns",
        ),
        ({"decodeJsonValues": '{"type": "struct", "fields": []}'}, "decodeJsonValues must be"),
        ({"decodeAvroValues": "{}"}, "decodeAvroValues needs option executorWriter"),
        (
            {"decodeAvroValues": '{"fields": "x"}', "executorWriter": "m:f"},
            "decodeAvroValues must give a reader schema and a Spark schema of INT",
        ),
    ],
)
def test_bad_planning_and_reading_options(given: dict[str, str], says: str) -> None:
    with pytest.raises(BadInput, match=says):
        parse(**given)


def test_option_names_match_case_insensitively_as_in_spark() -> None:
    options = parse(STARTINGOFFSETS="earliest", maxoffsetspertrigger="5", IncludeHeaders="true")
    assert options.starting == "earliest" and options.max_offsets_per_trigger == 5
    assert options.include_headers


def test_unknown_option_is_refused_with_a_hint() -> None:
    with pytest.raises(BadInput, match=r"unknown option 'startingOffset' .*startingOffsets"):
        parse(startingOffset="earliest")
    with pytest.raises(BadInput, match="unknown option 'groupId'"):
        parse(groupId="x")


def test_an_option_given_twice_in_other_cases_is_refused() -> None:
    with pytest.raises(BadInput, match="given twice"):
        parse(includeHeaders="true", INCLUDEHEADERS="false")


def test_every_constant_is_known() -> None:
    names = [v for k, v in vars(o).items() if k.isupper() and isinstance(v, str)]
    names = [n for n in names if n != o.KAFKA_PREFIX]
    assert sorted(names) == sorted(o.KNOWN)


def test_bootstrap_is_required() -> None:
    with pytest.raises(BadInput, match=r"kafka\.bootstrap\.servers is required"):
        parse(drop=("kafka.bootstrap.servers",))


# --- librdkafka settings -------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_settings_that_break_lagless_are_refused(key: str) -> None:
    with pytest.raises(BadInput, match=f"kafka option {key} cannot be set"):
        parse(**{f"kafka__{key}": "x"})


def test_refused_settings_match_case_insensitively() -> None:
    with pytest.raises(BadInput, match=r"kafka option Group\.Id cannot be set"):
        KafkaConfig.from_options("127.0.0.1:9", {"Group.Id": "g"})


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("security.protocol", "bogus", 'kafka option security.protocol: Invalid value "bogus"'),
        ("fetch.wait.max.ms", "soon", "kafka option fetch.wait.max.ms: Invalid value"),
        ("no.such.setting", "1", "kafka option no.such.setting: No such configuration property"),
        ("linger.ms", "-5", "outside allowed range.*kafka options: linger.ms"),
    ],
)
def test_invalid_librdkafka_values_are_one_line_naming_the_setting(
    key: str, value: str, says: str
) -> None:
    with pytest.raises(BadInput, match=says) as raised:
        parse(**{f"kafka__{key}": value})
    assert "\n" not in str(raised.value)


def test_a_refused_secret_value_is_not_shown() -> None:
    from confluent_kafka import KafkaException

    config = KafkaConfig.from_options("b:1", {"sasl.password": "hunter2"})
    refused = KafkaException('Invalid value "hunter2" for configuration property "sasl.password"')
    message = config._explain(refused, "consumer")
    assert "hunter2" not in message and message.startswith("kafka option sasl.password:")


def test_isolation_level_passes_through() -> None:
    committed = parse(**{"kafka__isolation.level": "read_committed"}).kafka
    assert committed.reader()["isolation.level"] == "read_committed" and committed.read_committed
    uncommitted = parse(**{"kafka__isolation.level": "read_uncommitted"}).kafka
    assert not uncommitted.read_committed
    assert KafkaConfig("b:1").read_committed  # librdkafka's default


def test_safe_settings_are_applied_after_the_users() -> None:
    config = KafkaConfig("b:1", {"fetch.wait.max.ms": "7"})
    object.__setattr__(config, "extra", {"fetch.wait.max.ms": "7", "group.id": "sneaky"})
    reader = config.reader()
    assert reader["group.id"] == "lagless-range-reader"
    assert reader["fetch.wait.max.ms"] == "7"  # tuning stays the user's to change
    assert config.group_committer("g")["group.id"] == "g"


# --- Secret --------------------------------------------------------------------------------


def test_secret_does_not_leak_through_string_operations() -> None:
    secret = Secret("hunter2")
    assert not isinstance(secret, str)
    assert str(secret) == repr(secret).replace("Secret('", "").replace("')", "") == "****"
    assert f"{secret}" == "****" and format(secret) == "****"
    with pytest.raises(TypeError):
        secret + ""  # type: ignore[operator]
    with pytest.raises(TypeError):
        "".join([secret])  # type: ignore[list-item]
    with pytest.raises(AttributeError):
        secret.strip()  # type: ignore[attr-defined]
    assert secret.reveal() == "hunter2"
    assert pickle.loads(pickle.dumps(secret)).reveal() == "hunter2"


def test_secret_settings_are_revealed_only_in_client_configs() -> None:
    config = KafkaConfig.from_options("b:1", {"sasl.password": "hunter2"})
    assert isinstance(config.extra["sasl.password"], Secret)
    assert config.redacted()["sasl.password"] == "****"
    assert "hunter2" not in repr(config)
    assert config.reader()["sasl.password"] == "hunter2"
    assert config.source_options()["kafka.sasl.password"] == "hunter2"
