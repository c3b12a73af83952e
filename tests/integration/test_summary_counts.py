"""The summary counts what the table gained (issue 31.5): "written" is the rows the table
gained or replaced, the same in every store; a batch the ledger held already is counted apart
("already in the table"), not as imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from tests.integration.test_crash_safety import stored

pytestmark = pytest.mark.spark

KEYS = 10


@pytest.mark.parametrize("store", ["sqlite", "delta", "iceberg"])
def test_an_upsert_writes_the_same_count_in_every_store(
    broker, kafka, topic_name, tmp_path, spark, store
):
    """30 records over (up to) 10 keys in one batch: a row gained per key, whatever the store
    (SQLite said 10, Delta and Iceberg 30). One record a batch: each replaces its key's row
    or is a new one, 30."""
    broker.create_topic(topic_name, 1)
    keys = len(produce_profile(kafka, topic_name, explicit([30]), keys=KEYS).newest_by_key())
    url = f"{store}:///{tmp_path}/{'out.db' if store == 'sqlite' else 'lake'}"

    def imported(name: str, **options: object) -> tuple[int, int]:
        summary = run_import(
            ImportSpec(
                kafka=kafka,
                topics=(topic_name,),
                sink_url=url,
                checkpoint=str(tmp_path / name),
                table=name,
                write="upsert",
                **options,  # type: ignore[arg-type]
            ),
            spark=spark,
        )
        assert len(stored(url, name, ("key",))) == keys
        return summary.imported, summary.written

    assert imported("whole") == (30, keys)
    if store == "sqlite":  # the batching the issue measured (35 written for 30 read)
        assert imported("one_by_one", max_records_per_batch=1) == (30, 30)


def test_a_batch_the_table_held_is_already_in_the_table_not_imported(tmp_path: Path) -> None:
    """Killed after the store committed its first batch, before Spark did: the rerun replays
    that batch, which the ledger holds: counted apart, and not written again."""
    with EmbeddedBroker(topics={"orders": 1}) as running:
        from lagless.kafka.config import KafkaConfig

        produce_profile(KafkaConfig(running.bootstrap), "orders", explicit([50]))
        args = [
            *("--bootstrap", running.bootstrap, "--topic", "orders"),
            *("--sink", f"sqlite:///{tmp_path}/out.db", "--checkpoint", str(tmp_path / "ckpt")),
            *("--max-records-per-batch", "10", "--json"),
        ]

        def lagless(**env: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "lagless",
                    "--log-file",
                    str(tmp_path / "log"),
                    "import",
                    *args,
                ],
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, **env},
            )

        killed = lagless(LAGLESS_FAILPOINT="after-write")
        assert killed.returncode == -9, killed.stderr
        rerun = lagless()

    assert rerun.returncode == 0, rerun.stderr
    body = json.loads(rerun.stdout)
    assert (body["records"], body["already_in_table"], body["imported"]) == (50, 10, 40)
    assert body["written"] == 40
    offsets = [o for (o,) in stored(f"sqlite:///{tmp_path}/out.db", "orders", ("offset",))]
    assert sorted(offsets) == list(range(50))
