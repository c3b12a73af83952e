"""Options of the lagless Kafka source, parsed once from Spark's string map."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from lagless.exceptions import BadInput
from lagless.kafka_config import KafkaConfig

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True)
class SourceOptions:
    kafka: KafkaConfig
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting: str | dict[str, dict[str, int]] = "earliest"
    ending: str | dict[str, dict[str, int]] = "latest"
    max_records_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    fail_on_data_loss: bool = True
    slots: int = 2
    min_task_records: int = 1
    # A batch lighter than this per task is packed into fewer tasks (planner/pack.py).
    min_task_bytes: int = 8 * 1024 * 1024
    # "module:function" and its JSON config: tasks write their records there (executor_write.py).
    executor_writer: str | None = None
    executor_writer_config: str = "{}"
    poll_timeout_s: float = 60.0
    extra: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {k: v for k, v in options.items()}
        lowered = {k.lower(): v for k, v in opts.items()}
        kafka_opts = {k[len("kafka.") :]: v for k, v in opts.items() if k.startswith("kafka.")}
        bootstrap = kafka_opts.pop("bootstrap.servers", "")
        if not bootstrap:
            raise BadInput("option kafka.bootstrap.servers is required")
        topics = tuple(t.strip() for t in lowered.get("subscribe", "").split(",") if t.strip())
        pattern = lowered.get("subscribepattern") or None
        if bool(topics) == bool(pattern):
            raise BadInput("set exactly one of the options subscribe and subscribePattern")
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise BadInput(
                    f"subscribePattern {pattern!r} is not a regular expression: {exc}"
                ) from None
        return cls(
            kafka=KafkaConfig.from_options(bootstrap, kafka_opts),
            topics=topics,
            pattern=pattern,
            starting=_offsets_spec(lowered.get("startingoffsets", "earliest"), "startingOffsets"),
            ending=_offsets_spec(lowered.get("endingoffsets", "latest"), "endingOffsets"),
            max_records_per_batch=_positive(lowered, "maxrecordsperbatch"),
            max_bytes_per_batch=_positive(lowered, "maxbytesperbatch"),
            fail_on_data_loss=_bool(lowered.get("failondataloss", "true"), "failOnDataLoss"),
            slots=_positive(lowered, "slots") or 2,
            min_task_records=_positive(lowered, "mintaskrecords") or 1,
            min_task_bytes=_positive(lowered, "mintaskbytes") or cls.min_task_bytes,
            executor_writer=lowered.get("executorwriter") or None,
            executor_writer_config=lowered.get("executorwriterconfig", "{}"),
            poll_timeout_s=float(lowered.get("polltimeoutms", "60000")) / 1000,
        )


def _positive(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"option {name} must be a whole number, not {raw!r}") from None
    if value < 1:
        raise BadInput(f"option {name} must be at least 1")
    return value


def _bool(raw: str, name: str) -> bool:
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise BadInput(f"option {name} must be true or false, not {raw!r}")


def _offsets_spec(raw: str, name: str) -> str | dict[str, dict[str, int]]:
    """earliest | latest | {"topic": {"0": 42, "1": -2}} (-2 earliest, -1 latest, as in Spark)."""
    if raw in ("earliest", "latest"):
        return raw
    try:
        parsed = json.loads(raw)
        return {
            str(topic): {str(int(p)): int(o) for p, o in parts.items()}
            for topic, parts in parsed.items()
        }
    except (ValueError, AttributeError, TypeError):
        raise BadInput(
            f'{name} must be earliest, latest or JSON like {{"topic": {{"0": 42}}}}, not {raw!r}'
        ) from None
