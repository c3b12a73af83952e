"""Who holds which partitions: DescribeGroups, behind a seam so the doctor's reasoning is testable.

Brokers that do not answer DescribeGroups (the embedded broker does not) yield None, and the
doctor says what it could not check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from lagless.exceptions import TransientError
from lagless.kafka_config import KafkaConfig

# Assignors of the eager protocol: every member gives up all its partitions at each rebalance.
EAGER_ASSIGNORS = frozenset({"range", "roundrobin", "sticky"})
_DESCRIBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    partitions: tuple[tuple[str, int], ...]
    group_instance_id: str | None = None


@dataclass(frozen=True)
class GroupDescription:
    group: str
    assignor: str
    state: str
    members: tuple[GroupMember, ...]


class MembershipSource(Protocol):
    def describe(self, group: str) -> GroupDescription | None:
        """The group's members and assignments; None when the broker cannot tell."""
        ...

    def list_groups(self) -> list[str] | None:
        """Every consumer group the broker knows; None when it does not answer ListGroups.

        Raises TransientError when the broker cannot be reached.
        """
        ...


class KafkaMembership:
    """DescribeGroups through the admin client."""

    def __init__(self, config: KafkaConfig) -> None:
        # admin() holds strings only; the stubs want librdkafka's scalar types spelled out.
        self._admin = AdminClient({key: str(value) for key, value in config.admin().items()})

    def describe(self, group: str) -> GroupDescription | None:
        future = self._admin.describe_consumer_groups([group], request_timeout=_DESCRIBE_TIMEOUT_S)
        try:
            found = future[group].result()
        except KafkaException:
            return None
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
        )

    def list_groups(self) -> list[str] | None:
        future = self._admin.list_consumer_groups(request_timeout=_DESCRIBE_TIMEOUT_S)
        try:
            listed = future.result()
        except KafkaException as exc:
            raise TransientError(f"ListGroups failed: {exc.args[0].str()}") from None
        unsupported = [
            error for error in listed.errors if error.code() == KafkaError._UNSUPPORTED_FEATURE
        ]
        if unsupported and not listed.valid:
            return None
        if listed.errors and not listed.valid:
            raise TransientError(f"ListGroups failed: {listed.errors[0].str()}")
        return sorted({group.group_id for group in listed.valid})
