"""Opening connections: one place that sets timeouts, application_name, the client
encoding and autocommit; and what text the database's encoding can store."""

import os
from collections.abc import Sequence
from datetime import timedelta
from functools import lru_cache

import psycopg
from psycopg import _encodings

from . import defaults
from .errors import ConfigError, translated

APPLICATION_NAME = "drainer"
# Python's strings hold any character: our connections speak UTF-8 whatever the
# server's encoding, which converts what it can hold and refuses the rest.
CLIENT_ENCODING = "UTF8"


def parse_url(url: str) -> dict[str, str | int | None]:
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
    connect_timeout: float | None = None,
    statement_timeout: timedelta | None = timedelta(seconds=30),
    prepare: bool = True,
) -> psycopg.Connection:
    """An autocommit connection: every statement commits at once, so no transaction
    is ever left open while a handler runs (the idle-in-transaction pitfall).

    Timeouts travel in the startup packet, costing no statement. `prepare=False` is
    for transaction-mode poolers (PgBouncer, RDS Proxy): no prepared statements, and
    no startup `options` of ours, which they refuse ("unsupported startup parameter"),
    so the statement timeout behind one is the role's (ALTER ROLE ... SET
    statement_timeout). libpq's PG* variables fill whatever the URL leaves out:
    `application_name` is only a fallback, and our options are merged with the user's.
    The client encoding is always UTF-8 (see CLIENT_ENCODING). `connect_timeout`
    caps the attempt's libpq `connect_timeout` (the URL's, else PGCONNECT_TIMEOUT,
    else ATTEMPT_TIMEOUT): what a drain's retries have left.
    """
    ours = ""
    if statement_timeout is not None and prepare:
        ours = f"-c statement_timeout={int(statement_timeout.total_seconds() * 1000)}"
    params = parse_url(url)
    with translated():
        conn = psycopg.connect(
            url,
            autocommit=True,
            fallback_application_name=application_name,
            client_encoding=CLIENT_ENCODING,
            connect_timeout=attempt_timeout(params, connect_timeout),
            options=merged_options(params, ours),
            prepare_threshold=0 if prepare else None,
        )
    return conn


def attempt_timeout(params: dict[str, str | int | None], cap: float | None) -> int:
    """Whole seconds for one attempt: libpq's own `connect_timeout` (the URL's, else
    PGCONNECT_TIMEOUT), else ATTEMPT_TIMEOUT; at most `cap`. At least 1 (libpq
    waits 2 s at the least, and 0 would wait forever)."""
    given = params.get("connect_timeout") or os.environ.get("PGCONNECT_TIMEOUT")
    try:
        seconds = float(given) if given else defaults.ATTEMPT_TIMEOUT
    except ValueError:
        raise ConfigError(f"connect_timeout={given!r} is not a number of seconds") from None
    if seconds <= 0:  # libpq's "wait forever": a resuming database could hold us there
        seconds = defaults.ATTEMPT_TIMEOUT
    return max(1, int(seconds if cap is None else min(seconds, cap)))


def merged_options(params: dict[str, str | int | None], ours: str) -> str | None:
    """The startup options: the URL's, else PGOPTIONS (libpq's own order), then ours.

    Any `options` given to libpq replaces PGOPTIONS, so a search_path set there
    would be lost (and `jobs` in another schema not found) unless merged here.
    None when there are none, so libpq sends no `options` at all.
    """
    theirs = params["options"] if "options" in params else os.environ.get("PGOPTIONS")
    return " ".join(filter(None, [str(theirs or "").strip(), ours])) or None


def storable(text: str, conn: psycopg.Connection) -> str:
    """`text` with each character the database cannot hold as a backslash escape
    (a LATIN1 database keeps an emoji as \\U0001f600).

    For text a handler chose, such as a failure's message: one character the server
    cannot convert would fail the statement that writes the whole batch's results.
    The connection's own encoding counts too (a user's connection may speak another).
    """
    for codec in codecs(conn):
        text = text.encode(codec, "backslashreplace").decode(codec)
    return text


def codecs(conn: psycopg.Connection) -> tuple[str, ...]:
    """The Python codecs text must encode to for the database to store it, through
    this connection: none when any text fits (a UTF-8 database, or SQL_ASCII spoken
    to in UTF-8)."""
    server = _codec(conn.info.parameter_status("server_encoding") or "SQL_ASCII")
    return tuple(dict.fromkeys(c for c in (server, conn.info.encoding) if c and c != "utf-8"))


def unfit(text: str, codecs: Sequence[str]) -> str | None:
    """Why the database cannot store `text` (`codecs`: see above), naming the first
    character its encoding lacks; None when it can. For text to check before a
    statement that carries other rows too: the server would refuse them all."""
    for codec in codecs:
        try:
            text.encode(codec)
        except UnicodeEncodeError as exc:
            char = text[exc.start]
            return (f"the database's encoding ({_encoding_name(codec)}) cannot hold the "
                    f"character {char!a} (U+{ord(char):04X})")
    return None


def _encoding_name(codec: str) -> str:
    """PostgreSQL's name of a Python codec (iso8859-1: LATIN1), for messages."""
    try:
        return _encodings.py2pgenc(codec).decode()
    except LookupError:
        return codec


@lru_cache(maxsize=16)
def _codec(server_encoding: str) -> str | None:
    """The Python codec of a server encoding; None when any text fits (UTF8, and
    SQL_ASCII, which stores bytes as they come); ASCII, which every server encoding
    holds, for one Python has no codec for."""
    if server_encoding in ("UTF8", "SQL_ASCII"):
        return None
    try:
        return _encodings.pg2pyenc(server_encoding.encode())
    except psycopg.NotSupportedError:
        return "ascii"
