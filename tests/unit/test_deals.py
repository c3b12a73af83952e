"""The deals profile's records (gen/deals.py): runs of one deal, tombstones, documents of the
asked size that parse with the schema gen hands to the import."""

from __future__ import annotations

import io
import itertools
import json
import random
import struct

import fastavro
import pytest

from lagless.exceptions import BadInput
from lagless.gen.deals import DEALS_AVRO_SCHEMA, RUN_MEAN, DealRecords, deal_id
from lagless.gen.profiles import DEALS_CHATTY, PARTITION_BYTES_LIMIT, deals


def test_draws_come_in_runs_of_one_deal_and_some_runs_end_in_a_tombstone() -> None:
    draws = DealRecords("json").draws(random.Random(1), keys=10, count=5_000)
    runs = 1 + sum(1 for a, b in itertools.pairwise(draws) if a[0] != b[0])
    tombstones = sum(1 for _, tombstone in draws if tombstone)
    assert len(draws) == 5_000
    assert 5_000 / runs > RUN_MEAN / 2  # long runs (neighbouring runs may share a deal)
    assert 0 < tombstones < runs


@pytest.mark.parametrize("size", [2_000, 32_000, 800_000])
def test_a_json_deal_is_about_the_asked_size_and_each_version_differs(size: int) -> None:
    value = DealRecords("json").values(0, size)
    first, second = json.loads(value(3, 0)), json.loads(value(3, 1))
    assert 0.9 * size <= len(value(3, 0)) <= 1.1 * size
    assert first["deal_id"] == second["deal_id"] == deal_id(3)
    assert (first["version"], second["version"]) == (0, 1)
    assert first["options"] != second["options"]


def test_avro_deals_carry_the_confluent_header_and_decode_with_the_schema() -> None:
    value = DealRecords("avro", schema_id=7).values(0, 4_000)(5, 2)
    assert struct.unpack(">bI", value[:5]) == (0, 7)
    schema = fastavro.parse_schema(DEALS_AVRO_SCHEMA)
    decoded = fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, schema)
    assert json.loads(DealRecords("json").values(0, 4_000)(5, 2)) == json.loads(
        json.dumps(decoded, default=str)
    )
    with pytest.raises(BadInput):
        DealRecords("json", schema_id=7)


def test_the_chatty_partition_is_flooded_and_large_documents_need_compression() -> None:
    profile = deals()
    assert max(profile.counts) == profile.counts[DEALS_CHATTY] > 5 * min(profile.counts)
    profile.check_fits("zstd")
    with pytest.raises(BadInput):
        profile.check_fits("none")
    # 800 KB documents, each alone in a batch, compress ~40x at best under zstd.
    report_sized = deals(scale=1.0, record_bytes=800_000)
    assert report_sized.stored_bytes(DEALS_CHATTY, "zstd") > PARTITION_BYTES_LIMIT
