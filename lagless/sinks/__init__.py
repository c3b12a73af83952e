"""Stores lagless writes to, chosen by URL scheme: one folder per store."""

from __future__ import annotations

from urllib.parse import urlsplit

from lagless.exceptions import BadInput
from lagless.sinks.base import COLUMNS, Sink, Target, check_identifier

SCHEMES = ("sqlite", "parquet", "postgresql", "delta")


def sink_from_url(url: str) -> Sink:
    """sqlite:///path.db, parquet:///dir, delta:///dir, postgresql://user@host:port/db.

    Touches nothing."""
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from lagless.sinks.sqlite import SqliteSink

        return SqliteSink.from_url(url)
    if scheme == "parquet":
        from lagless.sinks.parquet import ParquetSink

        return ParquetSink.from_url(url)
    if scheme == "delta":
        from lagless.sinks.delta import DeltaSink

        return DeltaSink.from_url(url)
    if scheme in ("postgresql", "postgres"):
        from lagless.sinks.postgresql import PostgresSink

        return PostgresSink.from_url(url)
    shown = url.split("://", 1)[0] if "://" in url else url
    raise BadInput(f"sink URL scheme {shown!r} is not one of {', '.join(SCHEMES)}")


def local_path(url: str, scheme: str) -> str:
    """The path in `scheme:///relative/path` or `scheme:////absolute/path` (SQLAlchemy's rule)."""
    prefix = f"{scheme}:///"
    rest = url[len(prefix) :] if url.startswith(prefix) else ""
    if not rest:
        raise BadInput(f"sink URL {url!r} has no path (expected {prefix}PATH)")
    return rest


__all__ = ["COLUMNS", "Sink", "Target", "check_identifier", "local_path", "sink_from_url"]
