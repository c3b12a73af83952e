"""Progress of an import, reported to a pluggable collector (a live bar, or nothing)."""

from lagless.progress.collector import Collector, NullCollector, RichCollector, Summary

__all__ = ["Collector", "NullCollector", "RichCollector", "Summary"]
