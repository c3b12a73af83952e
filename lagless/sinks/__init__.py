"""Stores lagless writes to, chosen by URL scheme: one folder per store."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lagless.exceptions import BadInput
from lagless.sinks.base import COLUMNS, Sink, Target, TaskWrittenSink, check_identifier

if TYPE_CHECKING:
    from lagless.sinks.maintenance import StoreMaintenance

SCHEMES = ("sqlite", "parquet", "postgresql", "delta", "iceberg")
# The stores that also keep tables on S3: `<store>+s3://bucket/prefix` (sinks/s3.py).
ON_S3 = ("parquet", "delta", "iceberg")


def sink_from_url(url: str) -> Sink:
    """sqlite:///path.db, parquet:///dir, delta:///dir, iceberg:///dir,
    postgresql://user@host:port/db (read by sinks/url.py); parquet+s3://bucket/prefix,
    delta+s3://..., iceberg+s3://... (sinks/s3.py); iceberg+rest://host:port/warehouse
    (sinks/iceberg/rest.py). Touches nothing."""
    scheme = urlsplit(url).scheme
    if scheme.removesuffix("+s3") in ON_S3:
        scheme = scheme.removesuffix("+s3")
    if scheme == "iceberg+rest":
        scheme = "iceberg"
    if scheme == "sqlite":
        from lagless.sinks.sqlite import SqliteSink

        return SqliteSink.from_url(url)
    if scheme == "parquet":
        from lagless.sinks.parquet import ParquetSink

        return ParquetSink.from_url(url)
    if scheme == "delta":
        from lagless.sinks.delta import DeltaSink

        return DeltaSink.from_url(url)
    if scheme == "iceberg":
        from lagless.sinks.iceberg import IcebergSink

        return IcebergSink.from_url(url)
    if scheme in ("postgresql", "postgres"):
        from lagless.sinks.postgresql import PostgresSink

        return PostgresSink.from_url(url)
    shown = url.split("://", 1)[0] if "://" in url else url
    raise BadInput(f"sink URL scheme {shown!r} is not one of {', '.join(SCHEMES)}")


def maintenance_of(sink: Sink, run_id: str | None = None) -> StoreMaintenance | None:
    """Compaction and expiry of the store's tables (sinks/maintenance.py), which an import runs
    between batches (run_id: its Target.run_id, so that its rerun may take over a lock it
    left) and `lagless maintain` once; None: the store needs none (a database keeps its own
    files). Here, beside sink_from_url, so that no store's package imports its maintenance."""
    if sink.scheme == "parquet":
        from lagless.sinks.parquet import ParquetSink
        from lagless.sinks.parquet.maintenance import ParquetMaintenance

        assert isinstance(sink, ParquetSink)
        return ParquetMaintenance(sink, run_id or f"maintain-{uuid.uuid4().hex[:12]}")
    if sink.scheme == "delta":
        from lagless.sinks.delta import DeltaSink
        from lagless.sinks.delta.maintenance import DeltaMaintenance

        assert isinstance(sink, DeltaSink)
        return DeltaMaintenance(sink)
    if sink.scheme == "iceberg":
        from lagless.sinks.iceberg import IcebergSink
        from lagless.sinks.iceberg.maintenance import IcebergMaintenance

        assert isinstance(sink, IcebergSink)
        return IcebergMaintenance(sink)
    return None


__all__ = [
    "COLUMNS",
    "Sink",
    "Target",
    "TaskWrittenSink",
    "check_identifier",
    "maintenance_of",
    "sink_from_url",
]
