"""Stores lagless writes to, chosen by URL scheme: one folder per store."""

from __future__ import annotations

from urllib.parse import urlsplit

from lagless.exceptions import BadInput
from lagless.sinks.base import COLUMNS, Sink, Target, TaskWrittenSink, check_identifier

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


__all__ = ["COLUMNS", "Sink", "Target", "TaskWrittenSink", "check_identifier", "sink_from_url"]
