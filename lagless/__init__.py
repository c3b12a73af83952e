"""lagless: import Kafka topics into stores with Spark, and show why a consumer lags.

The public API is exported here and only here.
"""

from lagless.broker import EmbeddedBroker
from lagless.exceptions import BadInput, DataLossError, LaglessError, TerminalError, TransientError
from lagless.importer.job import ImportSpec, run_import
from lagless.kafka_config import KafkaConfig
from lagless.planner import OffsetRange, limit_batch, plan_tasks
from lagless.progress import Collector, RichCollector, Summary
from lagless.sinks import sink_from_url
from lagless.source import SOURCE_NAME, KafkaDataSource

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
