"""Where a reader stands against the log: offsets it has not read that the log no longer holds.

Three ways, as Spark's Kafka source reports data loss (KafkaOffsetReader's
getOffsetRangesFromResolvedOffsets): offsets deleted by retention before they were read; a
position beyond the log's end, which only a recreated topic (or a truncated log) explains; a
partition that is gone. failOnDataLoss=true fails on any of them. Under false, Spark goes on
from the log's end, past the new log's records; lagless reads the new log from its start.
"""

from __future__ import annotations

from dataclasses import dataclass

from lagless.kafka import TP, Offsets


@dataclass(frozen=True)
class Lost:
    """A partition whose reader stood at `at`; the log now holds [log_start, log_end), or
    nothing (None: the partition is gone)."""

    tp: TP
    at: int
    log_start: int | None
    log_end: int | None

    @property
    def resume_at(self) -> int | None:
        """Where reading goes on under failOnDataLoss=false; None: nowhere, the partition is
        gone."""
        return self.log_start

    @property
    def skipped_range(self) -> tuple[int, int]:
        """Offsets never to be read, [first, end): those retention deleted before the reader
        came; for a recreated log, those of the new log deleted already (it starts at 0)."""
        if self.log_start is None or self.log_end is None:
            return 0, 0
        return (0 if self.at > self.log_end else self.at), self.log_start

    @property
    def skipped(self) -> int:
        first, end = self.skipped_range
        return end - first

    def __str__(self) -> str:
        where = f"{self.tp[0]}[{self.tp[1]}]"
        if self.log_start is None or self.log_end is None:
            return f"{where} is gone (it was read up to offset {self.at})"
        if self.at > self.log_end:
            return (
                f"{where}: offset {self.at} is beyond the log's end {self.log_end} "
                "(was the topic recreated?)"
            )
        return f"{where}: offsets {self.at}..{self.log_start} were deleted before lagless read them"


def lost_offsets(start: Offsets, low: Offsets, high: Offsets) -> list[Lost]:
    """Each partition of `start` the log no longer holds from there, by partition."""
    lost = []
    for tp, at in sorted(start.items()):
        if tp not in high:
            lost.append(Lost(tp, at, None, None))
        elif at > high[tp] or at < low[tp]:
            lost.append(Lost(tp, at, low[tp], high[tp]))
    return lost


def resumed(start: Offsets, lost: list[Lost]) -> Offsets:
    """`start` where reading goes on past what is lost: gone partitions dropped."""
    moved = dict(start)
    for each in lost:
        if each.resume_at is None:
            moved.pop(each.tp, None)
        else:
            moved[each.tp] = each.resume_at
    return moved
