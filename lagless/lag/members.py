"""Who holds which partitions: DescribeGroups, behind a seam so the doctor's reasoning is testable.

Brokers that do not answer DescribeGroups (the embedded broker does not) yield None, and the
doctor says what it could not check.
"""

from __future__ import annotations

from typing import Protocol

from lagless.kafka import TP
from lagless.kafka.config import KafkaConfig
from lagless.kafka.groups import GroupDescription, GroupMember
from lagless.kafka.offset_reader import OffsetReader

# Assignors of the eager protocol: every member gives up all its partitions at each rebalance.
EAGER_ASSIGNORS = frozenset({"range", "roundrobin", "sticky"})
# The states of a group handing its partitions out again, as confluent_kafka names them (and
# as the Kafka protocol does, for brokers reached otherwise).
REBALANCING_STATES = frozenset(
    {"PREPARING_REBALANCING", "COMPLETING_REBALANCING", "PreparingRebalance", "CompletingRebalance"}
)


def rebalancing(description: GroupDescription) -> bool:
    """A rebalance is under way: the broker says so, or every member holds nothing (between
    an eager assignor's revoke and the new assignment, DescribeGroups may already say Stable)."""
    return description.state in REBALANCING_STATES or (
        bool(description.members) and not any(m.partitions for m in description.members)
    )


def held_partitions(description: GroupDescription | None) -> frozenset[TP] | None:
    """The partitions the group's members hold; None when that cannot be told (the broker does
    not answer DescribeGroups, or a rebalance is handing them out)."""
    if description is None or rebalancing(description):
        return None
    return frozenset(p for member in description.members for p in member.partitions)


def assigned_partitions(description: GroupDescription | None) -> list[TP]:
    """Every partition a member holds, for a group that has not committed them yet."""
    if description is None:
        return []
    return sorted({p for member in description.members for p in member.partitions})


class MembershipSource(Protocol):
    def describe(self, group: str) -> GroupDescription | None:
        """The group's members and assignments; None when the broker cannot tell."""
        ...

    def list_groups(self) -> list[str] | None:
        """Every consumer group the broker knows; None when it does not answer ListGroups.

        Raises TransientError when the broker cannot be reached.
        """
        ...

    def close(self) -> None:
        """Last: closes what the source opened (DescribeGroups' child process)."""
        ...


class KafkaMembership:
    """ListGroups and DescribeGroups, asked through the broker-access module."""

    def __init__(self, config: KafkaConfig) -> None:
        self._reader = OffsetReader(config)
        self._cluster = self._reader.cluster

    def describe(self, group: str) -> GroupDescription | None:
        return self._cluster.describe_group(group)

    def list_groups(self) -> list[str] | None:
        return self._cluster.list_groups()

    def close(self) -> None:
        self._reader.close()


__all__ = [
    "EAGER_ASSIGNORS",
    "REBALANCING_STATES",
    "GroupDescription",
    "GroupMember",
    "KafkaMembership",
    "assigned_partitions",
    "held_partitions",
    "rebalancing",
]
