"""The Delta ledger as AppTransactions keeps it (sinks/delta/log.py): read once through delta-rs,
then brought to each later version by the entries in between. Whatever other writers commit
(application transactions, appends without any, checkpoints with the older entries gone, the
table made again under the same name), it answers what delta-rs answers, on real tables."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lagless.sinks.delta import log
from lagless.sinks.delta.log import LOG, AppTransactions
from lagless.sinks.storage import LocalStorage

APPS = [f"lagless:t:{p}" for p in range(4)]


def commit(path: Path, transactions: dict[str, int]) -> None:
    """An append of one row, with these application transactions (none: a plain append)."""
    write_deltalake(
        str(path),
        pa.table({"x": [1]}),
        mode="append",
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app, version) for app, version in transactions.items()]
        ),
    )


def delta_rs(path: Path) -> dict[str, int | None]:
    delta = DeltaTable(str(path))
    return {app: delta.transaction_version(app) for app in APPS}


def asked_of(delta: DeltaTable) -> list[str]:
    """The app ids delta-rs is asked about from now on, as they are asked."""
    asked: list[str] = []
    original = delta.transaction_version

    def counted(app: str) -> int | None:
        asked.append(app)
        return original(app)

    delta.transaction_version = counted  # type: ignore[method-assign,assignment]
    return asked


def known(ledger: AppTransactions, path: Path) -> dict[str, int | None]:
    return ledger.versions(DeltaTable(str(path)), str(path), APPS)


def test_entries_after_the_version_read_are_applied_without_asking_delta_rs(
    tmp_path: Path,
) -> None:
    table = tmp_path / "t"
    commit(table, {APPS[0]: 10})
    ledger = AppTransactions(LocalStorage())
    assert known(ledger, table) == {APPS[0]: 10, APPS[1]: None, APPS[2]: None, APPS[3]: None}
    commit(table, {APPS[1]: 7})
    commit(table, {})
    commit(table, {APPS[0]: 12, APPS[3]: 1})
    delta = DeltaTable(str(table))
    asked = asked_of(delta)
    assert ledger.versions(delta, str(table), APPS) == delta_rs(table)
    assert asked == []  # the three entries were read, not the whole log again


def test_a_table_made_again_under_the_same_name_is_read_in_full(tmp_path: Path) -> None:
    table = tmp_path / "t"
    commit(table, {APPS[0]: 10})
    commit(table, {APPS[1]: 3})
    ledger = AppTransactions(LocalStorage())
    assert known(ledger, table)[APPS[0]] == 10
    shutil.rmtree(table)
    for _ in range(4):  # past the version read: its entries alone would tell another story
        commit(table, {APPS[2]: 5})
    assert (
        known(ledger, table)
        == delta_rs(table)
        == {
            APPS[0]: None,
            APPS[1]: None,
            APPS[2]: 5,
            APPS[3]: None,
        }
    )


def test_entries_the_log_no_longer_holds_are_read_from_its_checkpoint(tmp_path: Path) -> None:
    table = tmp_path / "t"
    commit(table, {APPS[0]: 1})
    ledger = AppTransactions(LocalStorage())
    assert known(ledger, table)[APPS[1]] is None
    commit(table, {APPS[1]: 4})
    commit(table, {APPS[2]: 9})
    delta = DeltaTable(str(table))
    delta.create_checkpoint()
    for entry in (table / LOG).glob("*.json"):
        if int(entry.name.split(".")[0]) < delta.version():  # the one with APPS[1]'s, gone
            entry.unlink()
    assert known(ledger, table) == delta_rs(table)
    assert known(ledger, table)[APPS[1]] == 4


def test_a_version_far_ahead_is_asked_of_delta_rs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = tmp_path / "t"
    commit(table, {APPS[0]: 1})
    ledger = AppTransactions(LocalStorage())
    known(ledger, table)
    monkeypatch.setattr(log, "ENTRIES_TO_CATCH_UP", 2)
    for version in range(2, 5):
        commit(table, {APPS[0]: version})
    delta = DeltaTable(str(table))
    asked = asked_of(delta)
    assert ledger.versions(delta, str(table), APPS)[APPS[0]] == 4
    assert sorted(asked) == APPS


# One step another writer takes: an append with these transactions, or a checkpoint after
# which the entries before it are removed (the log's retention).
STEPS = st.one_of(
    st.dictionaries(st.sampled_from(APPS), st.integers(0, 10**9), max_size=3),
    st.just("checkpoint"),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(STEPS, st.booleans()), min_size=1, max_size=8))
def test_it_answers_as_delta_rs_whatever_other_writers_did(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[dict[str, int] | str, bool]]
) -> None:
    table = tmp_path_factory.mktemp("ledger") / "t"
    commit(table, {APPS[0]: 1})
    ledger = AppTransactions(LocalStorage())
    for step, look in steps:
        if step == "checkpoint":
            delta = DeltaTable(str(table))
            delta.create_checkpoint()
            for entry in (table / LOG).glob("*.json"):
                if int(entry.name.split(".")[0]) < delta.version():
                    entry.unlink()
        else:
            assert isinstance(step, dict)
            commit(table, step)
        if look:
            assert known(ledger, table) == delta_rs(table)
    assert known(ledger, table) == delta_rs(table)
