"""A consumer group as the broker describes it (DescribeGroups): lagless's own shape of the
answer, which kafka/cluster_info.py asks for and kafka/group_describer.py's child process
builds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lagless.kafka import TP


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
