"""The short hierarchy every driver error is translated into at the database boundary.

Each message says what to do next and never contains a password; `exit_code` is
what the CLI returns for it (see CONTRACT.md).
"""

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg


class DrainerError(Exception):
    """Base class: an error a user can cause and fix; shown as one line, no traceback."""

    exit_code = 1


class ConfigError(DrainerError):
    """A bad option, URL or task setup."""

    exit_code = 2


class BadInput(DrainerError):
    """A payload, queue name or value that cannot be stored; nothing was written."""

    exit_code = 2


class DatabaseUnavailable(DrainerError):
    """The server cannot be reached, or went away mid-run."""

    exit_code = 3


class AuthenticationFailed(DrainerError):
    """The server refused the credentials."""

    exit_code = 3


class SchemaMissing(DrainerError):
    """The `jobs` table (or a column of it) is not there."""

    exit_code = 3


_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_PASSWORD_KV = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


# libpq's own checks of connection options, made before it tries to connect.
_BAD_OPTION = re.compile(
    r"invalid (\w+ value|port number|integer value)|could not parse network address")


def redact(text: str, *secrets: str | None) -> str:
    """`text` with URL passwords, `password=` pairs and the given secrets masked."""
    text = _PASSWORD_IN_URL.sub(r"\1***@", text)
    text = _PASSWORD_KV.sub(r"\1***", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def password_of(url: str | None) -> str | None:
    """The password a URL carries, so messages can mask it wherever it appears."""
    if not url:
        return None
    try:
        return psycopg.conninfo.conninfo_to_dict(url).get("password") or None
    except (psycopg.Error, UnicodeError):  # not a URL libpq can read: nothing to mask
        return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def translate(exc: psycopg.Error) -> DrainerError:
    """Map a psycopg error to the hierarchy, with a message that says what to do."""
    detail = redact(_first_line(exc))
    if isinstance(exc, pg.UndefinedTable | pg.UndefinedColumn | pg.UndefinedFunction):
        return SchemaMissing(f"the drainer schema is missing ({detail}); run `drainer migrate`")
    if isinstance(exc, pg.InvalidPassword | pg.InvalidAuthorizationSpecification) or (
        "authentication failed" in detail or "no password supplied" in detail
    ):
        return AuthenticationFailed(
            f"authentication failed ({detail}); check the user and password of the database URL"
        )
    if isinstance(exc, pg.InsufficientPrivilege):
        return ConfigError(f"permission denied ({detail}); grant the role what the drain needs")
    if isinstance(exc, pg.DataError | pg.IntegrityError | pg.ProgramLimitExceeded):
        return BadInput(f"the database refused the value: {detail}")
    if isinstance(exc, psycopg.OperationalError) and _BAD_OPTION.search(detail):
        return ConfigError(f"the database URL is not valid ({detail})")
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return DatabaseUnavailable(
            f"database unavailable ({detail}); check the URL and that the server is running"
        )
    return DrainerError(f"database error: {detail}")


@contextmanager
def translated() -> Iterator[None]:
    """Run a block with psycopg errors translated into DrainerError."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc
