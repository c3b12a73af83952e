"""Merge-on-read for Iceberg: a batch's replaced rows are named in position delete files
(Iceberg v2: a data file's path and a row's place in it) and its newer rows appended, in one
snapshot; the batch rewrites no data file. Compaction (maintenance.py) folds the deletes into
the data files they name once a file has lost FOLD_SHARE of its rows, and merges the delete
files of each data file into one. A delete file names the rows of one data file only (Iceberg's
`write.delete.granularity=file`): a reader then reads only its own file's deletes, and polars'
native reader refuses any other kind (it falls back to pyiceberg's, which builds each file's row
numbers in Python, apache/iceberg-python#1271).

A copy-on-write upsert rewrites every data file holding a replaced key: with updates to random
keys that is the whole table each batch (a 1M-row table: 2-3 s a batch, and a copy of the table
kept per batch for the history window). Here a batch costs a read of the key columns and a few
small files, whatever the table's size.

pyiceberg 0.12 applies position deletes in its scans, but its snapshot producers write data
manifests only and cannot remove a delete file: `RowDelta` is a producer of lagless's own that
adds data and delete files to manifests of their kind and removes either from the manifests
that list them. Tables lagless creates carry Iceberg's `write.merge.mode=merge-on-read`; a
table without it (made before, or set so by its owner) is upserted copy-on-write."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lagless.exceptions import UnreadDeletes
from lagless.sinks.base import in_schema
from lagless.sinks.newer_wins import keyed_positions

if TYPE_CHECKING:
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile, ManifestContent, ManifestEntry, ManifestFile
    from pyiceberg.table import Table, Transaction

# Iceberg's table property for row-level updates (Spark's MERGE reads it the same way).
MERGE_MODE = "write.merge.mode"
MERGE_ON_READ = "merge-on-read"
# Compaction folds a data file's deletes into it (rewrites it without the deleted rows) once
# they are this share of its rows. Below it a read pays for the deleted rows; above, a rewrite:
# each replaced row costs about 1 / FOLD_SHARE rows rewritten. Iceberg's rewrite_data_files
# waits for 0.3 (`delete-ratio-threshold`), for a job run now and then; a continuous import
# folds between batches. bench/table_health.py (3,000 upserts/s into a 1M-row table, 90 s),
# worst full read against the compacted copy's, and p99 produce → visible: 0.3: 1.48x, 1.53 s;
# 0.15: 1.36x, 1.56 s; 0.1: 1.36x, 1.78 s; 0.05: 1.25x, 1.71 s.
FOLD_SHARE = 0.05
# The field id Iceberg reserves for a position delete file's file_path column.
FILE_PATH_ID = 2147483546
# Each row's data file and position in it, beside the columns read (rows_in_place).
FILE = "_lagless_file"
POS = "_lagless_pos"
# The position delete file's columns, with the field ids the Iceberg spec reserves for them.
_DELETE_SCHEMA = pa.schema(
    [
        pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": b"2147483546"}),
        pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": b"2147483545"}),
    ]
)

Read = Callable[[str, list[str] | None], pa.Table]
# Bytes of data and delete files' columns an import keeps between batches (FileColumns).
KEPT_BYTES = 256 * 1024 * 1024
# Manifests whose live entries an import keeps between batches (ManifestEntries): a batch adds
# two (its data file's and its delete files'), compaction folds their files away.
KEPT_MANIFESTS = 2048


class FileColumns:
    """`read`, with the columns read of each file kept for the next batch: every upsert reads
    the key and rank columns of each current data file (~0.1 s a batch at 1M rows), and a file
    of an Iceberg table never changes once written (a rewrite is a file of a new name). Whole
    files (columns None) are not kept; the least recently read go first past `limit` bytes."""

    def __init__(self, read: Read, limit: int = KEPT_BYTES) -> None:
        self._read = read
        self._limit = limit
        self._kept: dict[tuple[str, tuple[str, ...]], pa.Table] = {}
        self._bytes = 0

    def __call__(self, path: str, columns: list[str] | None) -> pa.Table:
        if columns is None:
            return self._read(path, None)
        key = (path, tuple(columns))
        found = self._kept.pop(key, None)
        if found is None:
            found = self._read(path, columns)
            self._bytes += found.nbytes
        self._kept[key] = found  # the most recently read last
        while self._bytes > self._limit and self._kept:
            oldest = next(iter(self._kept))
            self._bytes -= self._kept.pop(oldest).nbytes
        return found


class ManifestEntries:
    """A manifest's live entries (its files, but those it lists as deleted), each manifest read
    once: a manifest is never changed once written (a snapshot that changes what one lists
    writes another, of a new name), and every commit and every maintenance round lists the
    current snapshot's files, on S3 a request per manifest. The least recently read go first
    past `limit` manifests."""

    def __init__(self, limit: int = KEPT_MANIFESTS) -> None:
        self._limit = limit
        self._kept: dict[str, list[ManifestEntry]] = {}

    def __call__(self, manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
        key = manifest.manifest_path
        found = self._kept.pop(key, None)
        if found is None:
            found = read_entries(manifest, io)
        self._kept[key] = found  # the most recently read last
        while len(self._kept) > self._limit:
            del self._kept[next(iter(self._kept))]
        return found


def read_entries(manifest: ManifestFile, io: FileIO) -> list[ManifestEntry]:
    """A manifest's live entries, read now (ManifestEntries keeps them)."""
    return manifest.fetch_manifest_entry(io, discard_deleted=True)


Entries = Callable[["ManifestFile", "FileIO"], list["ManifestEntry"]]


def merge_on_read(table: Table) -> bool:
    """Upserts into `table` write position deletes: it asks for them, and its format (v2,
    unpartitioned, as lagless makes them) takes them."""
    return (
        table.properties.get(MERGE_MODE) == MERGE_ON_READ
        and table.metadata.format_version == 2
        and table.spec().is_unpartitioned()
    )


def rows_in_place(
    table: Table,
    row_filter: BooleanExpression,
    keys: pa.Table,
    columns: list[str] | None,
    read: Read,
) -> pa.Table:
    """The rows of the current snapshot's data files whose key is a row of `keys` (its columns
    the key columns, in the table's types), in `columns` (None: all), with FILE and POS; the
    files `row_filter` prunes by their bounds are not read, and the rows position deletes
    delete are left out. Each file's rows are matched to the keys before its deletes are
    applied: a batch's few thousand rows, not the file's million, are checked against them."""
    schema = table.schema().as_arrow()
    wanted = schema if columns is None else pa.schema([schema.field(c) for c in columns])
    snapshot = table.current_snapshot()
    summary = snapshot.summary if snapshot is not None else None
    if summary is not None and int(summary.get("total-equality-deletes") or 0):
        raise UnreadDeletes(  # pyiceberg's planning refuses them too
            f"Iceberg table {'.'.join(table.name())}: the table has delete files lagless "
            "cannot apply (another writer's equality deletes); compact it with that "
            "writer's tools first"
        )
    tasks = list(table.scan(row_filter=row_filter).plan_files())
    delete_files = {d.file_path: d for task in tasks for d in task.delete_files}
    deleted = deleted_positions(delete_files.values(), read)
    parts = []
    for task in tasks:
        path = task.file.file_path
        rows = in_schema(read(path, _present(table, task.file, wanted)), wanted)
        positions = keyed_positions(rows, keys)
        gone = deleted.get(path)
        if gone is not None and len(gone) and len(positions):
            # The value set is the smaller side: the rows matched, not the file's deletes.
            hit = gone.filter(pc.is_in(gone, value_set=positions))
            if len(hit):
                positions = positions.filter(pc.invert(pc.is_in(positions, value_set=hit)))
        rows = rows.take(positions)
        # Dictionary-encoded: a path a row would be ~100 MB for a million rows.
        named = pa.DictionaryArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), rows.num_rows), pa.array([path])
        )
        parts.append(rows.append_column(FILE, named).append_column(POS, positions))
    if not parts:
        named = pa.field(FILE, pa.dictionary(pa.int32(), pa.string()))
        empty = wanted.append(named).append(pa.field(POS, pa.int64()))
        return empty.empty_table()
    return pa.concat_tables(parts)


def _present(table: Table, data_file: DataFile, wanted: pa.Schema) -> list[str] | None:
    """The columns of `wanted` that `data_file` holds (by its metrics' field ids; a column
    added since it was written is missing); None (read all) where it has no metrics."""
    counts = data_file.value_counts or data_file.column_sizes
    if not counts:
        return None
    ids = {f.name: _field_ids(f) for f in table.schema().fields}
    return [name for name in wanted.names if ids.get(name, set()) & set(counts)]


def _field_ids(field: Any) -> set[int]:
    """A field's id and its nested fields' (a list's or map's metrics are its leaves')."""
    from pyiceberg.types import ListType, MapType, NestedField, StructType

    found = {field.field_id}
    kind = field.field_type
    if isinstance(kind, ListType):
        found |= _field_ids(kind.element_field)
    elif isinstance(kind, MapType):
        found |= _field_ids(kind.key_field) | _field_ids(kind.value_field)
    elif isinstance(kind, StructType):
        for nested in kind.fields:
            assert isinstance(nested, NestedField)
            found |= _field_ids(nested)
    return found


def deleted_positions(delete_files: Iterable[DataFile], read: Read) -> dict[str, pa.Array]:
    """Data file path -> the positions `delete_files` delete in it (distinct, int64).
    UnreadDeletes: one is not a Parquet position delete file (another writer's equality
    deletes or deletion vectors, which lagless cannot apply)."""
    from pyiceberg.manifest import DataFileContent, FileFormat

    parts = []
    for delete_file in delete_files:
        if (
            delete_file.content != DataFileContent.POSITION_DELETES
            or delete_file.file_format != FileFormat.PARQUET
        ):
            raise UnreadDeletes(
                f"the table has delete files lagless cannot apply (another writer's equality "
                f"deletes or deletion vectors, e.g. {delete_file.file_path}); compact it with "
                "that writer's tools first"
            )
        parts.append(read(delete_file.file_path, ["file_path", "pos"]).cast(_DELETE_SCHEMA))
    if not parts:
        return {}
    # One grouping pass (a filter per data file cost a pass over every delete each).
    grouped = pa.concat_tables(parts).group_by("file_path").aggregate([("pos", "distinct")])
    return {
        path: positions.values
        for path, positions in zip(
            grouped.column("file_path").to_pylist(), grouped.column("pos_distinct"), strict=True
        )
    }


def write_delete_files(table: Table, places: pa.Table) -> list[DataFile]:
    """Position delete files of `places` (file_path, pos), one per data file they name, in the
    table's data folder."""
    if not places.num_rows:
        return []
    rows = places.cast(_DELETE_SCHEMA)
    paths = rows.column("file_path")
    return [
        _write_delete_file(table, path, rows.filter(pc.equal(paths, path)))
        for path in pc.unique(paths).to_pylist()
    ]


def _write_delete_file(table: Table, data_file: str, places: pa.Table) -> DataFile:
    """A position delete file of `places`, all in `data_file`, sorted as the spec asks."""
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    rows = places.sort_by([("pos", "ascending")])
    location = table.location_provider().new_data_location(f"{uuid.uuid4()}-deletes.parquet")
    output = table.io.new_output(location)
    with output.create(overwrite=True) as stream:
        pq.write_table(rows, stream)
    # The one data file named, as the bounds of the file_path column: readers index it by them.
    bounds = {FILE_PATH_ID: data_file.encode()}
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=rows.num_rows,
        file_size_in_bytes=len(output.to_input_file()),
        lower_bounds=bounds,
        upper_bounds=bounds,
    )


def referenced_data_file(delete_file: DataFile) -> str | None:
    """The one data file whose rows a position delete file deletes, by its file_path bounds;
    None for a file of several (an earlier lagless merged a round's deletes into one)."""
    low = (delete_file.lower_bounds or {}).get(FILE_PATH_ID)
    high = (delete_file.upper_bounds or {}).get(FILE_PATH_ID)
    return low.decode() if low is not None and low == high else None


def transaction(table: Table) -> Transaction:
    """A transaction on `table` whose metadata, as its staged updates make it, is built once per
    update staged: pyiceberg's builds it anew, a deep copy of the whole metadata (every kept
    snapshot's summary: the ledger's ranges), at each of the ~25 reads a commit makes. The
    cost grows with the snapshots kept: ~7 ms a read at ~100 (a continuous import's, up to
    MOST_SNAPSHOTS * 1.5), a mirror's 15k-row batch into a 1M-row table 0.78 -> 0.67 s with
    its maintenance; bench/iceberg_upsert.py's few snapshots show no difference."""
    return _transaction_class()(table)


@functools.cache
def _transaction_class() -> Any:
    from pyiceberg.table import Transaction
    from pyiceberg.table.metadata import TableMetadata
    from pyiceberg.table.update import update_table_metadata

    class KeptTransaction(Transaction):
        _kept: tuple[object, object, TableMetadata] | None = None

        @property
        def table_metadata(self) -> TableMetadata:
            # Staging replaces the updates' tuple and a commit the table's metadata: either
            # makes another state. Readers take the metadata as read-only (pyiceberg's own
            # updates copy it), so one copy serves every read of a state.
            base, updates = self._table.metadata, self._updates
            kept = self._kept
            if kept is None or kept[0] is not base or kept[1] is not updates:
                kept = self._kept = (base, updates, update_table_metadata(base, updates))
            return kept[2]

    return KeptTransaction


def commit_row_delta(
    tx: Transaction,
    properties: dict[str, str],
    *,
    added: Iterable[DataFile] = (),
    removed: Iterable[DataFile] = (),
    entries: Entries = read_entries,
) -> None:
    """In `tx`, one snapshot that adds data and delete files and removes data and delete
    files (each named as the current snapshot lists it); the manifests it rewrites read by
    `entries`."""
    from pyiceberg.table.snapshots import Operation

    producer = _row_delta_class()(
        Operation.OVERWRITE, tx, tx._table.io, snapshot_properties=properties
    )
    producer.entries = entries
    for data_file in added:
        producer.append_data_file(data_file)
    for data_file in removed:
        producer.delete_data_file(data_file)
    producer.commit()


@functools.cache
def _row_delta_class() -> Any:
    """RowDelta, defined once pyiceberg is imported (the sinks import it lazily)."""
    from pyiceberg.manifest import ManifestContent, ManifestWriter
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    class RowDelta(_SnapshotProducer[Any]):
        """A snapshot of added and removed data and delete files, each in manifests of its
        kind (pyiceberg's overwrite would write a delete file into a data manifest)."""

        entries: Entries  # commit_row_delta's

        @property
        def spec_id(self) -> int:
            return self._transaction.table_metadata.default_spec_id

        def _writer(self, content: ManifestContent, spec_id: int) -> ManifestWriter:
            if content == ManifestContent.DATA:
                return self.new_manifest_writer(self.spec(spec_id))
            return _delete_manifest_writer_class()(
                self.spec(spec_id),
                self.schema(),
                self.new_manifest_output(),
                self._snapshot_id,
                self._compression,
            )

        def _manifests(self) -> list[ManifestFile]:
            added = self._added_manifests()
            carried, found = self._carried_manifests()
            missing = {f.file_path for f in self._deleted_data_files} - found
            if missing:
                raise ValueError(f"files to remove not in the table: {', '.join(sorted(missing))}")
            return added + carried

        def _added_manifests(self) -> list[ManifestFile]:
            """The added files, a manifest for the data files and one for the delete files."""
            manifests = []
            for content in (ManifestContent.DATA, ManifestContent.DELETES):
                files = [f for f in self._added_data_files if _manifest_kind(f) == content]
                if files:
                    with self._writer(content, self.spec_id) as writer:
                        for data_file in files:
                            writer.add(_added_entry(self._snapshot_id, data_file))
                    manifests.append(writer.to_manifest_file())
            return manifests

        def _carried_manifests(self) -> tuple[list[ManifestFile], set[str]]:
            """The parent snapshot's manifests, each as it is or written again with the removed
            files it lists marked deleted; and the paths of the removed files found in them."""
            manifests = []
            parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id or -1)
            found: set[str] = set()
            for manifest in parent.manifests(self._io) if parent is not None else []:
                if not (manifest.has_added_files() or manifest.has_existing_files()):
                    continue  # its files all removed by an earlier snapshot: none to carry
                if not self._deleted_data_files:
                    manifests.append(manifest)  # nothing removed: no manifest to read
                    continue
                entries = self.entries(manifest, self._io)
                gone = {id(e) for e in entries if e.data_file in self._deleted_data_files}
                if not gone:
                    manifests.append(manifest)
                    continue
                found.update(e.data_file.file_path for e in entries if id(e) in gone)
                with self._writer(manifest.content, manifest.partition_spec_id) as writer:
                    for entry in entries:
                        writer.add_entry(_kept_entry(entry, id(entry) in gone, self._snapshot_id))
                manifests.append(writer.to_manifest_file())
            return manifests, found

        def _existing_manifests(self) -> list[ManifestFile]:
            raise NotImplementedError  # _manifests decides every manifest itself

        def _deleted_entries(self) -> list[ManifestEntry]:
            raise NotImplementedError

    return RowDelta


@functools.cache
def _delete_manifest_writer_class() -> Any:
    """A writer of manifests of delete files (pyiceberg's V2 writer writes data manifests)."""
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    return DeleteManifestWriter


def _manifest_kind(data_file: DataFile) -> ManifestContent:
    from pyiceberg.manifest import DataFileContent, ManifestContent

    if data_file.content == DataFileContent.DATA:
        return ManifestContent.DATA
    return ManifestContent.DELETES


def _added_entry(snapshot_id: int, data_file: DataFile) -> ManifestEntry:
    from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus

    return ManifestEntry.from_args(
        status=ManifestEntryStatus.ADDED,
        snapshot_id=snapshot_id,
        sequence_number=None,
        file_sequence_number=None,
        data_file=data_file,
    )


def _kept_entry(entry: ManifestEntry, removes: bool, snapshot_id: int) -> ManifestEntry:
    """`entry` as a manifest written again lists it: deleted by this snapshot, or existing."""
    from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus

    status = ManifestEntryStatus.DELETED if removes else ManifestEntryStatus.EXISTING
    return ManifestEntry.from_args(
        status=status,
        snapshot_id=snapshot_id if removes else entry.snapshot_id,
        sequence_number=entry.sequence_number,
        file_sequence_number=entry.file_sequence_number,
        data_file=entry.data_file,
    )
