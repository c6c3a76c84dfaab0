"""`migrate`: apply the numbered migrations of `queries/schema.sql`, once, under a lock.

A drain never migrates (many cold starts at once must not fight over DDL); it
only finds out, from its first statement, whether the schema is there.
"""

import psycopg

from . import sql
from .sql import LATEST_VERSION, MIGRATIONS


def migrate(conn: psycopg.Connection) -> list[int]:
    """Bring the schema to the latest version; returns the versions applied now.

    One transaction under an advisory lock, so concurrent runs wait for each other
    and the later ones find nothing to do.
    """
    sql.forget(conn)  # what the schema has changes now
    with sql.transaction(conn):
        sql.run(conn, "migrate_lock")
        sql.run(conn, "migrate_version_table")
        current = sql.value(conn, "schema_version")
        applied = [v for v in sorted(MIGRATIONS) if v > current]
        for version in applied:
            sql.migration(conn, version)
            sql.run(conn, "record_version", {"version": version})
    return applied


def version(conn: psycopg.Connection) -> int:
    """The recorded schema version (0 before the first `migrate`)."""
    return sql.value(conn, "schema_version") if sql.features(conn).versioned else 0


__all__ = ["LATEST_VERSION", "migrate", "version"]
