"""sinks/url.py: every store's URL read one way; a server's credentials decoded once and
encoded again only for the client that decodes them; the password never in `shown`."""

from __future__ import annotations

import os
import re
from urllib.parse import quote, unquote, urlsplit

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lagless.exceptions import BadInput
from lagless.sinks import sink_from_url
from lagless.sinks.url import (
    absolute,
    local_url,
    parse_local,
    parse_server,
    relative_that_looks_absolute,
)

ONLY_WRITE_FROM = re.escape("the only query parameter is write_from=executors|driver")


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///orders.db", "orders.db"),
        ("sqlite:////tmp/x.db", "/tmp/x.db"),
        ("sqlite:///a%20b.db", "a b.db"),  # percent-escapes decoded, as in any URL
        ("sqlite:///100%25.db", "100%.db"),
        ("sqlite:///what%3F.db?write_from=executors", "what?.db"),
    ],
)
def test_local_paths_follow_sqlalchemy(url: str, path: str) -> None:
    parsed = parse_local(url, "sqlite", write_from=True)
    assert parsed.path == path and parsed.write_from == "executors"
    assert parsed.shown == url.partition("?")[0]


@given(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1)
)
@example("/0/")  # an absolute path is kept as given, its trailing slash too (CI, stop 67)
@example("a/../b/")
def test_a_local_url_made_from_any_path_reads_back_as_that_path(path: str) -> None:
    """local_url escapes what parse_local decodes; absolute() makes a relative path absolute
    (os.path.abspath) and keeps an absolute one as it was given."""
    assert parse_local(local_url("parquet", path), "parquet").path == path
    absolute_path = parse_local(absolute(local_url("parquet", path)), "parquet").path
    assert absolute_path == (path if path.startswith("/") else os.path.abspath(path))


def test_a_bad_percent_escape_is_one_line() -> None:
    with pytest.raises(BadInput, match="is not UTF-8"):
        parse_local("sqlite:///%ff.db", "sqlite")


def test_a_relative_path_starting_with_a_new_folder_is_told_with_both_readings(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    said = relative_that_looks_absolute("sqlite:///data/orders.db")
    assert said == (
        f"sqlite:///data/orders.db is the relative path {tmp_path}/data/orders.db (three "
        "slashes); for the absolute path /data/orders.db, write sqlite:////data/orders.db"
    )
    (tmp_path / "data").mkdir()  # a folder of the working folder: meant so
    assert relative_that_looks_absolute("sqlite:///data/orders.db") is None
    for url in ("sqlite:///orders.db", "sqlite:////data/x.db", "postgresql://h/db"):
        assert relative_that_looks_absolute(url) is None


def test_write_from_is_read_the_same_for_every_store_that_takes_it() -> None:
    assert parse_local(
        "sqlite:///a.db?write_from=driver", "sqlite", write_from=True
    ).write_from == ("driver")
    assert parse_server("postgresql://h/db?write_from=driver", write_from=True).write_from == (
        "driver"
    )
    assert sink_from_url("sqlite:///a.db?write_from=driver").write_from == "driver"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "query",
    ["write_from=jvm", "write_from=driver&write_from=driver", "other=1", "write_from", "x"],
)
def test_any_other_query_is_one_message_for_sqlite_and_postgresql(query: str) -> None:
    with pytest.raises(BadInput, match=ONLY_WRITE_FROM):
        parse_local(f"sqlite:///a.db?{query}", "sqlite", write_from=True)
    with pytest.raises(BadInput, match=ONLY_WRITE_FROM):
        parse_server(f"postgresql://u:pw@h/db?{query}", write_from=True)


@pytest.mark.parametrize("scheme", ["parquet", "delta"])
def test_folder_stores_take_no_query(scheme: str) -> None:
    with pytest.raises(BadInput, match="takes no query parameters"):
        parse_local(f"{scheme}:///out?write_from=driver", scheme)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite://host/x.db", "sqlite:///?x"])
def test_a_local_url_without_a_path_is_refused(url: str) -> None:
    with pytest.raises(BadInput, match="has no path"):
        parse_local(url, "sqlite")


@pytest.mark.parametrize(
    "url", ["postgresql:///db", "postgresql://h", "postgresql://u:secret@h/", "postgresql://h:x/d"]
)
def test_a_server_url_needs_a_host_a_database_and_a_numeric_port(url: str) -> None:
    with pytest.raises(BadInput) as raised:
        parse_server(url)
    assert "secret" not in str(raised.value)


def test_a_percent_encoded_password_is_decoded_once() -> None:
    """The bug: `p%40ss` reached psycopg as `p%40ss` and ADBC as `p%2540ss`."""
    parsed = parse_server("postgresql://us%40er:p%40ss@db.example:5433/my%20db")
    assert parsed.user == "us@er" and parsed.password is not None
    assert parsed.password.reveal() == "p@ss"
    assert (parsed.host, parsed.port, parsed.path) == ("db.example", 5433, "my db")
    uri = urlsplit(parsed.uri(application_name="lagless").reveal())
    assert unquote(uri.password or "") == "p@ss" and unquote(uri.username or "") == "us@er"
    assert uri.query == "application_name=lagless" and unquote(uri.path) == "/my db"


def test_an_ipv6_host_keeps_its_brackets() -> None:
    parsed = parse_server("postgresql://u@[::1]:5432/db")
    assert parsed.host == "::1"
    assert urlsplit(parsed.uri().reveal()).hostname == "::1"


# Any text a password can hold, '@', '%', ':' and '/' included.
PASSWORDS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)
USERS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@given(user=USERS, password=PASSWORDS)
def test_credentials_come_back_as_written_and_the_password_is_never_shown(
    user: str, password: str
) -> None:
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:5432"
    url = f"postgresql://{netloc}/lagless?write_from=driver"
    parsed = parse_server(url, write_from=True)
    assert parsed.user == user and parsed.password is not None
    assert parsed.password.reveal() == password
    assert parsed.shown == f"postgresql://{quote(user, safe='')}:****@127.0.0.1:5432/lagless"
    again = urlsplit(parsed.uri().reveal())
    assert unquote(again.username or "") == user and unquote(again.password or "") == password
    assert "Secret('****')" in repr(parsed)


def test_the_postgresql_sink_shows_the_url_without_its_password() -> None:
    sink = sink_from_url("postgresql://u:hunter%2F2@h:5432/db")
    assert sink.url == "postgresql://u:****@h:5432/db" and "hunter" not in repr(vars(sink))


def test_absolute_makes_a_local_path_absolute_and_leaves_the_rest_as_it_is(
    tmp_path, monkeypatch
) -> None:
    """A Spark Connect server resolves paths from its own folder (importer/job.py)."""
    monkeypatch.chdir(tmp_path)
    assert absolute("sqlite:///out.db") == f"sqlite:///{tmp_path}/out.db"
    assert absolute("sqlite:///out.db?write_from=driver") == (
        f"sqlite:///{tmp_path}/out.db?write_from=driver"
    )
    assert absolute("parquet:////abs/lake") == "parquet:////abs/lake"
    server = "postgresql://u:p@h:5432/db?write_from=driver"
    assert absolute(server) == server
    assert parse_local(absolute("delta:///lake"), "delta").path == f"{tmp_path}/lake"
