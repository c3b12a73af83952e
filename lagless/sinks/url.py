"""Sink URLs, read once for every store: `sqlite:///file.db`, `parquet:///dir`, `delta:///dir`,
`iceberg:///dir`, `postgresql://user:password@host:port/db`, and the `?write_from=` of the
stores that take it.

Percent-escapes in a server's user, password and database are decoded here, once: each
client gets the plain values (psycopg) or encodes them again itself (`SinkUrl.uri`, ADBC).
The password is a Secret from here on and `shown`, the URL as messages give it, masks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

from lagless.exceptions import BadInput
from lagless.secret import Secret

# `?write_from=`: where a store's rows are written from, by Spark's tasks (the default) or
# through the driver. The only query parameter, and only SQLite and PostgreSQL take it.
WRITE_FROM = ("executors", "driver")
MASK = "****"


@dataclass(frozen=True)
class SinkUrl:
    scheme: str
    # The URL as a message may show it: the password masked, no query.
    shown: str
    # A local store's path (SQLAlchemy's rule: three slashes start a relative path, four an
    # absolute one); a server's database.
    path: str
    write_from: str = WRITE_FROM[0]
    host: str | None = None
    port: int | None = None
    user: str | None = None
    password: Secret | None = None

    def uri(self, **parameters: str) -> Secret:
        """A server's URL with the password, encoded for a client that decodes it (libpq,
        ADBC), with these query parameters."""
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host or ""
        netloc = f"{host}:{self.port}" if self.port else host
        if self.user is not None:
            password = f":{quote(self.password.reveal(), safe='')}" if self.password else ""
            netloc = f"{quote(self.user, safe='')}{password}@{netloc}"
        path = "/" + quote(self.path, safe="")
        return Secret(urlunsplit((self.scheme, netloc, path, urlencode(parameters), "")))


def parse_local(url: str, scheme: str, *, write_from: bool = False) -> SinkUrl:
    """`scheme:///relative/path` or `scheme:////absolute/path`; with write_from, the store
    takes `?write_from=`. Percent-escapes in the path are decoded, as in any URL (`p%20q.db`
    is `p q.db`; `%3F` a `?`, `%25` a `%`)."""
    prefix = f"{scheme}:///"
    rest = url[len(prefix) :] if url.startswith(prefix) else ""
    written, _, query = rest.partition("?")
    try:
        path = unquote(written, errors="strict")
    except UnicodeDecodeError:
        raise BadInput(f"sink URL {url!r}: a percent-escape of its path is not UTF-8") from None
    if not path:
        raise BadInput(f"sink URL {url!r} has no path (expected {prefix}PATH)")
    if "\x00" in path:
        raise BadInput(f"sink URL {url!r} has a NUL byte in its path")
    shown = f"{prefix}{written}"
    return SinkUrl(scheme, shown, path, _write_from(query, shown, write_from))


def local_url(scheme: str, path: str) -> str:
    """The URL of a local store at `path`, escaped as parse_local decodes it (a relative path
    stays relative)."""
    return f"{scheme}:///{quote(path)}"


def absolute(url: str) -> str:
    """A local store's URL with its path made absolute (`scheme:////abs/path`); a server's URL,
    or an absolute one, as it is."""
    scheme, slashes, rest = url.partition(":///")
    if not slashes or rest.startswith("/") or not rest or "/" in scheme:
        return url
    path, question, query = rest.partition("?")
    return f"{local_url(scheme, os.path.abspath(unquote(path)))}{question}{query}"


def relative_that_looks_absolute(url: str) -> str | None:
    """One line when a local store's path is relative (three slashes) and starts with a folder
    the working folder has not (`sqlite:///data/orders.db` without ./data): a new folder tree
    under the working folder, where the user may have meant the absolute path. Else None."""
    scheme, slashes, rest = url.partition(":///")
    if not slashes or not rest or rest.startswith("/") or "/" in scheme:
        return None
    path = unquote(rest.partition("?")[0])
    first, separator, _ = path.partition("/")
    if not separator or first in ("", ".", "..") or os.path.exists(first):
        return None
    return (
        f"{url} is the relative path {os.path.abspath(path)} (three slashes); for the absolute "
        f"path /{path}, write {scheme}:////{rest}"
    )


def parse_server(url: str, *, write_from: bool = False) -> SinkUrl:
    """`scheme://user:password@host:port/database`; user, password and database decoded once;
    with write_from, the store takes `?write_from=`."""
    parts = urlsplit(url)
    credentials, at, address = parts.netloc.rpartition("@")
    user, colon, password = credentials.partition(":")
    shown = urlunsplit(
        (parts.scheme, f"{user}:{MASK}@{address}" if colon else parts.netloc, parts.path, "", "")
    )
    try:
        port = parts.port
    except ValueError:
        raise BadInput(f"sink URL {shown!r} has a port that is not a number") from None
    database = unquote(parts.path.strip("/"))
    if not parts.hostname or not database:
        raise BadInput(f"sink URL {shown!r} needs a host and a database")
    return SinkUrl(
        parts.scheme,
        shown,
        database,
        _write_from(parts.query, shown, write_from),
        host=parts.hostname,
        port=port,
        user=unquote(user) if at else None,
        password=Secret(unquote(password)) if password else None,
    )


def _write_from(query: str, shown: str, taken: bool) -> str:
    if not query:
        return WRITE_FROM[0]
    pairs = parse_qsl(query, keep_blank_values=True)
    if not taken:
        raise BadInput(f"sink URL {shown!r} takes no query parameters")
    if len(pairs) != 1 or pairs[0][0] != "write_from" or pairs[0][1] not in WRITE_FROM:
        raise BadInput(
            f"sink URL {shown!r}: the only query parameter is write_from={'|'.join(WRITE_FROM)}"
        )
    return pairs[0][1]
