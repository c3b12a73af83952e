"""Issue 61: a maintenance round beside other writers. In an import, any error a round raises
is logged with its cause and the round tried again next time (the import goes on);
`lagless maintain` tries a table other writers keep changing again, then skips it in one line
and goes on to the next table, and exits 75. The store is a stand-in that raises what real
stores raised beside other writers (tests/integration/test_maintenance.py runs the real
ones)."""

from __future__ import annotations

import argparse
import logging

import pytest

from lagless.cli import maintain as maintain_command
from lagless.exceptions import ConcurrentMaintenance, TransientError
from lagless.importer import maintenance as importer_maintenance
from lagless.importer.maintenance import _maintained, run_round
from lagless.sinks.maintenance import Health, Policy, Round, StoreMaintenance


class Failing(StoreMaintenance):
    """Each compaction raises the next of `errors` (None: passes)."""

    def __init__(self, errors: list[Exception | None]) -> None:
        self.errors = errors
        self.tries = 0

    def tables(self, table: str | None = None) -> list[str]:
        return ["a", "b"]

    def compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        self.tries += 1
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        done.compacted_files = 2

    def expire(self, table: str, policy: Policy, done: Round) -> None:
        return None

    def health(self, table: str, policy: Policy) -> Health | None:
        return None


@pytest.mark.parametrize(
    "error",
    [
        # pyiceberg's, in an expiry after another import expired the snapshot first
        ValueError("Snapshot with snapshot id 7 does not exist"),
        KeyError("manifest"),
        RuntimeError("anything a store's library raises"),
    ],
)
def test_an_imports_round_logs_any_error_with_its_cause_and_goes_on(
    error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    store = Failing([error])
    with caplog.at_level(logging.WARNING):
        assert run_round(store, "a", Policy(), deadline=0) is None
    assert type(error).__name__ in caplog.text and "tried again next round" in caplog.text
    again = run_round(store, "a", Policy(), deadline=0)  # the next round
    assert again is not None and again.compacted_files == 2


def test_maintain_tries_a_conflicted_table_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importer_maintenance.time, "sleep", lambda _: None)
    store = Failing([ConcurrentMaintenance("a commit refused"), None])
    done = _maintained(store, "a", Policy())
    assert store.tries == 2 and done.compacted_files == 2 and not done.conflicted


def test_maintain_skips_a_table_others_keep_changing_goes_on_and_exits_75(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(importer_maintenance.time, "sleep", lambda _: None)
    tries = importer_maintenance.MAINTAIN_ATTEMPTS
    store = Failing([ConcurrentMaintenance("vacuum's commit refused")] * tries)
    rounds = [_maintained(store, table, Policy()) for table in store.tables()]
    assert rounds[0].conflicted and "vacuum's commit refused" in rounds[0].text()
    assert not rounds[1].conflicted and rounds[1].compacted_files == 2  # the next table

    monkeypatch.setattr(maintain_command, "maintain_once", lambda *_: rounds)
    args = argparse.Namespace(
        sink="delta:///x", table=None, target_file_size=1024, keep_history=1.0, json=False
    )
    with pytest.raises(TransientError, match="a: other writers kept changing them"):
        maintain_command.handle(args)
    printed = capsys.readouterr().out
    assert "a: skipped: vacuum's commit refused" in printed and "b: 2 files" in printed


def test_a_stop_is_not_a_failed_round() -> None:
    with pytest.raises(KeyboardInterrupt):
        run_round(Failing([KeyboardInterrupt()]), "a", Policy(), deadline=0)  # type: ignore[list-item]
