"""How scripts/test splits the suite between pytest-xdist's workers (tests/harness/schedule.py):
groups from the fixtures a test uses, the slowest work first, recorded durations."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.harness import schedule


@dataclass
class FakeItem:
    """What schedule.py reads of a pytest item."""

    nodeid: str
    marks: dict[str, Any] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> Any:
        return self.marks.get(name)

    def add_marker(self, mark: Any) -> None:
        self.marks[mark.name] = mark.mark


def grouped(nodeid: str, group: str) -> FakeItem:
    return FakeItem(nodeid, {"xdist_group": pytest.mark.xdist_group(group).mark})


def test_a_group_stays_together_in_its_order_and_the_costliest_work_goes_first() -> None:
    items = [
        FakeItem("tests/unit/test_a.py::quick"),
        grouped("tests/integration/test_b.py::first", "b"),
        FakeItem("tests/integration/test_c.py::alone"),
        grouped("tests/integration/test_b.py::second", "b"),
        FakeItem("tests/unit/test_a.py::slow"),
    ]
    seconds = {
        "tests/integration/test_b.py::first": 10.0,
        "tests/integration/test_b.py::second": 10.0,
        "tests/integration/test_c.py::alone": 30.0,
        "tests/unit/test_a.py::slow": 25.0,
    }
    ordered = schedule.slowest_first(items, seconds)  # type: ignore[arg-type]
    assert [i.nodeid for i in ordered] == [
        "tests/integration/test_c.py::alone",  # 30 s
        "tests/unit/test_a.py::slow",  # 25 s
        "tests/integration/test_b.py::first",  # the group: 20 s, in its own order
        "tests/integration/test_b.py::second",
        "tests/unit/test_a.py::quick",  # not recorded: a unit test's guess
    ]


def test_without_durations_other_tests_go_before_unit_tests() -> None:
    items = [FakeItem("tests/unit/test_a.py::x"), FakeItem("tests/integration/test_b.py::y")]
    ordered = schedule.slowest_first(items, {})  # type: ignore[arg-type]
    assert [i.nodeid for i in ordered] == [
        "tests/integration/test_b.py::y",
        "tests/unit/test_a.py::x",
    ]


def test_a_test_using_a_module_fixture_joins_its_group_and_a_marked_one_keeps_its_own(
    request: pytest.FixtureRequest,
) -> None:
    """This very test uses no fixture of module scope: it stays free."""
    assert schedule.shared_fixture_group(request.node) is None
    mine = grouped("tests/x.py::t", "mine")
    schedule.assign_groups([mine])  # type: ignore[list-item]
    assert schedule.group_of(mine) == "mine"  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shared_thing() -> int:
    return 1


def test_a_module_fixture_names_the_group(
    request: pytest.FixtureRequest, shared_thing: int
) -> None:
    group = schedule.shared_fixture_group(request.node)
    assert group == "tests/unit/test_schedule.py::shared_thing"


def test_recorded_durations_are_merged_into_the_file(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"a": 1.0, "b": 2.0}))
    recorder = schedule.DurationRecorder(path)
    for when, seconds in (("setup", 0.5), ("call", 3.0), ("teardown", 0.25)):
        recorder.pytest_runtest_logreport(FakeReport("b", when, seconds))  # type: ignore[arg-type]
    recorder.pytest_runtest_logreport(FakeReport("c", "call", 1.0))  # type: ignore[arg-type]
    recorder.pytest_sessionfinish(FakeSession())  # type: ignore[arg-type]
    assert schedule.recorded(path) == {"a": 1.0, "b": 3.75, "c": 1.0}


def test_unreadable_durations_are_none() -> None:
    assert schedule.recorded(Path("/nonexistent/durations.json")) == {}


@dataclass
class FakeReport:
    nodeid: str
    when: str
    duration: float


class FakeSession:
    config = object()
