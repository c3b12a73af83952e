"""What an import says when it ends (progress/collector.py): where the rows went, what was
imported, what the table held before, "up to date" or how far behind; a followed topic's lines:
per batch on a terminal, per minute at most elsewhere."""

from __future__ import annotations

import io
import os
from unittest import mock

from rich.console import Console

from lagless import logs
from lagless.progress import RichCollector, Summary
from lagless.progress.collector import summary_text


def summary(**over: object) -> Summary:
    done = Summary(destination="/data/out.db", table="orders", topics=("orders",))
    for name, value in over.items():
        setattr(done, name, value)
    return done


def test_a_summary_names_the_destination_what_was_imported_and_what_was_held() -> None:
    done = summary(held_before={("orders", 0): 50, ("orders", 1): 0}, seconds=2.0)
    done.add_batch({("orders", 0): 60, ("orders", 1): 40}, 2_000_000, 100, {})
    assert summary_text(done).splitlines() == [
        "lagless import: orders -> table 'orders' of /data/out.db",
        "  imported        100 records (2.0 MB) in 2.0 s, 50 records/s",
        "  rows written    100",
        "  held before     orders[0] up to offset 49",
        "up to date",
    ]


def test_nothing_new_says_so_and_ends_up_to_date() -> None:
    held = {("orders", p): 1_000 + p for p in range(6)}
    lines = summary_text(summary(held_before=held)).splitlines()
    assert lines[1:] == [
        "  imported        nothing new",
        "  held before     orders[0] up to offset 999, orders[1] up to 1,000, orders[2] up to "
        "1,001, orders[3] up to 1,002 and 2 more partitions (6,015 offsets in all)",
        "up to date",
    ]


def test_an_import_stopped_short_says_how_far_behind() -> None:
    done = summary(behind=1_234, dead_lettered_by_reason={"invalid_json": 2}, dead_lettered=2)
    lines = summary_text(done).splitlines()
    assert "  dead-lettered   2 (invalid_json 2)" in lines
    assert lines[-1] == "behind by 1,234 records; a rerun resumes"


def test_json_has_the_summary_keys() -> None:
    body = summary(held_before={("orders", 0): 5}).as_dict()
    assert body["destination"] == "/data/out.db" and body["table"] == "orders"
    assert body["held_before"] == {"orders[0]": 5} and body["up_to_date"] is True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def collector(terminal: bool, follow: bool) -> tuple[RichCollector, io.StringIO, Clock]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=200)
    bar = Console(file=io.StringIO(), force_terminal=False)
    clock = Clock()
    made = RichCollector(bar, clock, follow=follow)
    made.summary_console = console
    return made, out, clock


def follow_batches(made: RichCollector, clock: Clock, batches: list[tuple[float, int]]) -> Summary:
    """Batches of (seconds since the start, records), each leaving 40 behind."""
    done = summary()
    made.start(100)
    for at, records in batches:
        clock.now = at
        done.add_batch({("orders", 0): records}, records * 10, records, {})
        made.batch(done, 40)
    made.finish(done)
    return done


def test_a_followed_topic_on_a_terminal_prints_a_line_per_batch() -> None:
    """The first batch carries Spark's start (20 s of it here): it gets no rate, which would
    read 3 records/s; the next get the rate of the batches after it."""
    made, out, clock = collector(terminal=True, follow=True)
    follow_batches(made, clock, [(20.0, 60), (21.0, 1_000), (22.0, 1_000)])
    lines = out.getvalue().splitlines()
    assert "following the topics, 100 records behind: a line per batch" in lines[0]
    assert lines[1].endswith(
        "batch of 60 records  (the first: Spark's start in it)  behind 40  imported 60"
    )
    assert lines[2].endswith("batch of 1,000 records  1,000 records/s  behind 40  imported 1,060")
    assert lines[3].endswith("1,000 records/s  behind 40  imported 2,060")
    assert lines[-1] == "up to date"


def test_a_followed_topic_in_a_file_prints_a_line_per_minute_at_most() -> None:
    """stdout redirected (a supervisor's log): the first batch's line at once, so the file
    shows the import is under way, then at most a line per LINE_EVERY_S for the batches since
    the last; the first line names the log, where every batch is."""
    made, out, clock = collector(terminal=False, follow=True)
    logs_file = "/var/log/lagless/orders.log"
    with mock.patch.object(logs, "log_file", return_value=logs_file):
        batches = [(20.0, 60)] + [(20.0 + s, 100) for s in range(1, 91)]
        follow_batches(made, clock, batches)
    lines = out.getvalue().splitlines()
    progress = [line for line in lines if "behind 40" in line]
    assert len(progress) == 2, lines
    assert "following the topics, 100 records behind: a line per 60 s at most" in lines[0]
    assert f"every batch in the log, {logs_file} (pid {os.getpid()})" in lines[0]
    assert "batch of 60 records  (the first" in progress[0]
    # 60 s after the first line: the 60 batches since, at their rate.
    assert progress[1].endswith(
        "60 batches, 6,000 records  100 records/s  behind 40  imported 6,060"
    )
    assert lines[-1] == "up to date"
