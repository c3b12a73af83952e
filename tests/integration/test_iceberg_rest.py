"""An Iceberg REST catalog by URL (`iceberg+rest://HOST:PORT/WAREHOUSE`) end to end:
`lagless import` through the CLI, the embedded broker over TCP, SeaweedFS's real REST catalog
and S3 (tests/harness/s3.py), read back with pyiceberg's RestCatalog as README tells."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import CommitFailedException

from lagless.gen import explicit, produce_profile
from tests.integration.test_object_storage import lagless_import

pytestmark = pytest.mark.spark


def rest_catalog(s3) -> RestCatalog:  # type: ignore[no-untyped-def]
    env = s3.env()
    return RestCatalog(
        "reader",
        uri=s3.iceberg_endpoint,
        warehouse=s3.table_bucket,
        credential=f"{env['AWS_ACCESS_KEY_ID']}:{env['AWS_SECRET_ACCESS_KEY']}",
        **{
            "oauth2-server-uri": f"{s3.iceberg_endpoint}/v1/oauth/tokens",
            "s3.endpoint": env["AWS_ENDPOINT_URL"],
            "s3.access-key-id": env["AWS_ACCESS_KEY_ID"],
            "s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
            "s3.region": env["AWS_REGION"],
        },
    )


def test_a_rest_catalog_holds_every_record_once_and_a_fresh_checkpoint_adds_nothing(
    broker, kafka, topic_name, tmp_path: Path, s3_env
):
    broker.create_topic(topic_name, 2)
    produced = produce_profile(kafka, topic_name, explicit([500, 200]), keys=20)
    namespace = f"n{uuid.uuid4().hex[:10]}"
    args = ["--bootstrap", kafka.bootstrap, "--topic", topic_name]
    args += ["--sink", s3_env.iceberg_rest_url(), "--table", f"{namespace}.events"]
    args += ["--max-records-per-batch", "400"]

    log = tmp_path / "lagless.log"
    logged = {"LAGLESS_LOG_FILE": str(log), "LAGLESS_LOG_LEVEL": "debug"}
    first = lagless_import(*args, "--checkpoint", str(tmp_path / "one"), env=logged)
    again = lagless_import(*args, "--checkpoint", str(tmp_path / "two"))

    assert first.returncode == 0, first.stderr[-2000:]
    assert again.returncode == 0, again.stderr[-2000:]
    table = rest_catalog(s3_env).load_table(f"{namespace}.events")
    rows = table.scan(selected_fields=("partition", "offset")).to_arrow()
    expected = sorted((p, o) for p, (s, e) in produced.offsets.items() for o in range(s, e))
    assert (
        sorted(zip(*(rows.column(c).to_pylist() for c in rows.column_names), strict=True))
        == expected
    )
    # The ledger is in the snapshots' summaries, as with the SQL catalog; the rerun added none.
    snapshots = table.snapshots()
    assert len(snapshots) == 2  # 700 records in batches of 400
    held = json.loads(snapshots[-1].summary["lagless.held"])  # type: ignore[index]
    assert {(e["partition"], e["end"]) for e in held} == {(0, 500), (1, 200)}
    assert table.location().startswith(f"s3://{s3_env.table_bucket}/")
    secret = s3_env.env()["AWS_SECRET_ACCESS_KEY"]
    assert log.stat().st_size > 0
    assert secret not in first.stdout + first.stderr + log.read_text(errors="replace")

    # The catalog's commit is a compare-and-swap: one built on an older snapshot is refused
    # (lagless turned pyiceberg's own retry off on the table), not laid over the newer one.
    catalog = rest_catalog(s3_env)
    one, other = (catalog.load_table(f"{namespace}.events") for _ in range(2))
    extra = pa.Table.from_pylist([], schema=one.schema().as_arrow())
    one.append(extra)
    with pytest.raises(CommitFailedException):
        other.append(extra)


def test_a_refused_sign_in_is_one_line_before_anything_is_written(
    kafka, broker, topic_name, tmp_path: Path, s3_env
):
    broker.create_topic(topic_name, 1)
    args = ["--bootstrap", kafka.bootstrap, "--topic", topic_name]
    args += ["--sink", s3_env.iceberg_rest_url(), "--checkpoint", str(tmp_path / "ckpt")]

    refused = lagless_import(*args, env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"})

    assert (refused.returncode, refused.stderr.count("\n")) == (2, 1), refused.stderr[-2000:]
    assert "refused" in refused.stderr
    assert "not-the-secret" not in refused.stderr
    assert not (tmp_path / "ckpt").exists()
