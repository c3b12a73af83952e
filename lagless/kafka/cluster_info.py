"""What the cluster holds: which partitions the topics have, their retention, the consumer
groups and their members."""

from __future__ import annotations

import difflib
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata, ConfigResource

from lagless.exceptions import BadInput, TransientError
from lagless.kafka import TP
from lagless.kafka.connection import KafkaConnection, reason
from lagless.kafka.group_describer import GroupDescriber
from lagless.kafka.groups import GroupDescription, GroupMember
from lagless.kafka.wire import WireClient

log = logging.getLogger(__name__)

# Brokers that do not answer DescribeGroups or DescribeConfigs (the embedded broker does not)
# hold such a request for its whole timeout: a short one keeps callers responsive.
_DESCRIBE_TIMEOUT_S = 5.0
_DESCRIBE_CONFIGS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class GroupsFound:
    committed: dict[str, dict[TP, int] | str]
    described: Mapping[str, GroupDescription | None]
    """May still be arriving (_DescribedLater): read it after the requests that need not
    wait for it."""
    metadata: dict[str, str]


class _DescribedLater(Mapping[str, GroupDescription | None]):
    """Descriptions asked in a thread of their own and waited for when first read: the
    caller asks the log bounds meanwhile (lag/offsets.py's look). An error asking is logged,
    and every group not told."""

    def __init__(
        self, ask: Callable[[], Mapping[str, dict[str, Any] | None]], groups: Sequence[str]
    ) -> None:
        self._found: dict[str, GroupDescription | None] = dict.fromkeys(groups)
        self._thread = threading.Thread(
            target=self._run, args=(ask,), name="describe-groups", daemon=True
        )
        self._thread.start()

    def _run(self, ask: Callable[[], Mapping[str, dict[str, Any] | None]]) -> None:
        try:
            self._found = _descriptions(ask())
        except Exception:
            log.warning("describing groups failed; they show no members this round", exc_info=True)

    def wait(self) -> None:
        self._thread.join()

    def _arrived(self) -> dict[str, GroupDescription | None]:
        self.wait()
        return self._found

    def __getitem__(self, group: str) -> GroupDescription | None:
        return self._arrived()[group]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrived())

    def __len__(self) -> int:
        return len(self._arrived())


class ClusterInfo:
    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        self._describer: GroupDescriber | None = None
        self._wire_client: WireClient | None = None
        self._wire_checked = False
        self._leaders: dict[TP, tuple[str, int]] = {}
        self._describing: _DescribedLater | None = None

    def close(self) -> None:
        if self._describer is not None:
            self._describer.close()
        if self._wire_client is not None:
            self._wire_client.close()

    def partitions(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        assign: Mapping[str, Iterable[int]] | None = None,
    ) -> list[TP]:
        """Partitions of the named topics (each must exist), of the topics matching pattern
        (`.*`: every topic but Kafka's internal ones), or the assigned ones (each must exist)."""
        topics = list(topics)
        metadata = self._connection.metadata({*topics, *(assign or ())})
        bootstrap = self._connection.config.bootstrap
        if assign is not None:
            wanted = [(t, p) for t, parts in sorted(assign.items()) for p in sorted(parts)]
            for t, p in wanted:
                found = metadata.topics.get(t)
                if found is None or found.error or p not in found.partitions:
                    raise BadInput(f"partition {t}[{p}] does not exist on {bootstrap}")
            return wanted
        if pattern is not None:
            regex = re.compile(pattern)
            names = sorted(
                t
                for t, meta in metadata.topics.items()
                if regex.fullmatch(t) and not meta.error and not t.startswith("__")
            )
        else:
            names = topics
            missing = [t for t in names if t not in metadata.topics or metadata.topics[t].error]
            if missing:
                raise BadInput(
                    f"topic {missing[0]!r} does not exist on {bootstrap}; "
                    f"{_topics_there(metadata, missing[0])}"
                )
        return [(t, p) for t in names for p in sorted(metadata.topics[t].partitions)]

    def topic_partitions(self) -> dict[str, int]:
        """Every topic the cluster holds and its number of partitions (one metadata request;
        a topic the broker reports with an error, such as one being deleted, is left out)."""
        metadata = self._connection.metadata()
        brokers = {node: (str(found.host), found.port) for node, found in metadata.brokers.items()}
        self._leaders = {
            (name, number): brokers[partition.leader]
            for name, topic in metadata.topics.items()
            if not topic.error
            for number, partition in topic.partitions.items()
            if partition.leader in brokers
        }
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if not topic.error
        }

    def log_bounds(
        self, partitions: Sequence[TP]
    ) -> tuple[dict[TP, int], dict[TP, int], dict[TP, str]] | None:
        """(log start, log end, failed) in one ListOffsets per leader (wire.py), of the leaders
        the latest topic_partitions() found; None where that way is closed (a listener with TLS
        or SASL, a broker without the requests): then log_offsets.py's way."""
        wire = self._wire()
        if wire is None:
            return None
        leaders = {tp: self._leaders[tp] for tp in partitions if tp in self._leaders}
        low, end, failed = wire.log_bounds(leaders)
        for tp in partitions:
            if tp not in leaders:
                failed[tp] = "no leader known for it yet"
        return low, end, failed

    def retention_ms(self, topics: Iterable[str]) -> dict[str, int | None] | None:
        """retention.ms of each topic (None: unlimited), from DescribeConfigs; None when the
        broker does not tell (the embedded broker does not answer)."""
        wanted = sorted(set(topics))
        if not wanted:
            return {}
        futures = self._connection.admin.describe_configs(
            [ConfigResource("topic", topic) for topic in wanted],
            request_timeout=_DESCRIBE_CONFIGS_TIMEOUT_S,
        )
        found: dict[str, int | None] = {}
        try:
            for resource, future in futures.items():
                entry = future.result().get("retention.ms")
                value = None if entry is None or entry.value is None else int(entry.value)
                # Kafka spells "no time limit" as -1.
                found[resource.name] = None if value is None or value < 0 else value
        except (KafkaException, ValueError):
            return None
        return found

    def list_groups(self) -> list[str] | None:
        """Every consumer group the broker knows; None when it does not answer ListGroups."""
        future = self._connection.admin.list_consumer_groups(request_timeout=_DESCRIBE_TIMEOUT_S)
        try:
            listed = future.result()
        except KafkaException as exc:
            raise TransientError(f"ListGroups failed: {reason(exc)}") from None
        unsupported = [
            error for error in listed.errors if error.code() == KafkaError._UNSUPPORTED_FEATURE
        ]
        if unsupported and not listed.valid:
            return None
        if listed.errors and not listed.valid:
            raise TransientError(f"ListGroups failed: {listed.errors[0].str()}")
        return sorted({group.group_id for group in listed.valid})

    def groups(
        self,
        groups: Sequence[str],
        describe: bool = True,
        partitions: Sequence[TP] | None = None,
        known: Mapping[str, Sequence[TP]] | None = None,
    ) -> GroupsFound:
        """Many groups at once: each group's committed offsets (every partition it committed
        on, those of topics that no longer exist included), or why the broker did not tell
        them; the metadata committed with them (group_offsets.COMMITTED_BY_LAGLESS: an
        import's); and with `describe`, its state, assignor, members and their partitions
        (DescribeGroups), None where the broker does not tell. Never retried: the lag tools
        sample again.

        Where the broker answers OffsetFetch v8 on a plain listener, the offsets come in one
        request per coordinator for all groups (wire.py), of the partitions `known`
        names for a group (the others: every partition it committed on), while the child
        process describes them; otherwise both come from the child (group_describer.py: a
        connection dropping during a coordinator's request aborts librdkafka's process), of
        every partition or of `partitions`."""
        wire = self._wire() if partitions is None else None
        if wire is None:
            found = self._groups_describer().ask(
                groups,
                self._connection.timeout_s,
                describe=describe,
                offsets=True,
                partitions=partitions,
            )
            return _found(found.offsets, found.described, found.metadata)
        described: Mapping[str, GroupDescription | None] = {}
        if describe:
            # One at a time: a round whose groups all failed never reads its descriptions, and
            # while the broker is away each takes the request's timeout; started a round apart,
            # they would pile up in threads waiting for the child process.
            if self._describing is not None:
                self._describing.wait()
            timeout_s = self._connection.timeout_s
            described = self._describing = _DescribedLater(
                lambda: self._groups_describer().describe(groups, timeout_s), groups
            )
        told = wire.fetch({g: (known or {}).get(g) for g in dict.fromkeys(groups)})
        committed: dict[str, dict[TP, int] | str] = {}
        metadata: dict[str, str] = {}
        for group, answer in told.items():
            if isinstance(answer, str):
                committed[group] = answer
                continue
            committed[group], marks = answer
            # The group's mark where every offset carries the same one (an import commits all
            # the partitions it reads; a consumer's commit leaves none).
            if len(marks) == 1 and "" not in marks:
                metadata[group] = next(iter(marks))
        return GroupsFound(committed, described, metadata)

    def _groups_describer(self) -> GroupDescriber:
        if self._describer is None:
            self._describer = GroupDescriber(self._connection.config.admin())
        return self._describer

    def _wire(self) -> WireClient | None:
        """The requests written by hand (wire.py), where the listener is plain and the broker
        answers them; asked once (again while the broker cannot be reached)."""
        if not self._wire_checked:
            settings = self._connection.config.admin()
            protocol = str(settings.get("security.protocol", "plaintext")).lower()
            if protocol != "plaintext":
                self._wire_checked = True
                return None
            wire = WireClient(self._connection.config.bootstrap, self._connection.timeout_s)
            try:
                usable = wire.usable()
            except OSError:
                wire.close()
                return None
            self._wire_checked = True
            if usable:
                self._wire_client = wire
            else:
                wire.close()
        return self._wire_client

    def describe_groups(
        self, groups: Sequence[str], timeout_s: float = _DESCRIBE_TIMEOUT_S
    ) -> dict[str, GroupDescription | None]:
        """Each group's state, assignor, members and their partitions (DescribeGroups, all in
        one request, from the child process); None for a group the broker does not tell
        about."""
        return _descriptions(self._groups_describer().describe(groups, timeout_s))

    def describe_group(self, group: str) -> GroupDescription | None:
        return self.describe_groups([group])[group]


def _found(
    offsets: Mapping[str, Sequence[tuple[str, int, int]] | str],
    described: Mapping[str, dict[str, Any] | None],
    metadata: dict[str, str],
) -> GroupsFound:
    committed = {
        group: told if isinstance(told, str) else {(t, p): o for t, p, o in told}
        for group, told in offsets.items()
    }
    return GroupsFound(committed, _descriptions(described), metadata)


def _descriptions(found: Mapping[str, dict[str, Any] | None]) -> dict[str, GroupDescription | None]:
    return {group: None if told is None else _description(told) for group, told in found.items()}


def _description(found: dict[str, Any]) -> GroupDescription:
    """A description back from the child's plain data."""
    return GroupDescription(
        group=found["group"],
        assignor=found["assignor"],
        state=found["state"],
        members=tuple(
            GroupMember(
                member_id=member["member_id"],
                client_id=member["client_id"],
                partitions=tuple((topic, part) for topic, part in member["partitions"]),
                group_instance_id=member["group_instance_id"],
            )
            for member in found["members"]
        ),
        protocol=found.get("protocol", "CLASSIC"),
    )


# Topics a "does not exist" names, nearest to the one asked for first; more are counted.
NAMED_TOPICS = 10


def _topics_there(metadata: ClusterMetadata, asked: str) -> str:
    """What the cluster has instead, for a topic that is not there: its topics (not Kafka's
    internal ones), the names closest to `asked` first."""
    names = sorted(t for t, meta in metadata.topics.items() if not meta.error and t[:2] != "__")
    if not names:
        return "it has no topics"
    close = difflib.get_close_matches(asked, names, n=NAMED_TOPICS, cutoff=0.6)
    shown = close + [name for name in names if name not in close]
    more = len(shown) - NAMED_TOPICS
    listed = ", ".join(shown[:NAMED_TOPICS]) + (f" and {more} more" if more > 0 else "")
    return f"its topics: {listed}"
