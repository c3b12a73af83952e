"""What the cluster holds: which partitions the topics have, their retention, the consumer
groups and their members."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigResource

from lagless.exceptions import BadInput, TransientError
from lagless.kafka import TP
from lagless.kafka.connection import KafkaConnection, reason
from lagless.kafka.group_describer import GroupDescriber, GroupsAnswer
from lagless.kafka.offset_fetch import OffsetFetcher

# Brokers that do not answer DescribeGroups or DescribeConfigs (the embedded broker does not)
# hold such a request for its whole timeout: a short one keeps callers responsive.
_DESCRIBE_TIMEOUT_S = 5.0
_DESCRIBE_CONFIGS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    partitions: tuple[TP, ...]
    group_instance_id: str | None = None


@dataclass(frozen=True)
class GroupDescription:
    group: str
    assignor: str
    state: str
    members: tuple[GroupMember, ...]
    protocol: str = "CLASSIC"
    """The group's protocol as the broker tells it: CLASSIC (JoinGroup/SyncGroup), or CONSUMER
    (KIP-848's ConsumerGroupHeartbeat), where librdkafka asked ConsumerGroupDescribe."""


@dataclass(frozen=True)
class GroupsFound:
    committed: dict[str, dict[TP, int] | str]
    described: dict[str, GroupDescription | None]
    metadata: dict[str, str]


class ClusterInfo:
    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        self._describer: GroupDescriber | None = None
        self._fetcher: OffsetFetcher | None = None
        self._fetcher_checked = False

    def close(self) -> None:
        if self._describer is not None:
            self._describer.close()
        if self._fetcher is not None:
            self._fetcher.close()

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
                raise BadInput(f"topic {missing[0]!r} does not exist on {bootstrap}")
        return [(t, p) for t in names for p in sorted(metadata.topics[t].partitions)]

    def topic_partitions(self) -> dict[str, int]:
        """Every topic the cluster holds and its number of partitions (one metadata request;
        a topic the broker reports with an error, such as one being deleted, is left out)."""
        metadata = self._connection.metadata()
        return {
            name: len(topic.partitions)
            for name, topic in metadata.topics.items()
            if not topic.error
        }

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
        request per coordinator for all groups (offset_fetch.py), of the partitions `known`
        names for a group (the others: every partition it committed on), while the child
        process describes them; otherwise both come from the child (group_describer.py: a
        connection dropping during a coordinator's request aborts librdkafka's process), of
        every partition or of `partitions`."""
        fetcher = self._offset_fetcher() if partitions is None else None
        if fetcher is None:
            found = self._groups_describer().ask(
                groups,
                self._connection.timeout_s,
                describe=describe,
                offsets=True,
                partitions=partitions,
            )
            return _found(found.offsets, found.described, found.metadata)
        described: list[GroupsAnswer] = []
        describing = threading.Thread(
            target=lambda: described.append(
                self._groups_describer().ask(
                    groups, self._connection.timeout_s, describe=True, offsets=False
                )
            ),
            name="describe-groups",
            daemon=True,
        )
        if describe:
            describing.start()
        try:
            told = fetcher.fetch({g: (known or {}).get(g) for g in dict.fromkeys(groups)})
        finally:
            if describe:
                describing.join()
        offsets: dict[str, list[tuple[str, int, int]] | str] = {}
        metadata: dict[str, str] = {}
        for group, answer in told.items():
            if isinstance(answer, str):
                offsets[group] = answer
                continue
            offsets[group] = [(t, p, o) for t, p, o, _ in answer]
            # The group's mark where every offset carries the same one (an import commits all
            # the partitions it reads; a consumer's commit leaves none).
            marks = {mark for *_, mark in answer}
            if len(marks) == 1 and "" not in marks:
                metadata[group] = marks.pop()
        return _found(offsets, described[0].described if described else {}, metadata)

    def _groups_describer(self) -> GroupDescriber:
        if self._describer is None:
            self._describer = GroupDescriber(self._connection.config.admin())
        return self._describer

    def _offset_fetcher(self) -> OffsetFetcher | None:
        """The batched OffsetFetch, where the listener is plain and the broker answers v8;
        asked once (again while the broker cannot be reached)."""
        if not self._fetcher_checked:
            settings = self._connection.config.admin()
            protocol = str(settings.get("security.protocol", "plaintext")).lower()
            if protocol != "plaintext":
                self._fetcher_checked = True
                return None
            fetcher = OffsetFetcher(self._connection.config.bootstrap, self._connection.timeout_s)
            try:
                usable = fetcher.usable()
            except OSError:
                fetcher.close()
                return None
            self._fetcher_checked = True
            if usable:
                self._fetcher = fetcher
            else:
                fetcher.close()
        return self._fetcher

    def describe_groups(self, groups: Sequence[str]) -> dict[str, GroupDescription | None]:
        """Each group's state, assignor, members and their partitions (DescribeGroups, all in
        one request, from the child process); None for a group the broker does not tell
        about."""
        return _descriptions(self._groups_describer().describe(groups, _DESCRIBE_TIMEOUT_S))

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


def describe_found(group: str, found: Any) -> GroupDescription:
    """A DescribeGroups answer (confluent-kafka's ConsumerGroupDescription) as lagless's."""
    return GroupDescription(
        group=group,
        assignor=found.partition_assignor or "",
        state=str(getattr(found.state, "name", found.state)),
        members=tuple(
            GroupMember(
                member_id=member.member_id,
                client_id=member.client_id,
                partitions=tuple(
                    sorted(
                        (tp.topic, tp.partition)
                        for tp in (member.assignment.topic_partitions or [])
                    )
                ),
                group_instance_id=member.group_instance_id,
            )
            for member in found.members
        ),
        protocol=str(getattr(getattr(found, "type", None), "name", None) or "CLASSIC"),
    )
