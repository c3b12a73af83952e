"""Tables on S3 (`<store>+s3://bucket/prefix`) end to end: `lagless import` through the CLI
(and in process where only the table is asserted), the embedded broker over TCP, a real S3
server (SeaweedFS, tests/harness/s3.py), read back with the store's own reader through S3."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from lagless.gen import explicit, produce_profile
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from tests.harness.s3 import committed_parquet_files, reader_filesystem

pytestmark = pytest.mark.spark


def lagless_import(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lagless", "import", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def parquet_rows(bucket: str, prefix: str, table: str) -> list[tuple[int, int]]:
    """(partition, offset) of every row of the committed batches, read through pyarrow's S3
    filesystem."""
    filesystem = reader_filesystem()
    files = committed_parquet_files(filesystem, f"{bucket}/{prefix}/{table}")
    if not files:
        return []
    rows = ds.dataset(files, filesystem=filesystem, format="parquet").to_table(
        columns=["partition", "offset"]
    )
    return sorted(zip(*(rows.column(c).to_pylist() for c in rows.column_names), strict=True))


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def test_parquet_on_s3_holds_every_record_once_and_a_fresh_checkpoint_adds_nothing(
    broker, kafka, topic_name, tmp_path: Path, s3_env, prefix, spark
):
    """The first import through the CLI (its output and log keep the secret out); the one
    with a fresh checkpoint in process (s3_env's variables are this process's too)."""
    broker.create_topic(topic_name, 2)
    produced = produce_profile(kafka, topic_name, explicit([700, 300]), keys=20)
    url = s3_env.url("parquet", prefix)
    args = ["--bootstrap", kafka.bootstrap, "--topic", topic_name, "--sink", url]
    args += ["--max-records-per-batch", "400"]

    log = tmp_path / "lagless.log"
    logged = {"LAGLESS_LOG_FILE": str(log), "LAGLESS_LOG_LEVEL": "debug"}
    first = lagless_import(*args, "--checkpoint", str(tmp_path / "one"), env=logged)
    assert first.returncode == 0, first.stderr[-2000:]
    fresh = ImportSpec(
        kafka=kafka,
        topics=(topic_name,),
        sink_url=url,
        checkpoint=str(tmp_path / "two"),
        max_records_per_batch=400,
    )
    again = run_import(fresh, spark=spark)

    assert again.records == 0  # the table is the ledger: nothing read again
    expected = sorted((p, o) for p, (s, e) in produced.offsets.items() for o in range(s, e))
    assert parquet_rows(s3_env.bucket, prefix, topic_name) == expected
    secret = s3_env.env()["AWS_SECRET_ACCESS_KEY"]
    assert log.stat().st_size > 0
    assert secret not in first.stdout + first.stderr + log.read_text(errors="replace")


@pytest.mark.parametrize("store", ["parquet", "delta", "iceberg"])
def test_a_missing_bucket_or_a_silent_endpoint_is_one_line_before_anything_is_written(
    store, kafka, broker, topic_name, tmp_path: Path, s3_env
):
    broker.create_topic(topic_name, 1)
    common = ["--bootstrap", kafka.bootstrap, "--topic", topic_name]
    common += ["--checkpoint", str(tmp_path / "ckpt")]
    catalog = f"catalog={tmp_path}/catalog.db&" if store == "iceberg" else ""
    missing = lagless_import(*common, "--sink", f"{store}+s3://no-such-bucket/lake?{catalog}")
    silent = lagless_import(
        *common,
        "--sink",
        f"{store}+s3://{s3_env.bucket}/lake?{catalog}endpoint=http://127.0.0.1:9",
    )

    assert (missing.returncode, missing.stderr.count("\n")) == (2, 1), missing.stderr[-2000:]
    assert "bucket 'no-such-bucket' does not exist" in missing.stderr
    assert (silent.returncode, silent.stderr.count("\n")) == (2, 1), silent.stderr[-2000:]
    assert "does not answer" in silent.stderr
    assert not (tmp_path / "ckpt").exists()
    assert not (tmp_path / "catalog.db").exists()
