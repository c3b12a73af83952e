"""The one place that builds librdkafka configurations.

Secrets (passwords, keys) are held as Secret (lagless/secret.py) so they never show in a repr,
a log or an error; the plaintext leaves a Secret only here, where a client is configured.

A user's librdkafka settings are checked once (`KafkaConfig.from_options`): settings that
would break lagless's guarantees are refused (REFUSED), and the rest must make a valid
librdkafka client, else a one-line BadInput names the setting. lagless's own safe settings
are applied after the user's, so nothing can override them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from lagless.exceptions import BadInput
from lagless.secret import Secret, reveal

# What one fetch of a range reader may bring. A reader is assigned one partition, so Kafka sends
# it at most max.partition.fetch.bytes (1 MB by default) anyway; a broker that ignores that bound
# (Tansu) filled 8 MB: the rest of a partition for a range of a few thousand records, decompressed
# at every range start (0.24-0.5 s each; tests/integration/test_fetch_bound.py).
READER_FETCH_BYTES = 1024 * 1024
FETCH_BOUNDS = ("message.max.bytes", "fetch.message.max.bytes", "max.partition.fetch.bytes")

_SECRET_MARKERS = ("password", "secret", "key.pem", "sasl.oauthbearer.config", "ssl.key")

# Settings lagless decides itself, and why a user's value would break it. Spark's Kafka source
# refuses the like for the same reasons (KafkaSourceProvider.validateGeneralOptions:
# auto.offset.reset, key/value.deserializer, enable.auto.commit, interceptor.classes).
REFUSED: dict[str, str] = {
    "group.id": "tasks read assigned offset ranges and join no group; use --group to publish "
    "progress to a consumer group",
    "group.instance.id": "tasks join no consumer group",
    "partition.assignment.strategy": "tasks join no consumer group, partitions are assigned",
    "enable.auto.commit": "offsets are committed only after a batch is written",
    "auto.commit.interval.ms": "offsets are committed only after a batch is written",
    "enable.auto.offset.store": "offsets are committed only after a batch is written",
    "enable.partition.eof": "the reader needs end-of-partition events to finish a range",
    "auto.offset.reset": "lagless decides offsets itself (startingOffsets, failOnDataLoss)",
    "transactional.id": "lagless's producers are not transactional",
    "key.deserializer": "keys are always read as bytes",
    "value.deserializer": "values are always read as bytes",
    "key.serializer": "lagless writes no records through a serializer",
    "value.serializer": "lagless writes no records through a serializer",
    "interceptor.classes": "librdkafka has no interceptors to run",
}


def is_secret_key(key: str) -> bool:
    return any(marker in key for marker in _SECRET_MARKERS)


@dataclass(frozen=True)
class KafkaConfig:
    """Connection settings shared by every client lagless creates."""

    bootstrap: str
    extra: Mapping[str, str | Secret] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap.strip():
            raise BadInput("bootstrap address is empty")
        for key in self.extra:
            if key.strip().lower() in REFUSED:
                raise BadInput(f"kafka option {key} cannot be set: {REFUSED[key.strip().lower()]}")

    @classmethod
    def from_options(cls, bootstrap: str, options: Mapping[str, str]) -> KafkaConfig:
        """Build from pass-through options (librdkafka names, e.g. security.protocol), each
        checked by librdkafka itself."""
        extra = {k: Secret(v) if is_secret_key(k) else v for k, v in options.items()}
        config = cls(bootstrap=bootstrap, extra=extra)
        config.validate()
        return config

    def validate(self) -> None:
        """A BadInput naming the setting when librdkafka refuses one (unknown name, bad value,
        a file that cannot be read): one consumer and one producer are built and closed."""
        from confluent_kafka import Consumer, KafkaException, Producer

        for role, make, conf in (
            ("consumer", Consumer, self.reader()),
            ("producer", Producer, self.producer()),
        ):
            try:
                client = make(conf)
            except KafkaException as exc:
                raise BadInput(self._explain(exc, role)) from None
            if isinstance(client, Consumer):
                client.close()
            else:
                client.flush(0)

    def _explain(self, exc: Exception, role: str) -> str:
        err = exc.args[0] if exc.args else exc
        reason = str(getattr(err, "str", lambda: err)())
        for value in self.extra.values():
            if isinstance(value, Secret) and value.reveal():
                reason = reason.replace(value.reveal(), "****")
        reason = " ".join(reason.split())
        named = re.search(r'property:? "([^"]+)"', reason)
        if named and named.group(1) in self.extra:
            return f"kafka option {named.group(1)}: {reason}"
        given = ", ".join(sorted(self.extra)) or "none"
        return f"kafka options refused by librdkafka ({role}): {reason} (kafka options: {given})"

    def _base(self) -> dict[str, str]:
        conf = {"bootstrap.servers": self.bootstrap, "log_level": "2"}
        for key, value in self.extra.items():
            conf[key] = reveal(value)
        return conf

    def _with(self, tuning: Mapping[str, object], safe: Mapping[str, object]) -> dict[str, object]:
        """tuning, then the user's settings (which may change tuning), then safe (which nothing
        may change)."""
        conf: dict[str, object] = dict(tuning)
        conf.update(self._base())
        conf.update(safe)
        return conf

    def reader(self) -> dict[str, object]:
        """A consumer that is assigned ranges and never joins or commits to a group."""
        return self._with(
            {
                # A broker may hold a fetch this long even when it has the records (Tansu
                # does): with 100 ms, each partition range a task read cost 100 ms however few
                # its records. Ranges are planned from offsets that exist, so a read seldom
                # waits at the log's end, where a short wait would mean more empty fetches.
                "fetch.wait.max.ms": 10,
                "queued.min.messages": 200_000,
                # Prefetch bounded in bytes, so a task's memory does not grow with record size;
                # when the bound is reached librdkafka waits fetch.queue.backoff.ms (1 s by
                # default) before fetching again, which cut reading 50 KB records from 1.3 GB/s
                # to 25 MB/s.
                "queued.max.messages.kbytes": 16 * 1024,
                "fetch.max.bytes": self._reader_fetch_bytes(),
                "fetch.queue.backoff.ms": 10,
            },
            {
                "group.id": "lagless-range-reader",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
            },
        )

    def _reader_fetch_bytes(self) -> int:
        """READER_FETCH_BYTES, or more when the user raised a bound it must not be below
        (librdkafka refuses fetch.max.bytes under message.max.bytes) or raised the partition's
        bound to fetch more at a time."""
        sizes = [READER_FETCH_BYTES]
        for key in FETCH_BOUNDS:
            if key in self.extra:
                # A value that is no number: librdkafka names it when the client is built.
                with contextlib.suppress(ValueError):
                    sizes.append(int(str(reveal(self.extra[key])).strip()))
        return max(sizes)

    def group_committer(self, group: str) -> dict[str, object]:
        """A consumer used only to commit offsets on behalf of `group`."""
        return self._with({}, {"group.id": group, "enable.auto.commit": False})

    def group_member(self, group: str, assignor: str) -> dict[str, object]:
        """A consumer that subscribes as a member of `group` from its committed offsets (else
        the earliest) and commits itself: the consumer-group importer lagless is measured
        against (bench/skew.py)."""
        return self._with(
            {},
            {
                "group.id": group,
                "partition.assignment.strategy": assignor,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            },
        )

    def admin(self) -> dict[str, str | int | float | bool]:
        return dict(self._base())

    def producer(self, **overrides: object) -> dict[str, object]:
        conf = self._with({"linger.ms": 20, "batch.num.messages": 10_000}, {})
        conf.update(overrides)
        return conf

    @property
    def read_committed(self) -> bool:
        """Whether readers skip aborted transactions (librdkafka's default, read_committed)."""
        level = reveal(self.extra.get("isolation.level", "read_committed"))
        return level.strip().lower() != "read_uncommitted"

    def source_options(self) -> dict[str, str]:
        """These settings as options of the lagless Kafka source (kafka.*), secrets revealed:
        the source configures its clients from them."""
        options = {f"kafka.{k}": reveal(v) for k, v in self.extra.items()}
        options["kafka.bootstrap.servers"] = self.bootstrap
        return options

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
