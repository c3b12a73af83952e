"""The Kafka source for Spark: driver-side offset planning, executor-side range reading."""

from lagless.source.datasource import (
    SOURCE_NAME,
    KafkaDataSource,
    from_json_offsets,
    to_json_offsets,
)

__all__ = ["SOURCE_NAME", "KafkaDataSource", "from_json_offsets", "to_json_offsets"]
