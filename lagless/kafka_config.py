"""The one place that builds librdkafka configurations.

Secrets (passwords, keys) are held as Secret so they never show in a repr, a log or an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from lagless.exceptions import BadInput

_SECRET_MARKERS = ("password", "secret", "key.pem", "sasl.oauthbearer.config", "ssl.key")


class Secret(str):
    """A string that prints as asterisks."""

    def __repr__(self) -> str:
        return "Secret('****')"

    def __str__(self) -> str:  # pragma: no cover - only hit by accidental printing
        return "****"

    def reveal(self) -> str:
        return str.__str__(self)


def is_secret_key(key: str) -> bool:
    return any(marker in key for marker in _SECRET_MARKERS)


@dataclass(frozen=True)
class KafkaConfig:
    """Connection settings shared by every client lagless creates."""

    bootstrap: str
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap.strip():
            raise BadInput("bootstrap address is empty")

    @classmethod
    def from_options(cls, bootstrap: str, options: Mapping[str, str]) -> KafkaConfig:
        """Build from pass-through options (librdkafka names, e.g. security.protocol)."""
        extra = {k: Secret(v) if is_secret_key(k) else v for k, v in options.items()}
        return cls(bootstrap=bootstrap, extra=extra)

    def _base(self) -> dict[str, str]:
        conf = {"bootstrap.servers": self.bootstrap, "log_level": "2"}
        for key, value in self.extra.items():
            conf[key] = value.reveal() if isinstance(value, Secret) else str(value)
        return conf

    def reader(self) -> dict[str, object]:
        """A consumer that is assigned ranges and never joins or commits to a group."""
        conf: dict[str, object] = {
            "group.id": "lagless-range-reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 100,
            "queued.min.messages": 200_000,
            # Prefetch bounded in bytes, so a task's memory does not grow with record size;
            # when the bound is reached librdkafka waits fetch.queue.backoff.ms (1 s by default)
            # before fetching again, which cut reading 50 KB records from 1.3 GB/s to 25 MB/s.
            "queued.max.messages.kbytes": 16 * 1024,
            "fetch.max.bytes": 8 * 1024 * 1024,
            "fetch.queue.backoff.ms": 10,
        }
        conf.update(self._base())
        return conf

    def group_committer(self, group: str) -> dict[str, object]:
        """A consumer used only to commit offsets on behalf of `group`."""
        conf: dict[str, object] = {"group.id": group, "enable.auto.commit": False}
        conf.update(self._base())
        return conf

    def group_member(self, group: str, assignor: str) -> dict[str, object]:
        """A consumer that subscribes as a member of `group` from its committed offsets (else
        the earliest) and commits itself: the consumer-group importer lagless is measured
        against (bench/skew.py)."""
        conf: dict[str, object] = {
            "group.id": group,
            "partition.assignment.strategy": assignor,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        conf.update(self._base())
        return conf

    def group_offsets_reader(self, group: str) -> dict[str, object]:
        """A consumer that reads `group`'s committed offsets; it never subscribes nor commits."""
        conf: dict[str, object] = {
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
        conf.update(self._base())
        return conf

    def admin(self) -> dict[str, str | int | float | bool]:
        return dict(self._base())

    def producer(self, **overrides: object) -> dict[str, object]:
        conf: dict[str, object] = {"linger.ms": 20, "batch.num.messages": 10_000}
        conf.update(self._base())
        conf.update(overrides)
        return conf

    def redacted(self) -> dict[str, str]:
        """What may be shown to a person."""
        shown = {"bootstrap.servers": self.bootstrap}
        shown.update(
            {k: "****" if isinstance(v, Secret) else str(v) for k, v in self.extra.items()}
        )
        return shown


def parse_key_values(pairs: list[str] | None, what: str = "--kafka-option") -> dict[str, str]:
    """`["a=b", "c=d"]` -> {"a": "b", "c": "d"}; a pair without '=' is bad input."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"{what} {pair!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out
