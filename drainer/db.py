"""Opening connections: one place that sets timeouts, application_name and autocommit."""

from datetime import timedelta

import psycopg

from .errors import ConfigError, translated

APPLICATION_NAME = "drainer"


def parse_url(url: str) -> dict:
    """The URL's parameters, or ConfigError (exit 2) for one libpq could never use."""
    try:
        # libpq would stop reading at a NUL and use what comes before it.
        params = None if "\x00" in url else psycopg.conninfo.conninfo_to_dict(url)
    except (psycopg.ProgrammingError, UnicodeError):  # UnicodeError: a lone surrogate
        params = None
    ports = str((params or {}).get("port") or "5432").split(",")
    if params is None or not all(_is_port(p.strip()) for p in ports):
        raise ConfigError(
            "the database URL is not valid; expected postgresql://user@host:port/dbname"
        )
    return params


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 0 < int(text) < 65536


def connect(
    url: str,
    *,
    application_name: str = APPLICATION_NAME,
    connect_timeout: float = 10,
    statement_timeout: timedelta | None = timedelta(seconds=30),
    prepare: bool = True,
) -> psycopg.Connection:
    """An autocommit connection: every statement commits at once, so no transaction
    is ever left open while a handler runs (the seed's idle-in-transaction pitfall).

    Timeouts travel in the startup packet, costing no statement. `prepare=False` is
    for transaction-mode poolers (PgBouncer, RDS Proxy): no prepared statements, and
    no startup `options`, which they refuse ("unsupported startup parameter"), so the
    statement timeout behind one is the role's (ALTER ROLE ... SET statement_timeout).
    libpq's PG* variables fill whatever the URL leaves out.
    """
    options = ""
    if statement_timeout is not None and prepare:
        options = f"-c statement_timeout={int(statement_timeout.total_seconds() * 1000)}"
    params = parse_url(url)
    with translated():
        conn = psycopg.connect(
            url,
            autocommit=True,
            application_name=params.get("application_name", application_name),
            connect_timeout=max(1, int(connect_timeout)),
            options=" ".join(filter(None, [params.get("options", ""), options])),
            prepare_threshold=0 if prepare else None,
        )
    return conn
