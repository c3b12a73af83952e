"""A throwaway PostgreSQL server from Debian's package: initdb in a temp dir, pg_ctl on loopback.
Started by the tests (tests/harness/postgres.py) and `lagless demo --mirror`."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass


def postgres_binary(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"{name} not found: apt-get install postgresql")
    return found[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """initdb refuses to run as root, so as root the server runs as the postgres user."""

    folder: str
    port: int
    # wal_level=logical: Debezium's connector reads its changes (tests/harness/debezium.py).
    logical: bool = False

    @property
    def connection(self) -> dict[str, str | int]:
        """Host, port, user, password and database, as Debezium's connector takes them."""
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "user": "lagless",
            "password": "secret-pw",
            "dbname": "lagless",
        }

    @property
    def url(self) -> str:
        return f"postgresql://lagless:secret-pw@127.0.0.1:{self.port}/lagless"

    def _run(self, *args: str) -> None:
        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    @classmethod
    def start_new(cls, logical: bool = False) -> PostgresServer:
        folder = tempfile.mkdtemp(prefix="lagless-pg-")
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres", "postgres")
        server = cls(folder, free_port(), logical)
        pwfile = os.path.join(folder, "pw")
        with open(pwfile, "w") as handle:
            handle.write("secret-pw\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        data = os.path.join(folder, "data")
        server._run(
            postgres_binary("initdb"),
            "-D",
            data,
            "-U",
            "lagless",
            f"--pwfile={pwfile}",
            "-A",
            "scram-sha-256",
        )
        for attempt in range(3):
            try:
                server.start()
                break
            except subprocess.CalledProcessError:
                # Another process may have bound the port between our probe and pg_ctl.
                if attempt == 2:
                    raise
                server.port = free_port()
        import psycopg

        admin = f"host=127.0.0.1 port={server.port} dbname=postgres user=lagless password=secret-pw"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE lagless")
        return server

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off"
        if self.logical:
            options += " -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20"
        log = os.path.join(self.folder, "log")
        self._run(
            postgres_binary("pg_ctl"),
            "-D",
            os.path.join(self.folder, "data"),
            "-o",
            options,
            "-l",
            log,
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._run(
            postgres_binary("pg_ctl"),
            "-D",
            os.path.join(self.folder, "data"),
            "-m",
            "fast",
            "-w",
            "stop",
        )

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
