"""How the suite is split between pytest-xdist's workers (scripts/test runs `-n N --dist
loadgroup`), decided here once, from what each test uses, so a new test needs no marker.

- **Groups**: a test using a fixture of module, class or package scope (one Debezium run, one
  `serve`, one broker for many assertions) runs on the same worker as every other test using
  it: the group is where that fixture is defined. A test may also carry its own
  `@pytest.mark.xdist_group("name")`, which wins. Every other test is free: each worker has its
  own session fixtures (`spark`, `postgres`, `noida`, `s3`, `connect_server`; their ports and
  folders are picked free), so they run anywhere.
- **Order**: the slowest work first, by the durations recorded in tests/durations.json (a test
  not in it counts as 0.5 s in tests/unit, 15 s elsewhere), so that the last minutes are not
  one long test on one worker while the other idles. A group keeps its tests together and in
  their own order.
- **Recording**: `LAGLESS_RECORD_DURATIONS=tests/durations.json ./scripts/test ...` writes
  each test's setup + call + teardown seconds there (merged with what the file held), for the
  next run to order by.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"
RECORD = "LAGLESS_RECORD_DURATIONS"
GROUP_MARK = "xdist_group"
# The workers' key (workerinput) for the file they write their groups into.
GROUPS_FILE = "lagless_groups_file"
# The distributions GroupWork schedules (the others, loadfile, loadscope, each, are xdist's).
DISTS = ("load", "loadgroup")
SHARED_SCOPES = ("module", "class", "package")
# Seconds a test not in tests/durations.json is taken to need.
UNIT_GUESS_S = 0.5
OTHER_GUESS_S = 15.0


def recorded(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def shared_fixture_group(item: pytest.Item) -> str | None:
    """Where the first fixture of module/class/package scope the test uses is defined."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        for definition in info.name2fixturedefs.get(name, ()):
            if definition.scope in SHARED_SCOPES:
                return f"{definition.baseid or 'root'}::{name}"
    return None


def assign_groups(items: Iterable[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker(GROUP_MARK) is None:
            group = shared_fixture_group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))


def group_of(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker(GROUP_MARK)
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def slowest_first(items: list[pytest.Item], seconds: dict[str, float]) -> list[pytest.Item]:
    """Units (a group's tests together, or one free test) ordered by their recorded seconds,
    the longest first; ties keep the collection's order."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(group_of(item) or item.nodeid, []).append(item)
    cost = {
        key: sum(seconds.get(i.nodeid, guessed(i.nodeid)) for i in tests)
        for key, tests in units.items()
    }
    ordered = sorted(units, key=lambda key: -cost[key])
    return [item for key in ordered for item in units[key]]


def guessed(nodeid: str) -> float:
    """A test's seconds when none were recorded: a unit test's are few, the others' many."""
    return UNIT_GUESS_S if nodeid.startswith("tests/unit/") else OTHER_GUESS_S


class DurationRecorder:
    """Sums each test's phases as reports arrive (on xdist's controller, from every worker)
    and writes them, merged with the file's, when the session ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid
        self.seconds[nodeid] = round(self.seconds.get(nodeid, 0.0) + report.duration, 2)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.seconds or hasattr(session.config, "workerinput"):
            return
        merged = {**recorded(self.path), **self.seconds}
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")


def write_groups(config: pytest.Config, items: Iterable[pytest.Item]) -> None:
    """On a worker: each grouped test's group, for the controller's scheduler (GroupWork)."""
    worker: dict[str, Any] = getattr(config, "workerinput", {})
    where = worker.get(GROUPS_FILE)
    if where is None:
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
    partial = Path(f"{where}.{worker['workerid']}")
    partial.write_text(json.dumps(groups))
    os.replace(partial, where)  # every worker writes the same; the last whole one stays


class GroupWork:
    """On the controller of `-n N [--dist loadgroup]`: xdist's own loadgroup scheduler reads the
    group from a suffix it adds to each test's id, which pytest 9 no longer lets it add, so the
    workers write their groups to a file instead and this scheduler reads it: a group is one
    unit of work, every other test a unit of its own, sent in the collection's order."""

    def __init__(self) -> None:
        handle, name = tempfile.mkstemp(prefix="lagless-groups-", suffix=".json")
        os.close(handle)
        self.path = Path(name)

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[GROUPS_FILE] = str(self.path)

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling

        path = self.path

        class ByGroup(LoadScopeScheduling):
            groups: dict[str, str] | None = None

            def _split_scope(self, nodeid: str) -> str:
                if self.groups is None:
                    self.groups = {str(k): str(v) for k, v in recorded_groups(path).items()}
                return self.groups.get(nodeid, nodeid)

        return ByGroup(config, log)

    def pytest_unconfigure(self) -> None:
        self.path.unlink(missing_ok=True)


def recorded_groups(path: Path) -> dict[str, Any]:
    try:
        groups = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return groups if isinstance(groups, dict) else {}


def configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    where = os.environ.get(RECORD)
    if where:
        config.pluginmanager.register(DurationRecorder(Path(where)), "lagless-durations")
    # `-n N` alone distributes by `load`: its groups are kept too (a module fixture set up on
    # two workers would run its tests out of their order).
    if config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") in DISTS:
        config.pluginmanager.register(GroupWork(), "lagless-groups")
