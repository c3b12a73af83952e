"""What a checkpoint remembers (its Fit), Spark's offset files, offsets the log no longer holds,
and the writable-place check: pure functions and real files, no Spark, no broker."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lagless.exceptions import BadInput
from lagless.importer.checkpoint import (
    FIT_FILE,
    Fit,
    check_fit,
    committed_ranges,
    last_end_offsets,
    last_journaled_offsets,
    parse_offsets_file,
    read_fit,
    write_first_start,
    write_fit,
)
from lagless.sinks import sink_from_url
from lagless.sinks.base import check_writable_path
from lagless.source.data_loss import Lost, lost_offsets, resumed

FIT = Fit.of(("orders", "audit"), "sqlite:////data/db.sqlite", "orders", "append", "raw")


def journal(checkpoint: Path, batch: int, offsets: dict[str, dict[str, int]], *, commit: bool):
    """An offset file (and commit) as Spark writes them."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}
    lines = ["v1", json.dumps(metadata), json.dumps(offsets)]
    (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines))
    if commit:
        (checkpoint / "commits").mkdir(exist_ok=True)
        (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_a_fit_keeps_topics_sorted_and_survives_its_json():
    assert FIT.topics == ("audit", "orders")
    doc = json.loads(json.dumps(FIT.to_json()))
    assert doc["version"] == 1 and doc["sink"] == "sqlite:////data/db.sqlite"
    assert Fit.from_json(doc, "here") == FIT


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"topics": ("payments",)}, "made for --topic audit,orders, not payments"),
        (
            {"sink": "parquet:////lake"},
            "made for --sink sqlite:////data/db.sqlite, not parquet:////lake",
        ),
        ({"table": "other"}, "made for --table orders, not other"),
        ({"write": "upsert"}, "made for --write append, not upsert"),
        ({"value_format": "json"}, "made for --value-format raw, not json"),
        ({"key_fields": ("id",)}, "made for --key-field (none), not id"),
    ],
)
def test_each_difference_is_said_in_the_options_words(change, says):
    wanted = Fit(**{**FIT.__dict__, **change})
    assert FIT.misfit(wanted) == f"it was {says}"
    assert FIT.misfit(FIT) is None


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([1], "is not a JSON object"),
        ({**FIT.to_json(), "version": 2}, "has version 2; this lagless reads version 1"),
        ({k: v for k, v in FIT.to_json().items() if k != "table"}, "no valid 'table'"),
        ({**FIT.to_json(), "topics": [1]}, "no valid 'topics'"),
    ],
)
def test_a_record_of_another_shape_is_refused(doc, says):
    with pytest.raises(BadInput, match=says):
        Fit.from_json(doc, "here")


def test_a_new_checkpoint_needs_its_record_and_check_writes_nothing(tmp_path):
    checkpoint = tmp_path / "ckpt"
    assert check_fit(str(checkpoint), FIT) is True
    assert not checkpoint.exists()
    write_fit(str(checkpoint), FIT)
    assert sorted(os.listdir(checkpoint)) == [FIT_FILE]
    assert read_fit(str(checkpoint)) == FIT
    assert check_fit(str(checkpoint), FIT) is False


def test_a_record_binds_once_a_batch_was_journaled(tmp_path):
    other = Fit(**{**FIT.__dict__, "table": "elsewhere"})
    write_fit(str(tmp_path), FIT)
    # Nothing read under the record yet (Spark never started): the new use takes it over.
    assert check_fit(str(tmp_path), other) is True

    journal(tmp_path, 0, {"orders": {"0": 3}, "audit": {"0": 1}}, commit=False)
    with pytest.raises(BadInput, match="does not fit: it was made for --table orders, not"):
        check_fit(str(tmp_path), other)


def test_a_checkpoint_without_a_record_is_adopted_when_its_offsets_are_of_the_topics(tmp_path):
    journal(tmp_path, 0, {"orders": {"0": 3}, "audit": {"0": 1}}, commit=True)
    assert check_fit(str(tmp_path), FIT) is True

    lone = Fit(**{**FIT.__dict__, "topics": ("orders",)})
    with pytest.raises(BadInput, match="holds offsets of --topic audit,orders, not orders"):
        check_fit(str(tmp_path), lone)


def test_an_unreadable_record_is_one_bad_input(tmp_path):
    (tmp_path / FIT_FILE).write_text("{half")
    with pytest.raises(BadInput, match="cannot read checkpoint record"):
        check_fit(str(tmp_path), FIT)


def test_offsets_are_read_by_their_version_line():
    assert parse_offsets_file(["v1", "{}", '{"t": {"0": 5, "1": 7}}'], "f") == {
        ("t", 0): 5,
        ("t", 1): 7,
    }
    with pytest.raises(BadInput, match="have version 'v2'; lagless reads v1"):
        parse_offsets_file(["v2", "{}", '{"t": {"0": 5}}'], "f")
    with pytest.raises(BadInput, match="have version ''"):
        parse_offsets_file([], "f")
    for lines in (["v1", "{}"], ["v1", "{}", "-"], ["v1", "{}", "[1]"], ["v1", "{}", '{"t": 1}']):
        with pytest.raises(BadInput, match="are not lagless's"):
            parse_offsets_file(lines, "f")


def test_the_last_committed_and_the_last_journaled_batch(tmp_path):
    assert last_end_offsets(str(tmp_path)) == {} == last_journaled_offsets(str(tmp_path))
    journal(tmp_path, 0, {"t": {"0": 3}}, commit=True)
    journal(tmp_path, 1, {"t": {"0": 9}}, commit=False)
    assert last_end_offsets(str(tmp_path)) == {("t", 0): 3}
    assert last_journaled_offsets(str(tmp_path)) == {("t", 0): 9}


def test_offsets_the_log_no_longer_holds():
    start = {("t", 0): 40, ("t", 1): 5, ("t", 2): 7, ("t", 3): 12}
    low = {("t", 0): 0, ("t", 1): 9, ("t", 2): 0}
    high = {("t", 0): 10, ("t", 1): 20, ("t", 2): 7}

    lost = lost_offsets(start, low, high)

    assert lost == [
        Lost(("t", 0), 40, 0, 10),  # recreated: beyond the log's end
        Lost(("t", 1), 5, 9, 20),  # retention deleted 5..9
        Lost(("t", 3), 12, None, None),  # gone
    ]
    assert [each.skipped for each in lost] == [0, 4, 0]
    assert str(lost[0]) == "t[0]: offset 40 is beyond the log's end 10 (was the topic recreated?)"
    assert str(lost[1]) == "t[1]: offsets 5..9 were deleted before lagless read them"
    assert str(lost[2]) == "t[3] is gone (it was read up to offset 12)"
    assert resumed(start, lost) == {("t", 0): 0, ("t", 1): 9, ("t", 2): 7}


def test_a_recreated_log_whose_start_was_deleted_counts_those_offsets():
    assert lost_offsets({("t", 0): 40}, {("t", 0): 3}, {("t", 0): 10})[0].skipped == 3


def test_the_sinks_identity_is_absolute_and_without_secrets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        sink_from_url("sqlite:///out/db.sqlite").identity == f"sqlite:///{tmp_path}/out/db.sqlite"
    )
    assert (
        sink_from_url("sqlite:///out/db.sqlite?write_from=driver").identity
        == sink_from_url(f"sqlite:////{tmp_path}/out/db.sqlite").identity
    )
    assert sink_from_url("parquet:///lake").identity == f"parquet:///{tmp_path}/lake"
    postgres = sink_from_url("postgres://me:hunter2@DB.example/sales?write_from=driver")
    assert postgres.identity == "postgresql://me@db.example:5432/sales"


@pytest.mark.parametrize(
    ("path", "folder", "says"),
    [
        ("/sys/lagless-test/lake", True, "nothing can be created in '/sys'"),
        ("/proc/lagless-test/ckpt", True, "nothing can be created in '/proc'"),
        ("/proc/lagless-test.db", False, "nothing can be created in '/proc'"),
        ("{tmp}/a_file/ckpt", True, "'{tmp}/a_file' is not a directory"),
        ("{tmp}/a_file", True, "is a file"),
        ("{tmp}", False, "is a directory"),
    ],
)
def test_a_place_nothing_can_be_written_to_is_refused(tmp_path, path, folder, says):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(BadInput, match=says.replace("{tmp}", str(tmp_path))):
        check_writable_path(path.replace("{tmp}", str(tmp_path)), "x", folder=folder)
    assert os.listdir(tmp_path) == ["a_file"]


def test_a_writable_place_is_left_as_it_was(tmp_path):
    (tmp_path / "db.sqlite").write_bytes(b"data")
    check_writable_path(str(tmp_path / "db.sqlite"), "file", folder=False)
    check_writable_path(str(tmp_path / "new" / "lake"), "directory", folder=True)
    assert os.listdir(tmp_path) == ["db.sqlite"]
    assert (tmp_path / "db.sqlite").read_bytes() == b"data"


def test_what_the_committed_batches_read(tmp_path):
    """From the first batch's start, kept by the import, to the newest committed end; the
    start kept only until a batch is committed (a rerun's own start is not the batch's)."""
    checkpoint = str(tmp_path)
    assert committed_ranges(checkpoint) == {}
    write_first_start(checkpoint, {("t", 0): 5, ("t", 1): 0})
    journal(tmp_path, 0, {"t": {"0": 9, "1": 0}}, commit=True)
    write_first_start(checkpoint, {("t", 0): 9, ("t", 1): 0})  # the rerun's: not kept
    journal(tmp_path, 1, {"t": {"0": 12, "1": 4}}, commit=True)
    journal(tmp_path, 2, {"t": {"0": 20, "1": 4}}, commit=False)
    assert committed_ranges(checkpoint) == {("t", 0): (5, 12), ("t", 1): (0, 4)}


def test_without_the_first_batchs_start_the_oldest_batch_counts_from_its_end(tmp_path):
    """A checkpoint of an earlier lagless (no start kept), or one whose oldest batches Spark
    removed: what the oldest batch known read is not counted."""
    journal(tmp_path, 0, {"t": {"0": 9}}, commit=True)
    assert committed_ranges(str(tmp_path)) == {("t", 0): (9, 9)}
    journal(tmp_path, 1, {"t": {"0": 15}}, commit=True)
    assert committed_ranges(str(tmp_path)) == {("t", 0): (9, 15)}
    (tmp_path / "offsets" / "0").unlink()  # as Spark removes its oldest batches' files
    (tmp_path / "commits" / "0").unlink()
    journal(tmp_path, 2, {"t": {"0": 30}}, commit=True)
    assert committed_ranges(str(tmp_path)) == {("t", 0): (15, 30)}
