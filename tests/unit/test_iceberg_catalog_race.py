"""Two imports starting at once into a new Iceberg warehouse both make its SQL catalog's tables;
the one that loses (SQLite: "table iceberg_tables already exists") opens the catalog the other
made, rather than refusing the warehouse as "not an Iceberg SQL catalog" (seen in
tests/integration/test_shared_tables.py). The race is made here by a catalog whose first
opening lets the other import's catalog be made, then fails as SQLAlchemy does."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from lagless.exceptions import BadInput
from lagless.sinks import sink_from_url
from lagless.sinks.ledger import Batch
from tests.unit.test_ledger_stores import TARGET, TOPIC, commit


def test_a_catalog_another_import_made_meanwhile_is_opened(tmp_path, monkeypatch) -> None:
    from pyiceberg.catalog import sql

    made = sql.SqlCatalog
    opened: list[int] = []

    class Racing(made):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            opened.append(1)
            if len(opened) == 1:
                made(*args, **kwargs)  # the other import, a moment earlier
                raise OperationalError("CREATE TABLE iceberg_tables", {}, Exception("exists"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(sql, "SqlCatalog", Racing)
    url = f"iceberg:///{tmp_path}/lake"
    with sink_from_url(url) as sink:
        sink.prepare(TARGET)
        commit(sink, TARGET, Batch(0, {(TOPIC, 0): (0, 5)}))
    assert len(opened) == 2


def test_a_file_that_is_no_catalog_is_still_refused(tmp_path) -> None:
    lake = tmp_path / "lake"
    lake.mkdir()
    (lake / "catalog.db").write_bytes(b"not a database at all" * 100)
    sink = sink_from_url(f"iceberg:///{lake}")
    with pytest.raises(BadInput, match="is not an Iceberg SQL catalog"):
        sink.prepare(TARGET)
    sink.close()
