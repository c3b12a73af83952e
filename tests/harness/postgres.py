"""A throwaway PostgreSQL server for tests: lagless/scenarios/postgres_server.py (`lagless demo
--mirror` starts the same one)."""

from lagless.scenarios.postgres_server import PostgresServer, free_port, postgres_binary

__all__ = ["PostgresServer", "free_port", "postgres_binary"]
