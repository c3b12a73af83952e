"""Who holds which partitions: DescribeGroups, behind a seam so the doctor's reasoning is testable.

Brokers that do not answer DescribeGroups (the embedded broker does not) yield None, and the
doctor says what it could not check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from lagless.kafka.config import KafkaConfig

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
