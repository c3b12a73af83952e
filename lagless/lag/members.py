"""Who holds which partitions: DescribeGroups, behind a seam so the doctor's reasoning is testable.

Brokers that do not answer DescribeGroups (the embedded broker does not) yield None, and the
doctor says what it could not check.
"""

from __future__ import annotations

from typing import Protocol

from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import GroupDescription, GroupMember, OffsetReader

# Assignors of the eager protocol: every member gives up all its partitions at each rebalance.
EAGER_ASSIGNORS = frozenset({"range", "roundrobin", "sticky"})


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
    """ListGroups and DescribeGroups, asked through the broker-access module."""

    def __init__(self, config: KafkaConfig) -> None:
        self._broker = OffsetReader(config)

    def describe(self, group: str) -> GroupDescription | None:
        return self._broker.describe_group(group)

    def list_groups(self) -> list[str] | None:
        return self._broker.list_groups()


__all__ = ["EAGER_ASSIGNORS", "GroupDescription", "GroupMember", "KafkaMembership"]
