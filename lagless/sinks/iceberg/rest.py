"""An Iceberg REST catalog by URL: `iceberg+rest://HOST:PORT/WAREHOUSE[?tls=false]`.

The catalog at `https://HOST:PORT` (`http://` with `?tls=false`), its warehouse WAREHOUSE,
whose tables lie under `s3://WAREHOUSE/` (as an S3 table bucket's do: SeaweedFS's catalog,
say). The driver signs in with OAuth2's client-credentials flow (the REST spec's
`/v1/oauth/tokens`, pyiceberg's `credential`), the client being AWS_ACCESS_KEY_ID and its
secret AWS_SECRET_ACCESS_KEY; the same variables reach S3 for the data files (sinks/s3.py).
The secret is a Secret until pyiceberg's configuration.

Why not SigV4 (pyiceberg's `rest.sigv4-enabled`): pyiceberg's adapter signs a request with a
body over the body's SHA-256 but sends no `x-amz-content-sha256` header, and an S3-style
verifier (SeaweedFS's) takes a missing header as the empty body's hash: every POST's
signature mismatches.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlsplit

from lagless.exceptions import BadInput, TransientError
from lagless.first_line import first_line
from lagless.sinks.s3 import S3Url, finalize_at_exit, parse_s3

if TYPE_CHECKING:
    from pyiceberg.catalog.rest import RestCatalog

SCHEME = "iceberg+rest"
OPTIONS = ("tls",)


@dataclass(frozen=True)
class RestUrl:
    """The catalog's address and warehouse, and the warehouse's bucket as a folder on S3."""

    uri: str
    warehouse: str
    shown: str
    s3: S3Url


def is_rest(url: str) -> bool:
    return urlsplit(url).scheme == SCHEME


def parse_rest(url: str) -> RestUrl:
    parts = urlsplit(url)
    warehouse = parts.path.strip("/")
    shown = f"{SCHEME}://{parts.netloc.rpartition('@')[2]}{parts.path}"
    if "@" in parts.netloc:
        raise BadInput(
            f"sink URL {shown!r}: credentials go in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
            "not in the URL"
        )
    if not parts.hostname or not warehouse or "/" in warehouse:
        raise BadInput(f"sink URL {shown!r}: expected {SCHEME}://HOST:PORT/WAREHOUSE")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise BadInput(f"sink URL {shown!r}: unknown option {unknown[0]!r} (takes tls)")
    tls = options.get("tls", "true").lower()
    if tls not in ("true", "false"):
        raise BadInput(f"sink URL {shown!r}: tls is true or false, not {tls!r}")
    scheme = "https" if tls == "true" else "http"
    # The data files: the warehouse's bucket, reached as any S3 folder is.
    s3 = parse_s3(f"iceberg+s3://{warehouse}", "iceberg")
    return RestUrl(f"{scheme}://{parts.netloc}", warehouse, shown, s3)


def open_catalog(rest: RestUrl, name: str) -> RestCatalog:
    """pyiceberg's client of the catalog, signed in (its first requests happen here)."""
    from pyiceberg.catalog.rest import RestCatalog

    access = rest.s3.access
    if not (access.access_key and access.secret_key):
        raise BadInput(
            f"sink URL {rest.shown!r}: the catalog's sign-in needs AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY"
        )
    finalize_at_exit()  # pyiceberg reads and writes through pyarrow's S3
    with errors(rest):
        return RestCatalog(
            name,
            uri=rest.uri,
            warehouse=rest.warehouse,
            **{"oauth2-server-uri": f"{rest.uri}/v1/oauth/tokens"},
            credential=f"{access.access_key}:{access.secret_key.reveal()}",
            **{"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO"},
            **access.iceberg_properties(),
        )


@contextmanager
def errors(rest: RestUrl) -> Iterator[None]:
    """A catalog that does not answer or fails on its side: a rerun may pass (one that fails
    mid-commit leaves the commit made or not, and the rerun reads which from the ledger). One
    that refuses the credentials or the warehouse: bad input."""
    from pyiceberg.exceptions import (
        BadRequestError,
        CommitStateUnknownException,
        ForbiddenError,
        OAuthError,
        ServerError,
        ServiceUnavailableError,
        UnauthorizedError,
    )
    from requests.exceptions import ConnectionError, Timeout

    try:
        yield
    except (
        ConnectionError,
        Timeout,
        ServerError,
        ServiceUnavailableError,
        CommitStateUnknownException,
    ) as exc:
        raise TransientError(
            f"Iceberg REST catalog {rest.shown!r} does not answer: {first_line(exc)}"
        ) from None
    except (OAuthError, UnauthorizedError, ForbiddenError, BadRequestError) as exc:
        raise BadInput(f"Iceberg REST catalog {rest.shown!r} refused: {first_line(exc)}") from None
