"""Upserts: which record of a key wins, one rule for every store and for the batch's coalescing.

A record's rank is (log time, topic, partition, offset), compared in that order, where its log
time (`LOG_TIME`, milliseconds) is the newest timestamp of its partition up to and including
it: a running maximum over the partition's offsets, carried from batch to batch in the table's
ledger (`Sink.log_times`). The record of the highest rank wins; a tombstone ranks as a record
does, deletes what it outranks and is remembered, so that no lower record brings its key back.

Why: within a partition a record always outranks every earlier one (its log time never goes
back, and the offset breaks a tie), across partitions the later log time wins, and a rank is
a fixed value of the record and of the log before it. Ranks are totally ordered, so the record
that wins a key is the same however the records are cut into batches, in whatever order the
batches are written and however often they are replayed. Comparing offsets within a
partition and timestamps across (lagless before this rule) is not transitive once timestamps
go back inside a partition (event times, skewed producers, a key that moved partition), and
the winner then depended on the batch size. Where timestamps never go back (LogAppendTime),
the log time is the timestamp and both rules agree.

Rows an earlier lagless stored have no log time: their timestamp stands in for it.
"""

from __future__ import annotations

LOG_TIME = "log_time"
# The rank's columns, most significant first.
RANK = (LOG_TIME, "topic", "partition", "offset")


def _rank_sql(alias: str) -> list[str]:
    a = alias
    return [
        f'COALESCE({a}."{LOG_TIME}", {a}."timestamp")',
        f"COALESCE({a}.\"topic\", '')",  # a tombstone an earlier lagless kept has no topic
        f'{a}."partition"',
        f'{a}."offset"',
    ]


def newer_sql(record: str, held: str) -> str:
    """SQL (SQLite, PostgreSQL, delta-rs's DataFusion): the record aliased `record` outranks
    the row aliased `held`."""
    mine, theirs = _rank_sql(record), _rank_sql(held)
    text = f"{mine[-1]} > {theirs[-1]}"
    for a, b in zip(reversed(mine[:-1]), reversed(theirs[:-1]), strict=True):
        text = f"{a} > {b} OR ({a} = {b} AND ({text}))"
    return f"({text})"


def newest_first_sql(alias: str = "") -> str:
    """SQL ORDER BY terms: the highest rank first."""
    prefix = f"{alias}." if alias else ""
    terms = [
        f'COALESCE({prefix}"{LOG_TIME}", {prefix}"timestamp")',
        f'{prefix}"topic"',
        f'{prefix}"partition"',
        f'{prefix}"offset"',
    ]
    return ", ".join(f"{term} DESC" for term in terms)
