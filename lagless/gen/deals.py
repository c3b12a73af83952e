"""Records of the deals profile (field report 002): large JSON documents about deals, keyed by
the deal id, published in runs of many near-identical updates of one deal (an after-save hook
firing per option), some runs ending in a tombstone (the deal deleted; a later run may publish
it again). Values are JSON, or Avro of the same deal: plain, or in the Confluent wire format
under a schema registered in a Schema Registry.

Pure but for that registration: a deal's document depends only on its number and version.
"""

from __future__ import annotations

import io
import json
import random
import struct
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from typing import Any, ClassVar, Literal

from lagless.exceptions import BadInput
from lagless.first_line import first_line

GenValueFormat = Literal["json", "avro"]

# Deal ids look like the report's (2342565); deal number n of the profile is DEAL_ID_BASE + n.
DEAL_ID_BASE = 2_000_000
# A run of updates of one deal is 1 to 2 * RUN_MEAN - 1 records long (the report saw 200-300).
RUN_MEAN = 20
# The share of runs that end with a tombstone.
TOMBSTONE_SHARE = 0.15
_EPOCH_MS = 1_700_000_000_000

# The same deal as Spark DDL (for `lagless import --value-format json --value-schema`) and as
# an Avro schema; avro_fields of the latter gives the columns of the former.
DEALS_DDL = (
    "deal_id BIGINT NOT NULL, version BIGINT NOT NULL, title STRING, merchant STRING, "
    "price DECIMAL(12,2), updated_at BIGINT, "
    "options ARRAY<STRUCT<option_id: INT, title: STRING, price: DECIMAL(12,2), active: BOOLEAN>>"
)
_PRICE = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
DEALS_AVRO_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Deal",
    "namespace": "lagless.gen",
    "fields": [
        {"name": "deal_id", "type": "long"},
        {"name": "version", "type": "long"},
        {"name": "title", "type": "string"},
        {"name": "merchant", "type": "string"},
        {"name": "price", "type": _PRICE},
        {"name": "updated_at", "type": "long"},
        {
            "name": "options",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "DealOption",
                    "fields": [
                        {"name": "option_id", "type": "int"},
                        {"name": "title", "type": "string"},
                        {"name": "price", "type": _PRICE},
                        {"name": "active", "type": "boolean"},
                    ],
                },
            },
        },
    ],
}
_CONFLUENT_HEADER = struct.Struct(">bI")  # magic byte 0, schema id


def deal_id(number: int) -> int:
    return DEAL_ID_BASE + number


def schema_text(value_format: GenValueFormat) -> str:
    """What `import --value-schema @FILE` reads for this format: DDL, or an Avro schema."""
    return DEALS_DDL if value_format == "json" else json.dumps(DEALS_AVRO_SCHEMA, indent=2)


def register_schema(registry_url: str, subject: str) -> int:
    """Registers the deal's Avro schema under `subject`; its id. BadInput if that fails."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url, "timeout": 10})
    try:
        return client.register_schema(subject, Schema(json.dumps(DEALS_AVRO_SCHEMA), "AVRO"))
    except Exception as exc:
        raise BadInput(
            f"cannot register the deals schema at {registry_url}: {first_line(exc)}"
        ) from None


def _option(number: int, option: int) -> dict[str, Any]:
    return {
        "option_id": option,
        "title": f"Option {option} of deal {deal_id(number)}: two nights for two, breakfast",
        "price": Decimal(f"{50 + option % 400}.{option % 100:02d}"),
        "active": True,
    }


@lru_cache(maxsize=4)  # a run is one deal: its options are built once, not per version
def _options(number: int, count: int) -> tuple[dict[str, Any], ...]:
    return tuple(_option(number, option) for option in range(count))


def _head(number: int, version: int) -> dict[str, Any]:
    return {
        "deal_id": deal_id(number),
        "version": version,
        "title": f"Deal {deal_id(number)}",
        "merchant": f"merchant-{number % 97}",
        "price": Decimal(f"{100 + number % 900}.{version % 100:02d}"),
        "updated_at": _EPOCH_MS + version * 60_000,
    }


def _option_count(record_bytes: int) -> int:
    """Options that make a JSON document of about record_bytes."""
    head = len(_json(_head(0, 0) | {"options": []}))
    option = len(_json(_option(0, 0))) + 2  # and ", "
    return max(1, (record_bytes - head) // option)


def deal(number: int, version: int, record_bytes: int) -> dict[str, Any]:
    """Deal `number` at `version`: each version turns one option off (a different one each
    time, as the report's cron job did), changes the price's cents and the update time."""
    options = list(_options(number, _option_count(record_bytes)))
    off = version % len(options)
    options[off] = options[off] | {"active": False}
    return _head(number, version) | {"options": options}


def _json(document: dict[str, Any]) -> bytes:
    return json.dumps(document, default=str).encode()  # decimals as strings: exact


class DealRecords:
    """The deals profile's keys (the deal id as text), their order (runs, some ending in a
    tombstone) and values, for gen.produce.produce_profile."""

    poisonable: ClassVar[bool] = False

    def __init__(self, value_format: GenValueFormat, schema_id: int | None = None) -> None:
        if schema_id is not None and value_format != "avro":
            raise BadInput("a registered schema needs --value-format avro")
        self.value_format = value_format
        self.schema_id = schema_id

    def key(self, number: int) -> bytes:
        return str(deal_id(number)).encode()

    def draws(self, rng: random.Random, keys: int, count: int) -> list[tuple[int, bool]]:
        order: list[tuple[int, bool]] = []
        while len(order) < count:
            j = rng.randrange(keys)
            order += [(j, False)] * rng.randint(1, 2 * RUN_MEAN - 1)
            if rng.random() < TOMBSTONE_SHARE:
                order[-1] = (j, True)
        return order[:count]

    def values(self, partition: int, record_bytes: int) -> Callable[[int, int], bytes]:
        if self.value_format == "json":
            return lambda number, version: _json(deal(number, version, record_bytes))
        import fastavro

        schema = fastavro.parse_schema(DEALS_AVRO_SCHEMA)
        header = b"" if self.schema_id is None else _CONFLUENT_HEADER.pack(0, self.schema_id)

        def avro(number: int, version: int) -> bytes:
            body = io.BytesIO(header)
            body.seek(len(header))
            fastavro.schemaless_writer(body, schema, deal(number, version, record_bytes))
            return body.getvalue()

        return avro
