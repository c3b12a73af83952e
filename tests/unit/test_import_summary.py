"""What an import says when it ends (progress/collector.py): where the rows went, what was
imported, what the table held before, "up to date" or how far behind; a followed topic's line
per batch on a terminal only."""

from __future__ import annotations

import io

from rich.console import Console

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
        "  held before     offsets below orders[0]=50",
        "up to date",
    ]


def test_nothing_new_says_so_and_ends_up_to_date() -> None:
    held = {("orders", p): 1_000 for p in range(6)}
    lines = summary_text(summary(held_before=held)).splitlines()
    assert lines[1:] == [
        "  imported        nothing new",
        "  held before     offsets below 6,000 in all, on 6 partitions",
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


def collector(terminal: bool, follow: bool) -> tuple[RichCollector, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=200)
    bar = Console(file=io.StringIO(), force_terminal=False)
    made = RichCollector(bar, follow=follow)
    made.summary_console = console
    return made, out


def test_a_followed_topic_prints_a_line_per_batch_on_a_terminal_only() -> None:
    for terminal in (True, False):
        made, out = collector(terminal, follow=True)
        made.start(100)
        done = summary()
        done.add_batch({("orders", 0): 60}, 600, 60, {})
        made.batch(done, 40)
        made.finish(done)
        lines = out.getvalue().splitlines()
        progress = [line for line in lines if "records/s" in line and "behind 40" in line]
        assert len(progress) == (1 if terminal else 0), lines
        assert lines[-1] == "up to date"
