"""lagless: import Kafka topics into stores with Spark, and show why a consumer lags.

The public API is exported here and only here. Names load on first use: every Spark Python
worker imports `lagless.source`, and should not pay for the importer, sinks and CLI too.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lagless.broker import EmbeddedBroker
    from lagless.exceptions import (
        BadInput,
        DataLossError,
        LaglessError,
        TerminalError,
        TransientError,
    )
    from lagless.importer.job import run_import
    from lagless.importer.spec import ImportSpec
    from lagless.kafka.config import KafkaConfig
    from lagless.planner import OffsetRange, limit_batch, plan_tasks
    from lagless.progress import Collector, RichCollector, Summary
    from lagless.sinks import sink_from_url
    from lagless.source import SOURCE_NAME, KafkaDataSource

_HOMES = {
    "SOURCE_NAME": "lagless.source",
    "BadInput": "lagless.exceptions",
    "Collector": "lagless.progress",
    "DataLossError": "lagless.exceptions",
    "EmbeddedBroker": "lagless.broker",
    "ImportSpec": "lagless.importer.spec",
    "KafkaConfig": "lagless.kafka.config",
    "KafkaDataSource": "lagless.source",
    "LaglessError": "lagless.exceptions",
    "OffsetRange": "lagless.planner",
    "RichCollector": "lagless.progress",
    "Summary": "lagless.progress",
    "TerminalError": "lagless.exceptions",
    "TransientError": "lagless.exceptions",
    "limit_batch": "lagless.planner",
    "plan_tasks": "lagless.planner",
    "run_import": "lagless.importer.job",
    "sink_from_url": "lagless.sinks",
}

__all__ = [
    "SOURCE_NAME",
    "BadInput",
    "Collector",
    "DataLossError",
    "EmbeddedBroker",
    "ImportSpec",
    "KafkaConfig",
    "KafkaDataSource",
    "LaglessError",
    "OffsetRange",
    "RichCollector",
    "Summary",
    "TerminalError",
    "TransientError",
    "limit_batch",
    "plan_tasks",
    "run_import",
    "sink_from_url",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'lagless' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
