"""The drain simulator reproduces seed 000's narrative; bad input is one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from lagless.cli.main import main
from lagless.exceptions import BadInput
from lagless.lag.chart import write_chart
from lagless.lag.simulate import (
    RECORD_UNITS,
    TIME_UNITS,
    assign_range,
    assign_roundrobin,
    assign_sticky,
    format_duration,
    ideal_drain_s,
    parse_counts,
    parse_lag_table,
    scale_for,
    simulate_all,
    simulate_group,
    simulate_planner,
)

# Seed 000's first lag table, partitions 0..23 in the order listed.
SEED_000 = [
    9497160, 9478898, 9460836, 9480060, 9494178, 9545021, 9418620, 9522299,
    9239384, 9324698, 9275058, 9314988, 5352228, 5406157, 5364081, 5441238,
    0, 0, 0, 0, 0, 0, 0, 0,
]  # fmt: skip
RATE = 10_000.0
DATA = Path(__file__).parent.parent / "data"
SEED_TABLE = """\
| partition | lag | pos | end | posOffset |?endOffset?|
| --- | ---: | ---: | ---: | ---: | ---: |
|All|134614904|410913682|545528586|13325484|22937322|
""" + "".join(f"|{p}|{lag}|1|2|1|2|\n" for p, lag in enumerate(SEED_000))


def test_blocking_consumers_shrink_rebalance_by_rebalance_to_two_carrying_everything() -> None:
    drain = simulate_group(SEED_000, 16, "range", RATE, blocking_timeout_s=60)
    sizes = [len(rebalance.assignment) for rebalance in drain.rebalances]
    assert sizes == [16, 8, 6, 4, 3, 2, 1]
    two = drain.rebalances[5]
    assert two.assignment == {0: tuple(range(12)), 1: tuple(range(12, 24))}, "t0: p0..p11"
    assert [rebalance.at_s for rebalance in drain.rebalances[:6]] == [0, 60, 120, 180, 240, 300]
    left_at_two = next(left for t, left in drain.curve if t == two.at_s)
    assert left_at_two > 0.8 * sum(SEED_000), "the two carry the whole backlog"
    assert drain.drain_s > 10 * ideal_drain_s(SEED_000, 16, RATE)


def test_range_without_blocking_leaves_8_of_16_idle_from_the_start() -> None:
    drain = simulate_group(SEED_000, 16, "range", RATE)
    (start,) = drain.rebalances
    idle = [c for c, parts in start.assignment.items() if all(SEED_000[p] == 0 for p in parts)]
    assert idle == list(range(8, 16))
    # The 8 busy consumers each drain two of p0..p15 alone: about twice the ideal.
    slowest = max(SEED_000[2 * c] + SEED_000[2 * c + 1] for c in range(8)) / RATE
    assert drain.drain_s == pytest.approx(slowest)
    assert drain.drain_s / ideal_drain_s(SEED_000, 16, RATE) == pytest.approx(2.26, abs=0.01)


def test_lagless_planner_drains_close_to_the_ideal_and_ahead_of_range() -> None:
    ideal = ideal_drain_s(SEED_000, 16, RATE)
    drains = {d.name: d.drain_s for d in simulate_all(SEED_000, 16, RATE, 60)}
    assert drains["lagless planner"] / ideal < 1.01
    assert drains["roundrobin, fetching"] / ideal > 1.1, (
        "the 4 consumers of half-lagged partitions idle"
    )
    assert drains["lagless planner"] <= min(drains.values()) + 1e-6
    assert drains["range, blocking 60 s"] > 10 * drains["lagless planner"]
    assert drains["range, fetching"] > 1.9 * drains["lagless planner"]


def test_every_strategy_drains_the_whole_backlog() -> None:
    for drain in simulate_all(SEED_000, 16, RATE, 60):
        assert drain.curve[0] == (0.0, sum(SEED_000))
        assert drain.curve[-1] == (pytest.approx(drain.drain_s), pytest.approx(0, abs=1))
        lefts = [left for _, left in drain.curve]
        assert lefts == sorted(lefts, reverse=True)
    # Pieces of the target size 20: 20 | 10 + 10 on two slots, the ideal.
    planner = simulate_planner([10, 30], 2, 10.0)
    assert planner.drain_s == pytest.approx(2.0)


def test_assignors() -> None:
    assert assign_range([0, 1, 2], 7) == {0: (0, 1, 2), 1: (3, 4), 2: (5, 6)}
    assert assign_roundrobin([0, 1, 2], 7) == {0: (0, 3, 6), 1: (1, 4), 2: (2, 5)}
    previous = {0: (0, 3), 1: (1, 4), 2: (2, 5)}
    assert assign_sticky([0, 2], 6, previous) == {0: (0, 1, 3), 2: (2, 4, 5)}


def test_parse_counts_and_the_pasted_seed_table() -> None:
    assert parse_counts("3, 0,12") == [3, 0, 12]
    assert parse_lag_table(SEED_TABLE) == SEED_000
    for bad in ("1,x", "1,,2", "-4", ""):
        with pytest.raises(BadInput):
            parse_counts(bad)
    with pytest.raises(BadInput, match="found no table with 'partition' and 'lag' columns"):
        parse_lag_table("|a|b|\n|1|2|")
    with pytest.raises(BadInput, match="no partition number and lag"):
        parse_lag_table("| partition | lag |\n|0|many|")


def test_the_field_report_as_pasted_reads_its_first_table() -> None:
    """Field report 000's lines as written: prose, the `stream.sh lag` command and its heading
    lines, the table, more prose and a later table."""
    text = (DATA / "field_report_000_lag.txt").read_text()
    assert parse_lag_table(text) == SEED_000


def test_text_without_a_lag_table_says_what_to_paste() -> None:
    """Field report 002 tells its lag in prose ("partition 7 ... nearly 2000 messages")."""
    text = (DATA / "field_report_002_lagging.txt").read_text()
    with pytest.raises(BadInput, match=r"no table .* `stream.sh lag`.* --counts"):
        parse_lag_table(text)


def test_cli_prints_each_strategy_and_writes_the_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "lag.md"
    table.write_text(SEED_TABLE)
    png = tmp_path / "drain.png"
    assert (
        main(["simulate", "--lag-table", str(table), "--consumers", "16", "--png", str(png)]) == 0
    )
    out = capsys.readouterr().out
    assert "range, blocking 60 s" in out and "16 -> 8 -> 6 -> 4 -> 3 -> 2 -> 1" in out
    assert "lagless planner" in out and "ideal 14m01s" in out
    assert png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--counts", "5,x", "--consumers", "2"], "--counts: 'x' is not a whole number"),
        (["--counts", "5,6", "--consumers", "0"], "argument --consumers: must be at least 1"),
        (["--lag-table", "/nonexistent/lag.md", "--consumers", "2"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lagless: error: {error}")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0.00025, "0.00025s"),
        (0.357, "0.357s"),
        (12.34, "12.3s"),
        (245, "4m05s"),
        (3723, "1h02m03s"),
    ],
)
def test_a_drain_time_is_said_in_the_unit_its_size_asks_for(seconds: float, said: str) -> None:
    """Issue 34.4: at demo scale every strategy read 0m00s."""
    assert format_duration(seconds) == said


def test_the_chart_axes_take_the_unit_the_input_fills() -> None:
    assert scale_for(0.9, TIME_UNITS) == ("seconds", 1.0)
    assert scale_for(600, TIME_UNITS) == ("minutes", 60.0)
    assert scale_for(30_000, TIME_UNITS) == ("hours", 3600.0)
    assert scale_for(70_000, RECORD_UNITS) == ("thousands", 1e3)  # not 0.07 millions
    assert scale_for(90_000_000, RECORD_UNITS) == ("millions", 1e6)
    assert scale_for(500, RECORD_UNITS) == ("", 1.0)


def test_every_strategy_is_drawn_with_a_marker_of_its_own(tmp_path, monkeypatch) -> None:
    """Lines that coincide (sticky and roundrobin drain alike) stay visible by their markers,
    which fall at points of their own."""
    import matplotlib.axes

    drawn: list[dict[str, object]] = []
    plot = matplotlib.axes.Axes.plot

    def recording(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        drawn.append(kwargs)
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", recording)
    backlog = [3000, 2000, 0, 500, 1200, 0, 0, 4000]
    drains = simulate_all(backlog, 3, 10_000.0, 60.0)
    write_chart(drains, ideal_drain_s(backlog, 3, 10_000.0), tmp_path / "c.png", "t")

    assert len(drawn) == len(drains) == 7
    assert len({(d["marker"], d["markevery"]) for d in drawn}) == 7
