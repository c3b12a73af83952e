"""The PostgreSQL sink's staging tables and URL, without a server."""

from __future__ import annotations

import re

import pytest

from lagless.exceptions import BadInput
from lagless.sinks import sink_from_url
from lagless.sinks.postgresql import MAX_NAME, staging_table


def test_a_staging_table_is_named_from_its_table_and_batch() -> None:
    assert staging_table("orders", 12) == "orders_stage_12"


def test_staging_tables_of_long_names_stay_apart_within_postgresqls_limit() -> None:
    """PostgreSQL cuts a longer name: two tables sharing a long prefix (a target and its
    dead-letter table) would then stage into one table."""
    target = "t" * 60
    names = {staging_table(table, 7) for table in (target, f"{target}_dlq", f"{target}_x")}
    assert len(names) == 3
    assert all(len(name) <= MAX_NAME and name.endswith("_stage_7") for name in names)


def test_an_unknown_query_parameter_is_bad_input_that_hides_the_password() -> None:
    with pytest.raises(BadInput, match=re.escape("write_from=executors|driver")) as raised:
        sink_from_url("postgresql://u:Hidden-pw@host/db?write_from=nowhere")
    assert "Hidden-pw" not in str(raised.value) and "****" in str(raised.value)
    assert len(str(raised.value).splitlines()) == 1


def test_write_from_driver_is_kept_out_of_the_connection_url() -> None:
    sink = sink_from_url("postgresql://u:pw@host:5433/db?write_from=driver")
    assert sink.write_from == "driver"  # type: ignore[attr-defined]
    assert sink.url == "postgresql://u:****@host:5433/db"


def test_executors_take_batches_as_large_as_any_the_driver_smaller_ones() -> None:
    from lagless.sinks.base import DriverSink, Sink

    assert sink_from_url("postgresql://u@host/db").max_batch_bytes == Sink.max_batch_bytes
    through_driver = sink_from_url("postgresql://u@host/db?write_from=driver")
    assert through_driver.max_batch_bytes == DriverSink.max_batch_bytes < Sink.max_batch_bytes
