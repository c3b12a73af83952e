"""A checkpoint is used only for what it was made for, and only against the log it read.

Real parts: the embedded broker over TCP, the CLI as a subprocess for what a user sees (each
refusal's exit 2 and one line, before Spark starts, ~1.5 s a run; the run that skips lost
offsets: its exit, summary and log), real Spark for the imports that run. The import that makes
the checkpoint and the one into a new checkpoint run in-process on the test run's shared Spark
session (tests/conftest.py): what they leave is what the tests look at, not their exit."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.importer.checkpoint import FIT_FILE, last_journaled_offsets, read_fit
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig

pytestmark = pytest.mark.spark


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lagless", *args], capture_output=True, text=True, timeout=300
    )


def import_args(bootstrap: str, root: Path, checkpoint: Path, **over: str) -> list[str]:
    values = {
        "--bootstrap": bootstrap,
        "--topic": "orders",
        "--sink": f"sqlite:///{root}/out/db.sqlite",
        "--checkpoint": str(checkpoint),
        **over,
    }
    return ["import", *[part for pair in values.items() for part in pair]]


def in_process(spark: Any, bootstrap: str, root: Path, checkpoint: Path) -> int:
    """What `import_args` asks for (its defaults), run on the shared session: records read."""
    spec = ImportSpec(
        kafka=KafkaConfig(bootstrap),
        topics=("orders",),
        sink_url=f"sqlite:///{root}/out/db.sqlite",
        checkpoint=str(checkpoint),
    )
    return run_import(spec, spark=spark).records


def snapshot(folder: Path) -> list[tuple[str, int, int]]:
    """Every path, and each file's size and time of change (the writable-place check makes
    and removes a probe in a folder: its own time changes, nothing else)."""
    return sorted(
        (str(p), p.stat().st_size, 0 if p.is_dir() else p.stat().st_mtime_ns)
        for p in folder.rglob("*")
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lagless: error:"), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def made(
    tmp_path_factory: pytest.TempPathFactory, spark: Any
) -> Iterator[tuple[EmbeddedBroker, Path]]:
    """orders (30 and 20 records) imported into SQLite table orders: the checkpoint `ckpt`."""
    root = tmp_path_factory.mktemp("fit")
    with EmbeddedBroker(topics={"orders": 2, "payments": 1}) as broker:
        produce_profile(KafkaConfig(broker.bootstrap), "orders", explicit([30, 20]), keys=5)
        assert in_process(spark, broker.bootstrap, root, root / "ckpt") == 50
        yield broker, root


def test_a_checkpoint_remembers_what_it_was_made_for(made):
    _, root = made
    fit = read_fit(str(root / "ckpt"))
    assert fit.topics == ("orders",) and fit.table == "orders"
    assert fit.sink == f"sqlite:///{root}/out/db.sqlite"
    assert (fit.write, fit.value_format, fit.key_fields) == ("append", "raw", ())


@pytest.mark.parametrize("made_by", ["lagless", "an-earlier-lagless", "another-spark"])
def test_any_other_use_is_one_line_exit_2_before_anything_is_written(made, tmp_path, made_by):
    broker, root = made
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(root / "ckpt", checkpoint)
    legacy = made_by == "an-earlier-lagless"
    if legacy:
        (checkpoint / FIT_FILE).unlink()
    cases = [
        ({"--topic": "payments"}, "it was made for --topic orders, not payments"),
        (
            {"--sink": f"sqlite:///{tmp_path}/other.db"},
            f"--sink sqlite:///{root}/out/db.sqlite, not sqlite:///{tmp_path}/other.db",
        ),
        ({"--sink": f"parquet:///{tmp_path}/lake"}, f"not parquet:///{tmp_path}/lake"),
        ({"--table": "elsewhere"}, "it was made for --table orders, not elsewhere"),
        ({"--write": "upsert"}, "it was made for --write append, not upsert"),
        ({"--value-format": "json"}, "it was made for --value-format raw, not json"),
    ]
    if legacy:  # without a record, only the topics can be told from Spark's offsets
        cases = [({"--topic": "payments"}, "holds offsets of --topic orders, not payments")]
    if made_by == "another-spark":  # offsets in a layout lagless does not know, else a fit
        offsets = checkpoint / "offsets" / "0"
        offsets.write_text(offsets.read_text().replace("v1", "v2", 1))
        cases = [({}, f"offsets '{offsets}' have version 'v2'; lagless reads v1")]
    before = snapshot(tmp_path), snapshot(root)

    def refused(over: dict[str, str]) -> str:
        return one_line(run_cli(*import_args(broker.bootstrap, root, checkpoint, **over)))

    with ThreadPoolExecutor(max_workers=3) as pool:
        said = list(pool.map(refused, [over for over, _ in cases]))

    for line, (_, says) in zip(said, cases, strict=True):
        assert says in line, line
        assert made_by == "another-spark" or f"checkpoint '{checkpoint}' does not fit: " in line
    assert (snapshot(tmp_path), snapshot(root)) == before


def test_a_recreated_topic_is_refused_then_read_from_its_start_with_skip_lost_offsets(
    made, tmp_path
):
    _, root = made
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(root / "ckpt", checkpoint)
    # A checkpoint an earlier lagless made: adopted by the run that goes through.
    (checkpoint / FIT_FILE).unlink()
    # orders again, now 1 partition of 10 records, the first 2 already deleted by retention.
    with EmbeddedBroker(topics={"orders": 1}) as recreated:
        produce_profile(KafkaConfig(recreated.bootstrap), "orders", explicit([10]), keys=5)
        recreated.delete_records("orders", 0, before_offset=2)
        before = snapshot(tmp_path)

        refused = run_cli(*import_args(recreated.bootstrap, tmp_path, checkpoint))

        line = one_line(refused)
        assert f"checkpoint '{checkpoint}' does not fit the log: " in line
        assert "orders[0]: offset 30 is beyond the log's end 10" in line
        assert "--skip-lost-offsets" in line
        assert snapshot(tmp_path) == before

        log_file = tmp_path / "lagless.log"
        skipped = run_cli(
            "--log-file",
            str(log_file),
            *import_args(recreated.bootstrap, tmp_path, checkpoint),
            "--skip-lost-offsets",
            "--json",
        )

    assert skipped.returncode == 0, skipped.stderr
    summary = json.loads(skipped.stdout.strip().splitlines()[-1])
    assert summary["records"] == 8 and summary["skipped"] == 2
    logged = log_file.read_text()  # each skipped partition is logged, not printed
    assert "orders[0]: offset 30 is beyond the log's end 10" in logged
    assert "orders[1] is gone (it was read up to offset 20)" in logged
    assert last_journaled_offsets(str(checkpoint)) == {("orders", 0): 10}
    assert read_fit(str(checkpoint)).topics == ("orders",)
    with sqlite3.connect(tmp_path / "out" / "db.sqlite") as conn:
        stored = conn.execute("SELECT partition, offset FROM orders ORDER BY 2").fetchall()
        ledger = conn.execute("SELECT partition, start_offset, end_offset FROM orders_ledger")
        covered = ledger.fetchall()
    assert stored == [(0, offset) for offset in range(2, 10)]
    assert covered == [(0, 0, 10)]  # the new log from its start, what retention took included


def test_a_table_that_lost_what_its_checkpoint_imported_is_refused(made, tmp_path, spark):
    """The table deleted under its checkpoint: the rerun would resume after the checkpoint,
    import nothing and exit 0, the table empty. It is refused instead (one line, exit 2,
    nothing written), and a new checkpoint imports what the table lacks, once."""
    broker, root = made
    database = root / "out" / "db.sqlite"
    kept = tmp_path / "kept.sqlite"
    shutil.move(database, kept)
    try:
        before = snapshot(root)

        line = one_line(run_cli(*import_args(broker.bootstrap, root, root / "ckpt")))

        assert f"checkpoint '{root / 'ckpt'}' imported orders[0] up to offset 30, but " in line
        assert "holds none of it: the table was deleted, emptied or rolled back since" in line
        assert "use a new --checkpoint" in line
        assert snapshot(root) == before
        assert in_process(spark, broker.bootstrap, root, tmp_path / "new") == 50
        with sqlite3.connect(database) as conn:
            stored = conn.execute("SELECT partition, offset FROM orders").fetchall()
        assert sorted(stored) == [(0, o) for o in range(30)] + [(1, o) for o in range(20)]
    finally:
        database.unlink(missing_ok=True)
        shutil.move(kept, database)
