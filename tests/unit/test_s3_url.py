"""sinks/s3.py: a table on S3 read from its URL and the AWS variables, the secret kept a Secret
all the way to the tasks."""

from __future__ import annotations

import pickle
import re

import pytest

from lagless.exceptions import BadInput
from lagless.sinks import sink_from_url
from lagless.sinks.s3 import S3Access, parse_s3

AWS = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
    "AWS_ACCESS_KEY_ID": "key-id",
    "AWS_SECRET_ACCESS_KEY": "very-secret",
    "AWS_REGION": "eu-west-3",
}


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    for name, value in AWS.items():
        monkeypatch.setenv(name, value)


def test_the_aws_variables_fill_what_the_url_leaves_out(aws: None) -> None:
    parsed = parse_s3("delta+s3://lake/some/prefix/", "delta")
    assert (parsed.bucket, parsed.prefix, parsed.root) == (
        "lake",
        "some/prefix",
        "s3://lake/some/prefix",
    )
    access = parsed.access
    assert (access.endpoint, access.region, access.access_key) == (
        "http://127.0.0.1:8333",
        "eu-west-3",
        "key-id",
    )
    assert access.secret_key is not None and access.secret_key.reveal() == "very-secret"
    assert access.object_store_config()["allow_http"] == "true"


def test_the_url_s_options_win_over_the_variables(aws: None) -> None:
    parsed = parse_s3("parquet+s3://lake/p?endpoint=https://s3.example:9000&region=x-1", "parquet")
    assert (parsed.access.endpoint, parsed.access.region) == ("https://s3.example:9000", "x-1")
    assert "allow_http" not in parsed.access.object_store_config()
    assert parsed.shown == "parquet+s3://lake/p"


def test_an_option_s_plus_is_a_plus_and_percent_escapes_are_decoded(aws: None) -> None:
    sink = sink_from_url("iceberg+s3://lake/w?catalog=/tmp/a+b/c%20d.db")
    assert sink.catalog_file == "/tmp/a+b/c d.db"  # type: ignore[attr-defined]


def test_the_secret_shows_nowhere_but_reaches_the_tasks(aws: None) -> None:
    sink = sink_from_url("parquet+s3://lake/p")
    assert "very-secret" not in repr(sink.s3) + sink.identity  # type: ignore[attr-defined]
    config, secret = sink.s3.access.to_task()  # type: ignore[attr-defined]
    assert "very-secret" not in repr(config) + str(secret) + repr(secret)
    back = S3Access.from_task(config, pickle.loads(pickle.dumps(secret)))
    assert back == sink.s3.access  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("parquet+s3://key:secret@lake/p", "credentials go in AWS_ACCESS_KEY_ID"),
        ("delta+s3://lake/p?bucket=x", "unknown option 'bucket'"),
        ("iceberg+s3://lake/w", "needs ?catalog=PATH"),
        ("parquet+s3://lake/p?endpoint=ftp://x", "not an http:// or https:// URL"),
        ("parquet+s3:///p", "expected parquet+s3://BUCKET/PREFIX"),
    ],
)
def test_a_url_that_cannot_work_is_refused_before_anything_is_touched(
    aws: None, url: str, message: str
) -> None:
    with pytest.raises(BadInput, match=re.escape(message)) as refused:
        sink_from_url(url)
    assert "secret" not in str(refused.value).replace("AWS_SECRET_ACCESS_KEY", "")


def test_a_rest_catalog_s_url_names_its_address_warehouse_and_bucket(aws: None) -> None:
    sink = sink_from_url("iceberg+rest://catalog.example:8181/tables?tls=false")
    rest = sink.rest  # type: ignore[attr-defined]
    assert (rest.uri, rest.warehouse, sink.identity) == (
        "http://catalog.example:8181",
        "tables",
        "iceberg+rest://catalog.example:8181/tables",
    )
    assert (sink.location, sink.s3.access.endpoint) == (  # type: ignore[attr-defined]
        "s3://tables",
        "http://127.0.0.1:8333",
    )
    assert sink_from_url("iceberg+rest://c:1/w").rest.uri == "https://c:1"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("iceberg+rest://key:secret@c:8181/w", "credentials go in AWS_ACCESS_KEY_ID"),
        ("iceberg+rest://c:8181/w?catalog=x", "unknown option 'catalog'"),
        ("iceberg+rest://c:8181/w?tls=maybe", "tls is true or false"),
        ("iceberg+rest://c:8181/", "expected iceberg+rest://HOST:PORT/WAREHOUSE"),
        ("iceberg+rest://c:8181/w/sub", "expected iceberg+rest://HOST:PORT/WAREHOUSE"),
    ],
)
def test_a_rest_catalog_url_that_cannot_work_is_refused_before_anything_is_touched(
    aws: None, url: str, message: str
) -> None:
    with pytest.raises(BadInput, match=re.escape(message)) as refused:
        sink_from_url(url)
    assert "secret" not in str(refused.value).replace("AWS_SECRET_ACCESS_KEY", "")
