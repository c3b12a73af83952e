"""Spark's KafkaSourceOffsetSuite on lagless-kafka: a stream's offsets are Spark's
KafkaSourceOffset JSON, {"topic": {"partition": next offset}}, in the checkpoint's offset log
too (test_micro_batch_suite.py's restart test reads one). Not ported: the `compare` cases,
"OffsetSeqLog serialization" and "comparison of offsets" test Spark's own offset classes.
"""

from __future__ import annotations

import json

from lagless.source.datasource import from_json_offsets, to_json_offsets


def test_basic_serialization_deserialization():
    """KafkaSourceOffsetSuite: "basic serialization - deserialization"."""
    offsets = {("t", 0): 2, ("t", 1): 3, ("T", 0): 0}
    doc = to_json_offsets(offsets)
    assert json.loads(json.dumps(doc)) == {"T": {"0": 0}, "t": {"0": 2, "1": 3}}
    assert from_json_offsets(json.loads(json.dumps(doc))) == offsets


def test_read_spark_2_1_0_offset_format():
    """KafkaSourceOffsetSuite: "read Spark 2.1.0 offset format"
    (kafka-source-offset-version-2.1.0.txt)."""
    written = '{"topic1":{"0":456,"1":789},"topic2":{"0":0}}'
    assert from_json_offsets(json.loads(written)) == {
        ("topic1", 0): 456,
        ("topic1", 1): 789,
        ("topic2", 0): 0,
    }
