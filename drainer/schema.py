"""`migrate`: apply the numbered migrations of `sql/schema.sql`, once, under a lock.

A drain never migrates (many cold starts at once must not fight over DDL); it
only finds out, from its first statement, whether the schema is there.
"""

import psycopg

from .errors import translated
from .sql import LATEST_VERSION, MIGRATIONS, QUERIES


def migrate(conn: psycopg.Connection) -> list[int]:
    """Bring the schema to the latest version; returns the versions applied now.

    One transaction under an advisory lock, so concurrent runs wait for each other
    and the later ones find nothing to do.
    """
    with translated(), conn.transaction():
        conn.execute(QUERIES["migrate_lock"])
        conn.execute(QUERIES["migrate_version_table"])
        current = conn.execute(QUERIES["schema_version"]).fetchone()[0]
        applied = [v for v in sorted(MIGRATIONS) if v > current]
        for version in applied:
            conn.execute(MIGRATIONS[version], prepare=False)  # several statements
            conn.execute(QUERIES["record_version"], {"version": version})
    return applied


def version(conn: psycopg.Connection) -> int:
    """The recorded schema version (0 before the first `migrate`)."""
    with translated():
        exists = conn.execute(QUERIES["has_version_table"]).fetchone()[0]
        return conn.execute(QUERIES["schema_version"]).fetchone()[0] if exists else 0


__all__ = ["LATEST_VERSION", "migrate", "version"]
