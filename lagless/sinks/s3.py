"""Where a table on S3 is and how to reach it: `<store>+s3://bucket/prefix[?endpoint=&region=]`.

The endpoint, region and credentials come from the URL's options, else from the usual AWS
variables (AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, AWS_REGION or AWS_DEFAULT_REGION,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), read once, on the driver. The
secret key and token are Secrets from here on: they reach each client's configuration
(`reveal`d there only) and the tasks (pickled, in Spark's redacted executorWriterSecret
option or inside the task function), never a message or a log line.

Runs on executors too (S3Access.filesystem): imports nothing of lagless's driver.
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from lagless.exceptions import BadInput
from lagless.secret import Secret

if TYPE_CHECKING:
    import pyarrow.fs as pafs

SUFFIX = "+s3"
OPTIONS = ("endpoint", "region")
DEFAULT_REGION = "us-east-1"


@dataclass(frozen=True)
class S3Access:
    """An S3 endpoint and the credentials for it; None: the client's own default (AWS itself,
    its credential chain)."""

    endpoint: str | None = None
    region: str = DEFAULT_REGION
    access_key: str | None = None
    secret_key: Secret | None = None
    session_token: Secret | None = None

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def filesystem(self) -> pafs.S3FileSystem:
        """pyarrow's S3 filesystem (the tasks write files through it)."""
        import pyarrow.fs as pafs

        finalize_at_exit()
        options: dict[str, Any] = {"region": self.region}
        if self.endpoint:
            parts = urlsplit(self.endpoint)
            options["endpoint_override"] = parts.netloc
            options["scheme"] = parts.scheme or "https"
        if self.access_key and self.secret_key:
            options["access_key"] = self.access_key
            options["secret_key"] = self.secret_key.reveal()
            if self.session_token:
                options["session_token"] = self.session_token.reveal()
        return pafs.S3FileSystem(**options)

    def object_store_config(self) -> dict[str, str]:
        """obstore's / object_store's S3 configuration (the driver's client, delta-rs)."""
        config = {"region": self.region}
        if self.endpoint:
            config["endpoint"] = self.endpoint
        if self.allow_http:
            config["allow_http"] = "true"
        if self.access_key and self.secret_key:
            config["access_key_id"] = self.access_key
            config["secret_access_key"] = self.secret_key.reveal()
            if self.session_token:
                config["session_token"] = self.session_token.reveal()
        return config

    def to_task(self) -> tuple[dict[str, str | None], Secret | None]:
        """This access as a task's JSON config and its secret (source/executor_write.py)."""
        config = {"endpoint": self.endpoint, "region": self.region, "access_key": self.access_key}
        if not self.secret_key:
            return config, None
        secrets = {"secret_key": self.secret_key.reveal()}
        if self.session_token:
            secrets["session_token"] = self.session_token.reveal()
        return config, Secret(json.dumps(secrets))

    @classmethod
    def from_task(cls, config: Mapping[str, Any], secret: Secret | None) -> S3Access:
        secrets = json.loads(secret.reveal()) if secret else {}
        token = secrets.get("session_token")
        return cls(
            endpoint=config.get("endpoint"),
            region=str(config.get("region") or DEFAULT_REGION),
            access_key=config.get("access_key"),
            secret_key=Secret(secrets["secret_key"]) if "secret_key" in secrets else None,
            session_token=Secret(token) if token else None,
        )

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg's FileIO properties."""
        properties = {"s3.region": self.region}
        if self.endpoint:
            properties["s3.endpoint"] = self.endpoint
        if self.access_key and self.secret_key:
            properties["s3.access-key-id"] = self.access_key
            properties["s3.secret-access-key"] = self.secret_key.reveal()
            if self.session_token:
                properties["s3.session-token"] = self.session_token.reveal()
        return properties


@dataclass(frozen=True)
class S3Url:
    """A table folder on S3: `s3://bucket/prefix` (no trailing slash) and how to reach it."""

    scheme: str
    bucket: str
    prefix: str
    access: S3Access
    # The URL as messages show it: no query (an endpoint may carry a user's name).
    shown: str
    # The query, kept for the store's own options (Iceberg's catalog).
    options: tuple[tuple[str, str], ...] = ()

    @property
    def root(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


def finalize_at_exit() -> None:
    """pyarrow's S3 subsystem shut down at the interpreter's exit, before static destructors
    run: pyarrow documents that a process leaving it running may abort on exit (SIGABRT, exit
    134). Registered once, by whatever uses pyarrow's S3 (not in a test's process mid-run)."""
    global _finalizing
    if not _finalizing:
        import pyarrow.fs as pafs

        atexit.register(pafs.finalize_s3)
        _finalizing = True


_finalizing = False


def is_s3(url: str) -> bool:
    return urlsplit(url).scheme.endswith(SUFFIX)


def parse_s3(url: str, scheme: str, extra_options: tuple[str, ...] = ()) -> S3Url:
    """`<scheme>+s3://bucket/prefix?endpoint=URL&region=NAME` with the AWS variables for what
    the URL leaves out."""
    parts = urlsplit(url)
    _, at, bucket = parts.netloc.rpartition("@")
    shown = f"{parts.scheme}://{'****@' if at else ''}{bucket}{parts.path}"
    if parts.scheme != scheme + SUFFIX or not bucket:
        raise BadInput(f"sink URL {shown!r}: expected {scheme}{SUFFIX}://BUCKET/PREFIX")
    if at:
        raise BadInput(
            f"sink URL {shown!r}: credentials go in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
            "not in the URL"
        )
    # Values are percent-decoded; a `+` is itself (a path may hold one), not a form's space.
    options = parse_qsl(parts.query.replace("+", "%2B"), keep_blank_values=True)
    unknown = sorted({k for k, _ in options} - {*OPTIONS, *extra_options})
    if unknown:
        raise BadInput(
            f"sink URL {shown!r}: unknown option {unknown[0]!r} (takes "
            f"{', '.join((*OPTIONS, *extra_options))})"
        )
    given = dict(options)
    env = os.environ
    endpoint = (
        given.get("endpoint") or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    )
    if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
        raise BadInput(f"S3 endpoint {endpoint!r} is not an http:// or https:// URL")
    region = (
        given.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or ""
    ) or DEFAULT_REGION
    secret = env.get("AWS_SECRET_ACCESS_KEY")
    token = env.get("AWS_SESSION_TOKEN")
    access = S3Access(
        endpoint=endpoint.rstrip("/") if endpoint else None,
        region=region,
        access_key=env.get("AWS_ACCESS_KEY_ID") or None,
        secret_key=Secret(secret) if secret else None,
        session_token=Secret(token) if token else None,
    )
    return S3Url(
        parts.scheme,
        bucket,
        parts.path.strip("/"),
        access,
        shown,
        tuple((k, v) for k, v in options if k in extra_options),
    )
