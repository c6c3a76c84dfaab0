"""The signed HTTP requests seen (drainer.http), remembered in the database so that
every instance of the entry point refuses a replay of one."""

from datetime import timedelta

import psycopg

from . import sql


def remember(conn: psycopg.Connection, signature: str, keep: timedelta) -> bool:
    """Remember `signature` for `keep`; False when it was seen already (a replay).
    SchemaMissing before the migration that adds the table."""
    return sql.row(conn, "http_remember_signature",
                   {"signature": signature, "keep": keep.total_seconds()}) is not None
