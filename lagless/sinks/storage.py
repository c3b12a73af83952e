"""A file store's folders on the driver, on a local disk or on S3: the few operations Parquet,
Delta and Iceberg need to stage, move, list and lock their files.

Paths are strings: absolute local paths, or `s3://bucket/key` for S3Storage (through obstore,
the object_store crate's Python binding: conditional puts, server-side copies). The tasks
reach S3 through pyarrow instead (S3Access.filesystem, task_files.py).

S3 has no rename and no lock. A move is a server-side copy and a delete; the commit lock is
an object created with `If-None-Match: *` (only one creator wins) and taken over with
`If-Match: <etag>` (only one taker wins) when its holder is this same import rerun (the lock
names the import's run) or holds it longer than LOCK_STALE_S.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from lagless.exceptions import BadInput, TransientError
from lagless.first_line import first_line
from lagless.sinks.base import check_writable_path
from lagless.sinks.s3 import S3Access, S3Url

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from obstore.store import S3Store

# A commit holds the lock for seconds (a listing, copies, one small put); one held this long
# belongs to a driver that died, and is taken over.
LOCK_STALE_S = 600.0
# How long one S3 request may take; the client retries a failed one within this.
REQUEST_TIMEOUT_S = 30


class LocalStorage:
    """Folders on the driver's (and, for a cluster, a shared) disk."""

    task_access: S3Access | None = None
    # A folder renamed appears whole or not at all: a store may publish a batch by renaming
    # the folder it gathered its files in. (S3: no rename; a store publishes by a last put.)
    renames_folders = True

    @contextlib.contextmanager
    def errors(self, what: str, unreachable: type[Exception] = TransientError) -> Iterator[None]:
        """A local disk's errors are OSErrors, which the CLI names as they are."""
        yield

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def check_writable(self, path: str, what: str) -> None:
        check_writable_path(path, what, folder=True)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)

    def move(self, source: str, destination: str) -> None:
        os.replace(source, destination)

    def names(self, folder: str) -> list[str]:
        """Names in the folder (files and folders); none if it is missing."""
        return sorted(os.listdir(folder)) if os.path.isdir(folder) else []

    def stat(self, path: str) -> tuple[int, int]:
        """A file's size and modification time (ms since the epoch)."""
        found = os.stat(path)
        return found.st_size, int(found.st_mtime * 1000)

    def parquet_metadata(self, path: str) -> pq.FileMetaData:
        import pyarrow.parquet as pq

        return pq.read_metadata(path)

    def client_options(self) -> dict[str, str] | None:
        """delta-rs's / polars' storage_options: none for a local path."""
        return None

    def read_parquet(self, path: str, columns: list[str] | None = None) -> pa.Table:
        import pyarrow.parquet as pq

        return pq.read_table(path, columns=columns)

    def read_text(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write_text(self, path: str, text: str) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)

    def create_new(self, path: str, data: bytes) -> bool:
        """The file written whole only if absent (a Delta log entry: one writer per version);
        False when it exists. A link of a complete temporary file: never half a file."""
        temporary = os.path.join(os.path.dirname(path), f".lagless-{uuid.uuid4().hex}.tmp")
        with open(temporary, "wb") as handle:
            handle.write(data)
        try:
            os.link(temporary, path)
            return True
        except FileExistsError:
            return False
        finally:
            os.remove(temporary)

    def write_parquet(self, path: str, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        pq.write_table(table, path)

    def open_parquet(self, path: str) -> pq.ParquetFile:
        """A file to read a row group at a time (merge_parquet)."""
        import pyarrow.parquet as pq

        return pq.ParquetFile(path)

    def parquet_writer(self, path: str, schema: pa.Schema) -> pq.ParquetWriter:
        import pyarrow.parquet as pq

        return pq.ParquetWriter(path, schema)

    def files(self, folder: str) -> dict[str, tuple[int, int]]:
        """Every file under the folder, by path relative to it: its size and modification time
        (ms since the epoch). None missing: an empty listing."""
        found = {}
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                try:
                    size, modified = self.stat(path)
                except FileNotFoundError:
                    continue  # removed while listed
                found[os.path.relpath(path, folder)] = (size, modified)
        return found

    @contextlib.contextmanager
    def locked(self, path: str, run_id: str, wait_s: float) -> Iterator[None]:
        """The lock file's flock: the kernel drops it with its holder. The holder removes the
        file before it lets go (a clean run leaves no lock behind): one that waited on the
        removed file finds its path gone or another file's, and locks anew."""
        while True:
            handle = open(path, "a")  # noqa: SIM115 - closed below, or kept while held
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                held = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                held = False
            if held:
                break
            handle.close()
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


class S3Storage:
    """Folders under `s3://bucket/prefix`, through obstore."""

    renames_folders = False

    def __init__(self, url: S3Url) -> None:
        self.url = url
        self.task_access: S3Access | None = url.access
        self._store: S3Store | None = None
        self._filesystem: pafs.S3FileSystem | None = None

    @property
    def store(self) -> S3Store:
        if self._store is None:
            from obstore.store import S3Store

            self._store = S3Store(
                self.url.bucket,
                config=cast(Any, self.url.access.object_store_config()),
                client_options={"timeout": f"{REQUEST_TIMEOUT_S}s", "connect_timeout": "5s"},
                retry_config={
                    "max_retries": 3,
                    "backoff": {"init_backoff": timedelta(milliseconds=200)},
                    "retry_timeout": timedelta(seconds=REQUEST_TIMEOUT_S),
                },
            )
        return self._store

    def join(self, *parts: str) -> str:
        return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))

    def key(self, path: str) -> str:
        prefix = f"s3://{self.url.bucket}/"
        if not path.startswith(prefix):
            raise ValueError(f"{path!r} is not in bucket {self.url.bucket!r}")
        return path[len(prefix) :]

    def check_writable(self, path: str, what: str) -> None:
        """A probe object is written and deleted under the path: the endpoint answers, the
        bucket exists and these credentials may write there; else BadInput, before anything
        is written (as a broker that never answered, an endpoint that does not is bad input)."""
        import obstore as obs

        probe = self.key(self.join(path, f".lagless-probe-{uuid.uuid4().hex}"))
        with self.errors(f"{what} {self.url.shown}", unreachable=BadInput):
            obs.put(self.store, probe, b"", mode="create")
            obs.delete(self.store, probe)

    @contextlib.contextmanager
    def errors(self, what: str, unreachable: type[Exception] = TransientError) -> Iterator[None]:
        """obstore's errors as lagless's, in one line (obstore's own tell the whole request):
        a refusal or a missing bucket is BadInput, a server that does not answer (beyond the
        client's retries) `unreachable`: TransientError, a rerun resumes."""
        from obstore.exceptions import GenericError, PermissionDeniedError, UnauthenticatedError

        try:
            yield
        except (PermissionDeniedError, UnauthenticatedError):
            raise BadInput(
                f"{what}: access denied (check AWS_ACCESS_KEY_ID and its secret)"
            ) from None
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise BadInput(f"{what}: bucket {self.url.bucket!r} does not exist") from None
            raise BadInput(f"{what}: not found ({_reason(exc)})") from None
        except GenericError as exc:
            endpoint = self.url.access.endpoint or "AWS"
            raise unreachable(
                f"{what}: S3 at {endpoint} does not answer ({_reason(exc)})"
            ) from None

    def makedirs(self, path: str) -> None:
        """S3 has no folders: a key's prefix is one."""

    def remove_tree(self, path: str) -> None:
        import obstore as obs

        listed = obs.list(self.store, self.key(path) + "/")
        keys = [meta["path"] for chunk in listed for meta in chunk]
        for start in range(0, len(keys), 1000):
            obs.delete(self.store, keys[start : start + 1000])

    def remove(self, path: str) -> None:
        import obstore as obs

        obs.delete(self.store, self.key(path))

    def move(self, source: str, destination: str) -> None:
        """A server-side copy and a delete."""
        import obstore as obs

        obs.rename(self.store, self.key(source), self.key(destination))

    def names(self, folder: str) -> list[str]:
        import obstore as obs

        prefix = self.key(folder) + "/"
        listed = obs.list_with_delimiter(self.store, prefix)
        found = [p.rstrip("/").rsplit("/", 1)[-1] for p in listed["common_prefixes"]]
        found += [o["path"].rsplit("/", 1)[-1] for o in listed["objects"]]
        return sorted(found)

    def stat(self, path: str) -> tuple[int, int]:
        import obstore as obs

        meta = obs.head(self.store, self.key(path))
        return int(meta["size"]), int(meta["last_modified"].timestamp() * 1000)

    def parquet_metadata(self, path: str) -> pq.FileMetaData:
        import pyarrow.parquet as pq

        return pq.read_metadata(path.removeprefix("s3://"), filesystem=self.filesystem)

    def read_parquet(self, path: str, columns: list[str] | None = None) -> pa.Table:
        import pyarrow.parquet as pq

        return pq.read_table(
            path.removeprefix("s3://"), filesystem=self.filesystem, columns=columns
        )

    @property
    def filesystem(self) -> pafs.S3FileSystem:
        """pyarrow's, to read files' footers and rows on the driver."""
        if self._filesystem is None:
            self._filesystem = self.url.access.filesystem()
        return self._filesystem

    def client_options(self) -> dict[str, str]:
        """delta-rs's / polars' storage_options (object_store's keys). Commits are conditional
        puts (`If-None-Match: *` on the log's next entry), which SeaweedFS and AWS honour, so
        two writers cannot both take one version of a Delta log."""
        return {**self.url.access.object_store_config(), "conditional_put": "etag"}

    def read_text(self, path: str) -> str | None:
        import obstore as obs

        try:
            return bytes(obs.get(self.store, self.key(path)).bytes()).decode("utf-8")
        except FileNotFoundError:
            return None

    def write_text(self, path: str, text: str) -> None:
        import obstore as obs

        obs.put(self.store, self.key(path), text.encode("utf-8"))

    def create_new(self, path: str, data: bytes) -> bool:
        """The object put only if absent (`If-None-Match: *`); False when it exists."""
        import obstore as obs
        from obstore.exceptions import AlreadyExistsError

        try:
            obs.put(self.store, self.key(path), data, mode="create")
            return True
        except AlreadyExistsError:
            return False

    def write_parquet(self, path: str, table: pa.Table) -> None:
        import pyarrow.parquet as pq

        pq.write_table(table, path.removeprefix("s3://"), filesystem=self.filesystem)

    def open_parquet(self, path: str) -> pq.ParquetFile:
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.filesystem.open_input_file(path.removeprefix("s3://")))

    def parquet_writer(self, path: str, schema: pa.Schema) -> pq.ParquetWriter:
        import pyarrow.parquet as pq

        return pq.ParquetWriter(path.removeprefix("s3://"), schema, filesystem=self.filesystem)

    def files(self, folder: str) -> dict[str, tuple[int, int]]:
        """Every object under the folder, by key relative to it: its size and modification
        time (ms since the epoch)."""
        import obstore as obs

        prefix = self.key(folder) + "/"
        return {
            meta["path"][len(prefix) :]: (
                int(meta["size"]),
                int(meta["last_modified"].timestamp() * 1000),
            )
            for chunk in obs.list(self.store, prefix)
            for meta in chunk
        }

    @contextlib.contextmanager
    def locked(self, path: str, run_id: str, wait_s: float) -> Iterator[None]:
        """The lock object, created only if absent; one this import left (a crashed run of it)
        or one older than LOCK_STALE_S is taken over, only if unchanged since read. Waits up to
        wait_s for another import's, then TransientError."""
        import obstore as obs
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        key = self.key(path)
        mine = json.dumps({"run": run_id, "owner": uuid.uuid4().hex}).encode()
        deadline = time.monotonic() + wait_s
        while True:
            try:
                obs.put(self.store, key, mine, mode="create")
                break
            except AlreadyExistsError:
                pass
            try:
                held = obs.get(self.store, key)
                holder = json.loads(bytes(held.bytes()))
                meta = held.meta
            except (FileNotFoundError, ValueError):
                continue
            age = (datetime.now(UTC) - meta["last_modified"]).total_seconds()
            if holder.get("run") == run_id or age > LOCK_STALE_S:
                try:
                    obs.put(self.store, key, mine, mode={"e_tag": meta["e_tag"]})
                    break
                except (PreconditionError, FileNotFoundError):
                    continue
            if time.monotonic() > deadline:
                raise TransientError(
                    f"{path} is held by another import (for {age:.0f} s); if none runs, "
                    "delete it, or wait: it is taken over after "
                    f"{LOCK_STALE_S:.0f} s"
                )
            time.sleep(0.5)
        try:
            yield
        finally:
            obs.delete(self.store, key)


Storage = LocalStorage | S3Storage

# A merged file's row groups: rows (pyarrow's default most) and the bytes of Arrow they are
# gathered in first, whichever comes first.
ROW_GROUP_ROWS = 1024 * 1024
ROW_GROUP_BYTES = 64 * 1024 * 1024
# The rows read from a source file at a time.
READ_ROWS = 64 * 1024


def merge_parquet(storage: Storage, sources: list[str], destination: str) -> int:
    """The sources' rows, in order, written into one file (a compaction's): their columns
    unified as pa.concat_tables(promote_options="default") does (a column some lack is NULL
    there), read and written a row group at a time, so that the driver holds one row group
    however large the files (a 94 MB group of a plain table's files whole: 0.64 GiB of Arrow,
    the driver's RSS at 975 MiB). Returns the rows written."""
    import pyarrow as pa

    files = [storage.open_parquet(path) for path in sources]
    schema = pa.unify_schemas([each.schema_arrow for each in files], promote_options="default")
    written, gathered = 0, []
    with storage.parquet_writer(destination, schema) as writer:
        for each in files:
            for batch in each.iter_batches(batch_size=READ_ROWS):
                gathered.append(_conformed(batch, schema))
                rows = sum(b.num_rows for b in gathered)
                if rows >= ROW_GROUP_ROWS or sum(b.nbytes for b in gathered) >= ROW_GROUP_BYTES:
                    written += _write_row_group(writer, gathered)
                    gathered = []
        written += _write_row_group(writer, gathered)
    return written


def _conformed(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The batch in the unified schema: its columns in order, cast where the schema widened
    them, NULL where it lacks one."""
    import pyarrow as pa

    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
        else:
            column = batch.column(index)
            columns.append(column if column.type == field.type else column.cast(field.type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _write_row_group(writer: pq.ParquetWriter, batches: list[pa.RecordBatch]) -> int:
    import pyarrow as pa

    if not batches:
        return 0
    rows = pa.Table.from_batches(batches)
    writer.write_table(rows, row_group_size=ROW_GROUP_ROWS)
    return rows.num_rows


def _reason(exc: Exception) -> str:
    return first_line(exc)[:200]
