"""`migrate`: apply the numbered migrations of `queries/schema.sql`, once, under a lock.

A drain never migrates (many cold starts at once must not fight over DDL); it
only finds out, from its first statement, whether the schema is there.
"""

import psycopg

from . import sql
from .adapters import Adapter, Psycopg
from .drivers import blocking
from .sql import LATEST_VERSION, MIGRATIONS


def migrate(conn: psycopg.Connection) -> list[int]:
    """Bring the schema to the latest version; returns the versions applied now.

    One transaction under an advisory lock, so concurrent runs wait for each other
    and the later ones find nothing to do.
    """
    with sql.transaction(conn):
        return blocking(upgrade(Psycopg(conn)))


async def upgrade(adapter: Adapter, through: int = LATEST_VERSION) -> list[int]:
    """The migrations up to `through` not applied yet, applied in the adapter's open
    transaction (`migrate`'s, or a Django migration's on either psycopg) under the
    migrate lock, which holds until that transaction ends; returns their versions."""
    sql.forget(adapter.raw)  # what the schema has changes now
    await sql.fetch(adapter, "migrate_lock")
    await sql.send(adapter, "migrate_version_table")
    current = await sql.fetch(adapter, "schema_version")
    applied = [v for v in sorted(MIGRATIONS) if (current or (0,))[0] < v <= through]
    for version in applied:
        await sql.migration(adapter, version)
        await sql.fetch(adapter, "record_version", {"version": version})
    return applied


def version(conn: psycopg.Connection) -> int:
    """The recorded schema version (0 before the first `migrate`)."""
    return sql.value(conn, "schema_version") if sql.features(conn).versioned else 0


__all__ = ["LATEST_VERSION", "migrate", "upgrade", "version"]
