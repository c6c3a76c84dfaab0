"""`migrate`: create or upgrade the schema (idempotent, safe to run concurrently)."""

import argparse

from ..storage import schema
from .common import emit, log, open_db


def cmd_migrate(args: argparse.Namespace) -> None:
    # Building an index on a big hand-made table may take longer than a drain's timeout.
    with open_db(args, statement_timeout=None) as conn:
        applied = schema.migrate(conn)
        version = schema.version(conn)
    log.info("schema at version %d%s", version,
             f" (applied {', '.join(map(str, applied))})" if applied else " (already current)")
    emit({"version": version, "applied": applied})
