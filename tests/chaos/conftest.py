"""Fixtures of the chaos tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def chaos_postgres():
    """A PostgreSQL server (tests/pg_server.py) of the chaos tests' own, not the shared
    ``postgres_server``: each ``payments_pg`` scenario drops and recreates the server's database
    and rolls back whatever is prepared on it (chaos_harness.fresh_database)."""
    from pg_server import PostgresServer

    server = PostgresServer().start()
    yield server
    server.close()
