"""The driver's plan: which offsets each task reads, and how far one micro-batch goes."""

from lagless.planner.limit import fewest_partitions, limit_batch, rate_limit
from lagless.planner.ranges import OffsetRange, record_sizes
from lagless.planner.split import plan_tasks

__all__ = [
    "OffsetRange",
    "fewest_partitions",
    "limit_batch",
    "plan_tasks",
    "rate_limit",
    "record_sizes",
]
