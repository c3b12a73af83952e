"""Apache Iceberg tables through pyiceberg: executors write the Parquet files, the driver adds a
batch's files to the table in one Iceberg commit.

`iceberg:///dir` is a local warehouse: pyiceberg's SQL catalog in `<dir>/catalog.db` (SQLite,
catalog name `lagless`), tables `default.<table>` at `<dir>/default/<table>` (`--table ns.name`
picks another namespace). `iceberg+s3://bucket/warehouse?catalog=PATH` is a warehouse on S3
(sinks/s3.py) whose SQL catalog is the SQLite file PATH on the driver (it is where commits
are decided, so it needs no shared disk). `iceberg+rest://HOST:PORT/WAREHOUSE` is a REST
catalog's warehouse, its tables on S3 (rest.py). `<table>_dlq` (dead letters) and, in upsert mode,
`<table>_tombstones` beside it. Tasks write into `<table>/_staging/<run>` (raw appends through
the source's executorWriter, other rows through mapInArrow: task_files.py); the driver moves
the files into the table's `data` folder and adds them as they are (add_files reads only their
footers: no row passes through the driver). Upserts are planned on the driver (sinks/newer_wins.py)
and committed as position deletes of the replaced rows and an append of the newer rows, one
commit (row_delta.py; copy-on-write where the table asks for it).

Every commit carries the batch's ranges in its snapshots' summaries (summary.py): the table is
its own ledger (sinks/ledger.py). A batch the table holds already is skipped, one it holds
part of is refused, and a commit that lost a race to another writer (the catalog refuses a
commit built on an older snapshot) reads the ledger again and decides again: exactly once
whoever else writes the table.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from lagless.cdc.key_change import AWAITS, MOVE_ID, MOVE_ONLY, MOVES, UNKNOWN
from lagless.cdc.schema_change import check_widening, iceberg_widening, refuse, widest
from lagless.exceptions import BadInput, TerminalError, TransientError
from lagless.failpoints import failpoint
from lagless.first_line import first_line
from lagless.retry import COMMIT_ATTEMPTS, commit_attempts
from lagless.sinks.base import (
    ALREADY_HELD,
    DEAD_LETTER_SCHEMA,
    TOMBSTONE,
    Target,
    WriteMode,
    Written,
    check_identifier,
    check_writable_path,
    in_schema,
    spark_types,
)
from lagless.sinks.folder_table import FolderTableSink, newest_rows_in
from lagless.sinks.iceberg.arrow_types import conformed, iceberg_schema
from lagless.sinks.iceberg.rest import RestUrl, is_rest, open_catalog, parse_rest
from lagless.sinks.iceberg.rest import errors as rest_errors
from lagless.sinks.iceberg.row_delta import (
    FILE,
    MERGE_MODE,
    MERGE_ON_READ,
    POS,
    FileColumns,
    commit_row_delta,
    merge_on_read,
    rows_in_place,
    transaction,
    write_delete_files,
)
from lagless.sinks.iceberg.summary import held_in, log_times_in, properties, skipped_in
from lagless.sinks.ledger import TP, Batch, ConcurrentImport, HeldRecord, Verdict, verdict
from lagless.sinks.newer_wins import (
    COORDINATES,
    key_changes,
    mirrored,
    moves_planned,
    moves_schema,
    needs_held_values,
    plan,
    row_numbers,
    with_fills,
)
from lagless.sinks.s3 import S3Url, finalize_at_exit, is_s3, parse_s3
from lagless.sinks.task_files import Conform, stage_rows
from lagless.sinks.url import parse_local

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table, Transaction
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType


CATALOG_NAME = "lagless"
CATALOG_FILE = "catalog.db"
NAMESPACE = "default"
# A reader or another import may hold the catalog's SQLite file for a moment.
BUSY_TIMEOUT_S = 30
# Kept as a table property: Iceberg has no unique key to tell an upsert table by.
WRITE_MODE = "lagless.write"
# pyiceberg would retry a failed commit itself, rebuilt on the newer snapshot without reading
# the ledger again: a batch another import committed meanwhile would land twice. lagless
# retries itself (_commit).
NO_RETRIES = {"commit.retry.num-retries": "0"}
# A column's Parquet dictionary is given up past this many bytes (Iceberg's default: 2 MB):
# a column of distinct values (keys, offsets, times) is hashed into a dictionary until it fills,
# then written plain anyway (pyarrow checks every 20,000 rows). At 64 KB, the 1M-row file of a
# mirror's table (bench/mirror.py's accounts) took 7.2 MB against 10.9, and its upserts' fold
# rounds 9.0 s against 11.1 over 40 batches of 50,000 updates; a column of few values keeps
# its dictionary. Every write pays it: a batch's rows, compaction, the folds of deletes.
DICTIONARY_BYTES = {"write.parquet.dict-size-bytes": str(64 * 1024)}
# Commits lost to other writers before a batch gives up (each re-reads the ledger first).

Build = Callable[["Transaction", "Table", dict[str, str]], None]


def identifier(table: str) -> tuple[str, str]:
    """`name` is `default.name`; `ns.name` names its namespace."""
    namespace, _, name = table.rpartition(".")
    return (namespace or NAMESPACE, name)


class IcebergSink(FolderTableSink):
    scheme = "iceberg"

    def __init__(
        self,
        url: str,
        location: str,
        s3: S3Url | None = None,
        catalog: str | None = None,
        rest: RestUrl | None = None,
    ) -> None:
        super().__init__(url, location, s3)
        # The SQL catalog's SQLite file: in the warehouse, or on the driver for one on S3.
        self.catalog_file = catalog or os.path.join(location, CATALOG_FILE)
        # Else a REST catalog's.
        self.rest = rest
        self._opened: Catalog | None = None
        self._file_columns = FileColumns(self._read_file)

    @classmethod
    def from_url(cls, url: str) -> IcebergSink:
        if is_rest(url):
            rest = parse_rest(url)
            return cls(url, rest.s3.root, rest.s3, rest=rest)
        if is_s3(url):
            s3 = parse_s3(url, cls.scheme, extra_options=("catalog",))
            catalog = dict(s3.options).get("catalog")
            if not catalog:
                raise BadInput(
                    f"sink URL {s3.shown!r}: an Iceberg warehouse on S3 needs ?catalog=PATH, "
                    "the SQLite file of its catalog on the driver"
                )
            return cls(url, s3.root, s3, os.path.abspath(catalog))
        return cls(url, os.path.abspath(parse_local(url, cls.scheme).path))

    @property
    def identity(self) -> str:
        if self.rest:
            return self.rest.shown
        if self.s3:
            return f"{self.s3.shown}?catalog={self.catalog_file}"
        return super().identity

    def table_name(self, name: str) -> str:
        """A table, or `namespace.table`: one level of namespace (lagless makes it)."""
        if name.count(".") > 1:
            raise BadInput(
                f"Iceberg table {name!r} has {name.count('.')} dots: lagless takes TABLE or "
                "NAMESPACE.TABLE (one namespace, no nested ones)"
            )
        namespace, dot, table = name.partition(".")
        if dot:
            check_identifier(namespace, "namespace")
        check_identifier(table if dot else name)
        return name

    def check(self, target: Target) -> None:
        """Before anything is written: the folder can be written, and each table that exists is
        a lagless table of this write mode whose columns the target's schema keeps (it may add
        columns, and widen types as Iceberg allows)."""
        # A REST catalog's table bucket takes objects only in its tables' folders: no probe at
        # its root; opening the catalog (below) checks the sign-in.
        if self.s3 and not self.rest:
            self.storage.check_writable(self.location, "Iceberg warehouse")
            check_writable_path(self.catalog_file, "Iceberg catalog", folder=False)
        elif not self.s3:
            check_writable_path(self.location, "directory", folder=True)
        with self._catalog_errors():
            catalog = self._catalog(create=False)
            if catalog is None:
                return
            for table, mode, schema in self._tables(target):
                found = self._load(catalog, table)
                if found is None:
                    continue
                refused = unwritable(found)
                if refused:
                    raise BadInput(
                        f"Iceberg table {table!r}: lagless cannot write its {mode}s "
                        f"({refused}); pick another --table"
                    )
                _check_layout(found, table, mode, schema, _grows(target, table))

    def prepare(self, target: Target) -> None:
        """The catalog, the namespace and every table, created in the target's columns or
        brought to them (a field the schema added becomes a column); safe to repeat."""
        if not self.rest:
            os.makedirs(os.path.dirname(self.catalog_file), exist_ok=True)
        with self._catalog_errors():
            catalog = self._catalog(create=True)
            assert catalog is not None
            for table, mode, schema in self._tables(target):
                ident = identifier(table)
                catalog.create_namespace_if_not_exists(ident[0])
                made = catalog.create_table_if_not_exists(
                    ident,
                    schema=schema,
                    properties={**NO_RETRIES, **DICTIONARY_BYTES, WRITE_MODE: mode},
                )
                self._check_location(table, made)
                self._evolve(table, mode, schema, _grows(target, table))

    def ledger(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        with self._catalog_errors():
            catalog = self._catalog(create=False)
            found = self._load(catalog, target.table) if catalog is not None else None
            return held_in(found) if found is not None else {}

    def empty(self, target: Target) -> None:
        """A snapshot without lagless's summary: the ledger is read past it (summary.py)."""
        from pyiceberg.expressions import AlwaysTrue

        with self._catalog_errors():
            self._table(target.table).delete(delete_filter=AlwaysTrue())

    def table_types(self, target: Target) -> dict[str, DataType | None]:
        with self._catalog_errors():
            catalog = self._catalog(create=False)
            found = self._load(catalog, target.table) if catalog is not None else None
            return {} if found is None else spark_types(found.schema().as_arrow())

    def log_times(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        if target.mode != "upsert":
            return {}
        with self._catalog_errors():
            catalog = self._catalog(create=False)
            found = self._load(catalog, target.table) if catalog is not None else None
            return log_times_in(found) if found is not None else {}

    def skipped(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        with self._catalog_errors():
            catalog = self._catalog(create=False)
            found = self._load(catalog, target.table) if catalog is not None else None
            return skipped_in(found) if found is not None else {}

    def newest_rows(self, target: Target, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
        import polars as pl

        if not held:
            return {}
        with self._catalog_errors():
            catalog = self._catalog(create=False)
            found = self._load(catalog, target.table) if catalog is not None else None
            if found is None:
                return {}
            with warnings.catch_warnings():  # polars would rather plan with a plugin
                warnings.simplefilter("ignore", pl.exceptions.PerformanceWarning)
                return newest_rows_in(pl.scan_iceberg(found), held)

    def commit_staged(self, files: list[str], target: Target, batch: Batch) -> Written | None:
        """After the tasks wrote the batch (executorWriter): add its files in one commit."""
        with self._catalog_errors():
            added = self._add_files(target.table, sorted(set(files)), batch)
        return None if added else ALREADY_HELD

    @property
    def conform(self) -> Conform:
        """Rows Spark's tasks write are cast to the Iceberg columns' types."""
        return conformed

    def write(
        self, rows: DataFrame, target: Target, batch: Batch, before_commit: Callable[[], None]
    ) -> Written | None:
        """A batch of rows: tasks write the files, the driver adds them or upserts them."""
        files = self._stage(rows, target, target.table)
        before_commit()
        with self._catalog_errors():
            if target.mode == "append":
                return None if self._add_files(target.table, files, batch) else ALREADY_HELD
            return self._upsert(files, target, batch)

    def takes_upsert_rows(self, target: Target) -> bool:
        return target.mode == "upsert"

    def upsert_rows(self, rows: pa.Table, target: Target, batch: Batch) -> Written:
        """A batch of rows one per key, from the driver, in the Iceberg columns' types."""
        if not rows.num_rows:
            return self._upsert([], target, batch)
        conform = pa.Table.from_batches(list(conformed(iter(rows.to_batches()))))
        with self._catalog_errors():
            return self._upsert_rows(conform, target, batch)

    def write_dead_letters(self, rows: DataFrame, target: Target, batch: Batch) -> None:
        """Its rejected records, added to `<table>_dlq` before the batch's rows commit."""
        table = target.dead_letter_table
        files = self._stage(rows, target, table)
        with self._catalog_errors():
            self._add_files(table, files, batch)

    def close(self) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        if isinstance(self._opened, SqlCatalog):
            self._opened.engine.dispose()
        self._opened = None

    def _catalog(self, *, create: bool) -> Catalog | None:
        """The warehouse's catalog, made if `create`; else None while there is none (then
        nothing is written, not even an empty catalog file). A REST catalog is always there."""
        from pyiceberg.catalog.sql import SqlCatalog

        if self._opened is not None:
            return self._opened
        if self.rest:
            self._opened = open_catalog(self.rest, CATALOG_NAME)
            return self._opened
        path = self.catalog_file
        if not create and not _holds_a_catalog(path):
            return None
        warehouse = self.location if self.s3 else f"file://{self.location}"
        io = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"} if self.s3 else {}
        access = self.s3.access.iceberg_properties() if self.s3 else {}
        if self.s3:
            finalize_at_exit()  # pyiceberg reads and writes through pyarrow's S3
        for attempt in range(2):
            try:
                self._opened = SqlCatalog(
                    CATALOG_NAME,
                    uri=f"sqlite:///{path}?timeout={BUSY_TIMEOUT_S}",
                    warehouse=warehouse,
                    **io,
                    **access,
                )
                break
            except Exception as exc:  # SQLAlchemy's errors, whatever the file holds
                # Two imports starting at once into a new warehouse both make the catalog's
                # tables: the one that lost opens the catalog the other made.
                if attempt == 0 and _holds_a_catalog(path):
                    continue
                message = f"{path!r} is not an Iceberg SQL catalog: {first_line(exc)}"
                raise BadInput(message) from None
        assert self._opened is not None
        return self._opened

    @contextmanager
    def _catalog_errors(self) -> Iterator[None]:
        """The catalog's SQLite file locked beyond the timeout, or unreadable for a moment:
        a rerun may pass."""
        from sqlalchemy.exc import OperationalError

        if self.rest:
            with rest_errors(self.rest):
                yield
            return
        try:
            yield
        except OperationalError as exc:
            path = self.catalog_file
            raise TransientError(
                f"the Iceberg catalog {path!r} could not be read or written: {first_line(exc)}"
            ) from None

    def _load(self, catalog: Catalog, table: str) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return catalog.load_table(identifier(table))
        except NoSuchTableError:
            return None

    def _evolve(self, table: str, mode: WriteMode, schema: pa.Schema, grows: bool) -> None:
        """The table brought to `schema` (a column per field added) with lagless's properties
        (upserts merge-on-read, unless the table says otherwise); a commit that lost to
        another writer is made again on the table it left."""
        from pyiceberg.exceptions import CommitFailedException

        for _ in commit_attempts():
            found = self._table(table)
            _check_layout(found, table, mode, schema, grows)
            try:
                with found.transaction() as tx:
                    if found.properties.get(next(iter(NO_RETRIES))) != "0":
                        tx.set_properties(NO_RETRIES)
                    if MERGE_MODE not in found.properties:  # made before: merge-on-read now
                        tx.set_properties({MERGE_MODE: MERGE_ON_READ})
                    with tx.update_schema() as update:
                        update.union_by_name(schema)
                return
            except CommitFailedException:
                continue
        raise ConcurrentImport(
            f"Iceberg table {table!r} of {self.url}: its schema could not be updated, "
            f"{COMMIT_ATTEMPTS} commits lost to other writers in a row; rerun"
        )

    def _check_location(self, table: str, found: Table) -> None:
        """The table lies in the warehouse's bucket, where the tasks stage its files (a REST
        catalog places tables itself)."""
        location = _local_path(found.location())
        if self.s3 and not location.startswith(f"s3://{self.s3.bucket}/"):
            raise BadInput(
                f"Iceberg table {table!r} of {self.url} lies at {location!r}, outside the "
                f"bucket {self.s3.bucket!r} the sink stages its files in"
            )

    def _table(self, table: str) -> Table:
        catalog = self._catalog(create=True)
        assert catalog is not None
        found = self._load(catalog, table)
        if found is None:
            raise TerminalError(f"Iceberg table {table!r} of {self.url} is gone")
        return found

    def _tables(self, target: Target) -> list[tuple[str, WriteMode, pa.Schema]]:
        from pyspark.sql.pandas.types import to_arrow_schema

        stored = iceberg_schema(to_arrow_schema(target.schema(), timezone="UTC"))
        tables: list[tuple[str, WriteMode, pa.Schema]] = [
            (target.table, target.mode, stored),
            (target.dead_letter_table, "append", DEAD_LETTER_SCHEMA),
        ]
        if target.mode == "upsert":
            kept = [*target.unique, *COORDINATES]
            graves = pa.schema([stored.field(name) for name in kept])
            tables.append((target.tombstone_table, "upsert", graves))
        if target.marks:
            tables.append((target.moves_table, "upsert", iceberg_schema(moves_schema(target))))
        return tables

    def _table_folder(self, table: str) -> tuple[str, ...]:
        return identifier(table)

    def _stage(self, rows: DataFrame, target: Target, table: str) -> list[str]:
        staging = self._staging(target, table)
        clear = self.storage.remove_tree
        return stage_rows(rows, staging, conformed, clear=clear, s3=self.storage.task_access)

    def _drop(self, files: list[str]) -> None:
        for path in files:
            self.storage.remove(path)

    def _read_data(self, location: str, columns: list[str] | None = None) -> pa.Table:
        """A data or delete file of a table, by the location its manifest names (the columns
        read kept for the next batch: FileColumns)."""
        return self._file_columns(location, columns)

    def _read_file(self, location: str, columns: list[str] | None) -> pa.Table:
        return self.storage.read_parquet(_local_path(location), columns)

    def _move(self, path: str, folder: str) -> str:
        """A staged file into the table's data folder, under a name of its own: a task's file
        is named by its pieces, and another import of the same pieces may have committed a
        file of that name, which a replay found here must not replace nor drop."""
        stem, suffix = os.path.splitext(path.rsplit("/", 1)[-1])
        moved = self.storage.join(folder, f"{stem}-{uuid.uuid4().hex[:12]}{suffix}")
        self.storage.move(path, moved)
        return moved

    def _add_files(self, table: str, files: list[str], batch: Batch) -> bool:
        """Move the batch's files into the table's data folder and add them, with the batch's
        ranges, in one commit, unless the table holds these offsets already (a replay: False).
        A batch without files still records its ranges."""
        found = self._table(table)
        if verdict(batch, held_in(found)) is Verdict.REPLAY:
            self._drop(files)
            return False
        data = self.storage.join(_local_path(found.location()), "data")
        self.storage.makedirs(data)
        moved = [self._move(path, data) for path in files]
        failpoint("mid-write")  # files beside the table's, not yet in its snapshots

        def build(tx: Transaction, _: Table, props: dict[str, str]) -> None:
            if moved:
                tx.add_files(moved, snapshot_properties=props, check_duplicate_files=False)
            else:
                tx.append(pa.table({}), snapshot_properties=props)

        if not self._commit(table, batch, build):
            self._drop(moved)
            return False
        return True

    def _upsert(self, files: list[str], target: Target, batch: Batch) -> Written:
        """Tombstones into `<table>_tombstones`, then the target: both newer-only, each in one
        commit with the batch's ranges, so a replay between the two changes nothing."""
        if not files:  # every record rejected or skipped: the ranges are recorded still
            return Written(0) if self._add_files(target.table, [], batch) else ALREADY_HELD
        rows = pa.concat_tables([self.storage.read_parquet(path) for path in files])
        self._drop(files)
        return self._upsert_rows(rows, target, batch)

    def _upsert_rows(self, rows: pa.Table, target: Target, batch: Batch) -> Written:
        keys = target.unique
        ranked = [*keys, *COORDINATES]
        moves = self._moves(rows, target, batch) if key_changes(rows, target) else None
        if MOVE_ONLY in rows.column_names:  # a delete kept for its move alone is no row of it
            rows = rows.filter(pc.invert(pc.fill_null(rows.column(MOVE_ONLY), False)))
        tombstones = rows.filter(rows.column(TOMBSTONE)).select(ranked)
        if tombstones.num_rows:
            graves = tombstones.append_column(
                TOMBSTONE, pa.array([False] * tombstones.num_rows, pa.bool_())
            )

            def bury(tx: Transaction, table: Table, props: dict[str, str]) -> None:
                held = _held_rows(table, rows, keys, ranked, self._read_data)
                _apply(tx, table, plan(graves, held, keys), held, keys, props, self._read_data)

            self._commit(target.tombstone_table, batch, bury)
        failpoint("mid-write")  # tombstones kept, the target not yet upserted

        added: list[int] = []  # the rows the target gains or has replaced, by the last try
        # A mirror's batch that takes values from the rows it replaces reads them whole, in the
        # one scan that also finds the ranks (of the batch's keys: those it replaces, and more).
        whole_rows = moves is not None or needs_held_values(rows, target)

        def upsert(tx: Transaction, table: Table, props: dict[str, str]) -> None:
            read = self._read_data
            wanted = rows.select(list(keys))
            if moves is not None:  # and the rows that await a key change
                wanted = pa.concat_tables([wanted, _awaiting_keys(table, keys, wanted.schema)])
            held = _held_rows(table, wanted, keys, None if whole_rows else ranked, read)
            graves = _held_rows(self._table(target.tombstone_table), rows, keys, ranked, read)
            planned = plan(rows, held, keys, graves)
            kept = held.drop_columns([FILE, POS])
            if whole_rows:  # a placeholder is the held value, or NULL
                planned = mirrored(planned, rows, kept, target, moves)
            if moves is not None:
                planned = with_fills(planned, kept, moves, target)
            added[:] = [planned.added.num_rows]
            _apply(tx, table, planned, held, keys, props, read)

        if not self._commit(target.table, batch, upsert):
            return ALREADY_HELD
        return Written(added[0] if added else 0)

    def unknown_rows(self, table: str) -> int | None:
        """pyiceberg prunes the files whose counts say they hold none."""
        from pyiceberg.expressions import NotNull

        with self._catalog_errors():
            catalog = self._catalog(create=False)
            found = self._load(catalog, table) if catalog is not None else None
            if found is None or UNKNOWN not in found.schema().as_arrow().names:
                return None
            marked = NotNull(UNKNOWN)  # type: ignore[call-arg, arg-type]
            scan = found.scan(row_filter=marked, selected_fields=(UNKNOWN,))
            return scan.to_arrow().num_rows

    def _moves(self, rows: pa.Table, target: Target, batch: Batch) -> pa.Table:
        """A marked mirror's key changes the batch begins, kept in `<table>_moves` (with the
        batch's ranges: a replay keeps none again), and every one kept there after it."""
        read = self._read_data
        begun = rows.filter(pc.is_valid(rows.column(MOVES)))
        if begun.num_rows:
            held = _held_rows(self._table(target.table), begun, target.unique, None, read)
            held = held.drop_columns([FILE, POS])

            def keep(tx: Transaction, table: Table, props: dict[str, str]) -> None:
                whole = _every_row(table, read)
                planned = moves_planned(begun, held, whole.drop_columns([FILE, POS]), target)
                _apply(tx, table, planned, whole, (MOVE_ID,), props, read)

            self._commit(target.moves_table, batch, keep)
        return _every_row(self._table(target.moves_table), read).drop_columns([FILE, POS])

    def _commit(self, table: str, batch: Batch, build: Build) -> bool:
        """One commit of what `build` adds to a transaction, with the batch's ranges in its
        snapshots' summaries, decided on the table as it is (ledger.verdict). A commit that
        lost to another writer decides again on the table that writer left. False: the table
        holds the batch already."""
        from pyiceberg.exceptions import CommitFailedException

        for _ in commit_attempts():
            found = self._table(table)
            held = held_in(found)
            if verdict(batch, held) is Verdict.REPLAY:
                return False
            tx = transaction(found)
            log_times = log_times_in(found) if batch.log_times else None
            build(tx, found, properties(found, held, batch, log_times))
            try:
                tx.commit_transaction()
                return True
            except CommitFailedException:
                continue
        raise ConcurrentImport(
            f"Iceberg table {table!r} of {self.url}: {COMMIT_ATTEMPTS} commits lost to other "
            "writers in a row; rerun to resume after what the table holds"
        )


def _holds_a_catalog(path: str) -> bool:
    """The file holds pyiceberg's catalog tables (read-only: opening the catalog would make
    them). A file made by a prepare that crashed before them holds none."""
    if not os.path.exists(path):
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'iceberg_tables'"
            ).fetchone()
    except sqlite3.DatabaseError as exc:
        raise BadInput(f"{path!r} is not an Iceberg SQL catalog: {first_line(exc)}") from None
    return found is not None


def unwritable(found: Table) -> str | None:
    """Why lagless's files would not keep the table's rules; None: they keep them. Its files
    are unpartitioned and unsorted (Iceberg lets a writer leave a sort order unapplied: each
    file says it is unsorted), and their columns optional (pyiceberg adds no file of optional
    columns to a table whose columns are required, as identifier fields are)."""
    version = found.metadata.format_version
    if version not in (1, 2):
        return f"format version {version}, of which lagless writes 1 and 2"
    if not found.spec().is_unpartitioned():
        fields = ", ".join(f"{f.name}: {f.transform}" for f in found.spec().fields)
        return f"it is partitioned ({fields}), and lagless writes unpartitioned files"
    schema = found.schema()
    named = sorted(str(schema.find_column_name(i)) for i in schema.identifier_field_ids)
    if named:
        return (
            f"it has identifier fields ({', '.join(named)}), which must be required columns, and "
            "lagless's files leave every column optional"
        )
    return None


def _grows(target: Target, table: str) -> bool:
    """A Debezium mirror's table keeps a column dropped upstream (NULL in new rows)."""
    return target.value_format == "debezium" and table in (target.table, target.moves_table)


def _check_layout(
    found: Table, table: str, mode: WriteMode, schema: pa.Schema, grows: bool = False
) -> None:
    """BadInput unless `found` is a lagless table of this mode that `schema` can evolve (a
    table that `grows` may also hold columns `schema` lacks)."""
    from pyiceberg.exceptions import ValidationError

    written = found.properties.get(WRITE_MODE)
    columns = [f.name for f in found.schema().fields]
    if written != mode or (set(columns) - set(schema.names) and not grows):
        layout = f"lagless --write {written}" if written else "not lagless"
        raise BadInput(
            f"Iceberg table {table!r} has another layout ({layout}; columns "
            f"{', '.join(columns)}); pick another --table or --write mode"
        )
    if grows:
        _check_widening(found, table, schema)
    try:
        found.update_schema().union_by_name(schema)._apply()
    except (ValidationError, ValueError) as exc:
        raise BadInput(
            f"incompatible schema change for Iceberg table {table!r}: {first_line(exc)}; pick "
            "another --table"
        ) from None


def _check_widening(found: Table, table: str, schema: pa.Schema) -> None:
    """A mirror's columns against its change events' (schema_change.py): a column they bring
    narrower stays (the rows are cast to it); one they widen must be a promotion Iceberg makes
    (union_by_name leaves a decimal's scale as it was, without a word): else
    SchemaChangeRefused."""
    from pyspark.sql.pandas.types import from_arrow_type

    held = found.schema().as_arrow()
    for field in schema:
        index = held.get_field_index(field.name)
        if index < 0:
            continue
        try:
            held_type = from_arrow_type(held.field(index).type)
            wanted_type = from_arrow_type(field.type)
        except TypeError:
            continue  # not a type a change event brings; union_by_name judges it
        wider = widest(held_type, wanted_type)
        if wider is None:
            refuse(table, field.name, held_type, wanted_type)
        elif wider != held_type:
            check_widening(table, field.name, held_type, wider, "Iceberg", iceberg_widening)


def _matching(rows: pa.Table, keys: tuple[str, ...]) -> BooleanExpression:
    """Rows whose key is one of those of `rows`."""
    from pyiceberg.table.upsert_util import create_match_filter

    return create_match_filter(rows.select(list(keys)), list(keys))


def _held_rows(
    table: Table,
    rows: pa.Table,
    keys: tuple[str, ...],
    columns: list[str] | None,
    read: Callable[[str, list[str] | None], pa.Table],
) -> pa.Table:
    """The table's rows whose key is one of those of `rows`, in `columns` (None: all; else
    they include the keys), with each row's place (FILE, POS). The files are pruned by the
    range of each key column (_key_ranges), the keys themselves matched here: an Iceberg
    filter of thousands of keys costs seconds to build and prunes no file (pyiceberg checks a
    set of more than 200 values against no file's bounds)."""
    stored = table.schema().as_arrow()
    wanted = rows.select(list(keys)).group_by(list(keys)).aggregate([])
    # As the table stores them (a text key may come back as large_string).
    wanted = wanted.cast(pa.schema([stored.field(name) for name in wanted.column_names]))
    return rows_in_place(table, _key_ranges(rows, keys), wanted, columns, read)


def _awaiting_keys(table: Table, keys: tuple[str, ...], schema: pa.Schema) -> pa.Table:
    """The keys of the rows that await a key change (key_change.AWAITS); pyiceberg prunes the
    files whose counts say they hold none."""
    from pyiceberg.expressions import NotNull

    awaiting = NotNull(AWAITS)  # type: ignore[call-arg, arg-type]
    found = table.scan(row_filter=awaiting, selected_fields=keys).to_arrow()
    return found.select(list(keys)).cast(schema)


def _every_row(table: Table, read: Callable[[str, list[str] | None], pa.Table]) -> pa.Table:
    """All the table's rows, with FILE and POS (a small table: a mirror's key changes)."""
    from pyiceberg.expressions import AlwaysTrue

    ids = table.scan(selected_fields=(MOVE_ID,)).to_arrow()
    stored = table.schema().as_arrow()
    wanted = ids.cast(pa.schema([stored.field(MOVE_ID)]))
    return rows_in_place(table, AlwaysTrue(), wanted, None, read)


def _key_ranges(rows: pa.Table, keys: tuple[str, ...]) -> BooleanExpression:
    """Rows whose key columns lie in the ranges `rows` hold (a superset of its keys: files
    outside them are pruned by their bounds); the keys one by one where a key column is not
    a number, text or bytes, or holds a NULL."""
    from pyiceberg.expressions import AlwaysFalse, And, GreaterThanOrEqual, LessThanOrEqual

    if not rows.num_rows:
        return AlwaysFalse()
    bounds: list[BooleanExpression] = []
    for name in keys:
        column = rows.column(name)
        kind = column.type
        ranged = pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_binary(kind)
        if column.null_count or not ranged:
            return _matching(rows, keys)
        low, high = pc.min_max(column).values()
        # mypy reads these predicates' signature from pydantic's fields, not their __init__.
        bounds += [
            GreaterThanOrEqual(name, low.as_py()),  # type: ignore[call-arg, arg-type]
            LessThanOrEqual(name, high.as_py()),  # type: ignore[call-arg, arg-type]
        ]
    return functools.reduce(And, bounds)


def _apply(
    tx: Transaction,
    table: Table,
    planned: Any,
    held: pa.Table,
    keys: tuple[str, ...],
    props: dict[str, str],
    read: Callable[[str, list[str] | None], pa.Table],
) -> None:
    """In `tx`, one snapshot: the replaced keys' rows (`held` has their places) deleted by
    position and the newer rows appended (merge-on-read, row_delta.py); or, where the table
    asks for copy-on-write, each data file holding a replaced key swapped for its other rows.

    The files are found by their key bounds and their rows matched here: pyiceberg's delete
    binds an expression of every replaced key, 5 of the 6 s a 50,000-row upsert into a
    200,000-row table took. A table with delete files (another writer's merge-on-read) goes
    through pyiceberg's delete, which applies them."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    schema = table.schema().as_arrow()
    added = planned.added.select([n for n in schema.names if n in planned.added.column_names])
    if merge_on_read(table):
        _delete_and_append(tx, table, _places(held, planned.replaced, keys), added, props)
        return
    rewritten: list[tuple[Any, pa.Table]] = []
    if planned.replaced.num_rows:
        tasks = list(table.scan(row_filter=_key_ranges(planned.replaced, keys)).plan_files())
        if any(task.delete_files for task in tasks):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pyiceberg notes deletes that match no file
                tx.delete(_matching(planned.replaced, keys), snapshot_properties=props)
            tx.append(added, snapshot_properties=props)
            return
        for task in tasks:
            rows = in_schema(read(task.file.file_path, None), schema)
            kept = _without_keys(rows, planned.replaced, keys)
            if kept.num_rows < rows.num_rows:
                rewritten.append((task.file, kept))
    if not rewritten:
        tx.append(added, snapshot_properties=props)
        return
    written = pa.concat_tables([added.cast(schema), *(kept for _, kept in rewritten)])
    with tx.update_snapshot(snapshot_properties=props).overwrite() as swap:
        for data_file, _ in rewritten:
            swap.delete_data_file(data_file)
        if not written.num_rows:
            return  # keys deleted, nothing left of their files (pyiceberg divides by 0 rows)
        for data_file in _dataframe_to_data_files(
            tx.table_metadata, written, table.io, write_uuid=uuid.uuid4()
        ):
            swap.append_data_file(data_file)


def _places(held: pa.Table, replaced: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """The places (file_path, pos) of the held rows whose key `replaced` holds."""
    wanted = replaced.select(list(keys)).cast(pa.schema([held.schema.field(k) for k in keys]))
    # The join carries only the keys and a row's place (Arrow's join takes no dictionary).
    index = held.select(list(keys)).append_column("_lagless_place", row_numbers(held.num_rows))
    found = index.join(wanted, list(keys), join_type="left semi").column("_lagless_place")
    gone = held.select([FILE, POS]).take(found)
    return pa.table({"file_path": gone[FILE], "pos": gone[POS]})


def _delete_and_append(
    tx: Transaction, table: Table, places: pa.Table, added: pa.Table, props: dict[str, str]
) -> None:
    """One snapshot of position delete files of `places` (one per data file) and a data file
    of `added`."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    deletes = write_delete_files(table, places)
    rows = in_schema(added, table.schema().as_arrow())
    written = (
        _dataframe_to_data_files(tx.table_metadata, rows, table.io, write_uuid=uuid.uuid4())
        if rows.num_rows
        else []
    )
    commit_row_delta(tx, props, added=[*written, *deletes])


def _without_keys(rows: pa.Table, replaced: pa.Table, keys: tuple[str, ...]) -> pa.Table:
    """`rows` but those whose key `replaced` holds."""
    wanted = replaced.select(list(keys)).cast(pa.schema([rows.schema.field(k) for k in keys]))
    places = rows.select(list(keys)).append_column("_lagless_place", row_numbers(rows.num_rows))
    gone = places.join(wanted, list(keys), join_type="left semi").column("_lagless_place")
    keep = pc.invert(pc.is_in(row_numbers(rows.num_rows), value_set=gone.combine_chunks()))
    return rows.filter(keep)


def _local_path(location: str) -> str:
    parts = urlsplit(location)
    return parts.path if parts.scheme == "file" else location
