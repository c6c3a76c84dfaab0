"""Which database to use: the flag, `DRAINER_DATABASE_URL`, `DATABASE_URL`, libpq's
`PG*` variables, and outside a cloud function the embedded server. (Every other
setting is in `drainer.settings`.)
"""

import os
import sys
from dataclasses import dataclass

from .errors import ConfigError

CLOUD_MARKERS = ("AWS_LAMBDA_FUNCTION_NAME", "K_SERVICE", "CLOUD_RUN_JOB", "FUNCTION_TARGET")
LIBPQ_MARKERS = ("PGHOST", "PGSERVICE", "PGDATABASE")


def in_cloud_function() -> bool:
    return any(os.environ.get(name) for name in CLOUD_MARKERS)


@dataclass(frozen=True)
class Database:
    """A resolved database: its URL, and whether it is the local embedded server."""

    url: str
    embedded: bool = False


def database_url(flag: str | None) -> str | None:
    """The configured URL, or None when nothing names a database."""
    for value in (flag, os.environ.get("DRAINER_DATABASE_URL"), os.environ.get("DATABASE_URL")):
        if value:
            return value
    if any(os.environ.get(name) for name in LIBPQ_MARKERS):
        return ""  # libpq fills everything from PG* variables
    return None


def resolve_database(flag: str | None, *, force_embedded: bool = False) -> Database:
    """The database to use; starts (and migrates) the embedded one when none is named."""
    url = None if force_embedded else database_url(flag)
    if url is not None:
        return Database(url)
    if in_cloud_function():
        raise ConfigError(
            "no database URL: set DATABASE_URL (or DRAINER_DATABASE_URL, or a secret) "
            "in the function's configuration"
        )
    return Database(_start_embedded(), embedded=True)


def _start_embedded() -> str:
    """The embedded server's URL; it runs until this process and the others using it
    have exited, then stops unless `drainer db start` kept it (drainer.embedded)."""
    from . import embedded

    embedded.library()  # no note on stderr when the extra is missing
    print("drainer: no database URL given; using the embedded PostgreSQL in "
          f"./{embedded.EMBEDDED_DIR}/", file=sys.stderr)
    return embedded.use()
