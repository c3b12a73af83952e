"""The lag table's columns, its All row, and the in-place redraw of --watch."""

from __future__ import annotations

import io
from collections.abc import Sequence

import pytest
from rich.console import Console

from lagless.cli.lag import watch
from lagless.cli.main import main
from lagless.lag.offsets import PartitionSample, RecordInfo
from lagless.lag.report import History, build_report
from lagless.lag.simulate import parse_lag_table
from lagless.lag.table import COLUMNS, markdown_table, rich_table, table_cells


def report_of(*latest: tuple[int, int | None, int]):
    history = History(keep_s=10)
    history.add(PartitionSample("t", p, 100.0, committed, 0, end) for p, committed, end in latest)
    records = {("t", 2): RecordInfo(timestamp_s=40.0, size_bytes=10)}
    return build_report("g", history, 5, records)


def test_columns_follow_the_seed_with_the_all_row_first() -> None:
    cells = table_cells(
        report_of((0, 13440162, 22937322), (1, 22613778, 22613778), (2, None, 9)), now=100.0
    )
    assert COLUMNS[:4] == ("partition", "lag", "pos", "end")
    assert cells[0][:4] == (
        "All",
        f"{9497160 + 9:,}",
        f"{13440162 + 22613778:,}",
        f"{22937322 + 22613778 + 9:,}",
    )
    assert cells[1][:4] == ("0", "9,497,160", "13,440,162", "22,937,322")
    assert cells[3][:5] == ("2", "9", "-", "9", "60.0"), "time lag from the record's timestamp"
    assert cells[2][4:] == ("0.0", "OK")


def test_time_lag_is_exact_where_the_committed_record_is_known() -> None:
    """Interpolating the end offsets says 5 s here (offset 10 was the end at t=95); the record
    at the committed offset says it was written at t=40: the record wins, the other partition
    keeps the interpolation."""
    history = History(keep_s=10)
    for at, end in ((95.0, 10), (100.0, 20)):
        history.add(PartitionSample("t", p, at, 10, 0, end) for p in (0, 1))
    records = {("t", 0): RecordInfo(timestamp_s=40.0, size_bytes=10)}
    seconds = {
        row.partition: row.lag_seconds(100.0)[0]
        for row in build_report("g", history, 5, records).rows
    }
    assert seconds == {0: 60.0, 1: 5.0}


def test_rich_table_has_the_columns_in_order() -> None:
    out = io.StringIO()
    Console(file=out, width=120).print(rich_table(report_of((0, 1, 5)), 100.0))
    header = next(line for line in out.getvalue().splitlines() if "partition" in line)
    positions = [header.index(name) for name in COLUMNS]
    assert positions == sorted(positions)


def test_the_printed_table_reads_back_as_simulator_input() -> None:
    """What `lagless lag` prints (box drawing, a title above), pasted as it is."""
    out = io.StringIO()
    Console(file=out, width=120).print(
        rich_table(report_of((0, 3, 10), (1, 10, 10), (2, None, 4)), 100.0)
    )
    assert parse_lag_table(f"$ lagless lag --group g\n{out.getvalue()}\nmore text") == [7, 0, 4]


def test_markdown_table_reads_back_as_simulator_input() -> None:
    table = markdown_table(report_of((0, 3, 10), (1, 10, 10), (2, None, 4)), 100.0)
    assert parse_lag_table(table) == [7, 0, 4]


class ScriptedSource:
    """Offsets that move by one each sample; the third sleep is the user's Ctrl-C."""

    def __init__(self) -> None:
        self.samples_taken = 0

    def sample(self) -> list[PartitionSample]:
        self.samples_taken += 1
        return [PartitionSample("t", 0, float(self.samples_taken), self.samples_taken, 0, 50)]

    by_lagless = False
    description = None

    def record_at(self, samples: Sequence[PartitionSample]) -> dict[tuple[str, int], RecordInfo]:
        return {}

    def follow(self, partitions: object) -> None:
        """Every partition is sampled already."""

    def close(self) -> None:
        """Nothing to release."""


def test_watch_redraws_in_place_until_ctrl_c() -> None:
    source = ScriptedSource()
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, height=40)
    watch("g", source, 0.5, 5.0, console, sleep=sleep)

    text = out.getvalue()
    assert sleeps == [0.5, 0.5, 0.5]
    assert source.samples_taken == 3
    assert "\x1b[1A" in text or "\x1b[2K" in text, "cursor moves up to redraw in place"
    assert "49" in text and "48" in text and "47" in text, "each redraw shows the new lag"


@pytest.mark.parametrize("interval", ["0", "nan", "inf"])
def test_watch_rejects_a_non_positive_interval(
    capsys: pytest.CaptureFixture[str], interval: str
) -> None:
    assert main(["lag", "--bootstrap", "x:1", "--group", "g", "--watch", interval]) == 2
    assert (
        capsys.readouterr().err == "lagless: error: --watch must be a positive number of seconds\n"
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["lag", "--window", "nan"], "--window cannot be negative"),
        (["doctor", "--seconds", "nan"], "--seconds must be positive"),
        (["doctor", "--seconds", "inf"], "--seconds must be positive"),
    ],
)
def test_a_window_of_nan_is_bad_input(
    capsys: pytest.CaptureFixture[str], args: list[str], error: str
) -> None:
    """NaN passes every `< 0` check (each comparison with it is false): it was judged over
    (lag, exit 0) or failed unexpectedly (doctor, exit 1)."""
    assert main([*args, "--bootstrap", "x:1", "--group", "g"]) == 2
    assert capsys.readouterr().err == f"lagless: error: {error}\n"
