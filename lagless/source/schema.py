"""The columns of a Kafka record, as in Spark's own Kafka source.

Spark's source has the headers column only under includeHeaders=true; the readers here always
decode into ARROW_SCHEMA and drop the column before Spark sees rows without it.
"""

import pyarrow as pa

SPARK_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
SPARK_SCHEMA_WITH_HEADERS = f"{SPARK_SCHEMA}, headers array<struct<key: string, value: binary>>"

HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)

ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", HEADER_TYPE),
    ]
)

# Kafka's TimestampType ids, as Spark's timestampType column holds them, by librdkafka's
# timestamp kinds (TIMESTAMP_NOT_AVAILABLE 0, TIMESTAMP_CREATE_TIME 1, TIMESTAMP_LOG_APPEND_TIME 2).
NO_TIMESTAMP_TYPE = -1
TIMESTAMP_TYPE_BY_KIND = {0: NO_TIMESTAMP_TYPE, 1: 0, 2: 1}
