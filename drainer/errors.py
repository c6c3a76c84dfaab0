"""The short hierarchy every driver error is translated into at the database boundary,
and how any exception is told: `describe` (the one bounded line kept as last_error)
and `trace` (--verbose).

Each message says what to do next and never contains a password; `exit_code` is
what the CLI returns for it (the README's exit codes).
"""

import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg


class DrainerError(Exception):
    """Base class: an error a user can cause and fix; shown as one line, no traceback."""

    exit_code = 1
    summary: dict[str, object] | None = None  # the summary JSON of the work done before it


class ConfigError(DrainerError):
    """A bad option, URL or task setup."""

    exit_code = 2


class BadInput(DrainerError):
    """A payload, queue name or value that cannot be stored; nothing was written."""

    exit_code = 2


class NoResult(DrainerError, LookupError):
    """`drainer.result` of a job that has no result: none such, not done yet (`status`
    says which), failed, or done by a task that does not keep results."""

    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.status = status


class DatabaseUnavailable(DrainerError):
    """The server cannot be reached, or went away mid-run."""

    exit_code = 3


class AuthenticationFailed(DrainerError):
    """The server refused the credentials."""

    exit_code = 3


class SchemaMissing(DrainerError):
    """The `jobs` table (or a column of it) is not there."""

    exit_code = 3


MIGRATE_HINT = ("run `drainer migrate` (in a Django project with drainer.contrib.django "
                "installed: `manage.py migrate`)")
NO_JOBS_TABLE = f"this database has no jobs table: {MIGRATE_HINT}"


class StatementCancelled(DrainerError):
    """The server cancelled a statement before it finished: its statement_timeout or
    lock_timeout ran out, or an administrator cancelled it (pg_cancel_backend).

    The server is up, so it is not DatabaseUnavailable (and no reconnect helps), but
    it is the same kind of failure: the database's state (busy, or a lock held by
    another session), not the user's input. Exit code 3; a later run may succeed.
    """

    exit_code = 3


class Conflict(DrainerError):
    """Another transaction's work conflicted with this one's: a deadlock, or a
    serialization failure in a REPEATABLE READ or SERIALIZABLE transaction. The server
    is up and undid the statement; running the transaction again can succeed. Exit
    code 1.

    Only drainer's own statements raise it: an enqueue raises the application driver's
    own error instead (`CONFLICTS`), which the application's retry loop knows."""


# The errors of a conflict between transactions (SQLSTATE 40001 and 40P01).
CONFLICTS = (pg.SerializationFailure, pg.DeadlockDetected)


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
        password = psycopg.conninfo.conninfo_to_dict(url).get("password")
        return str(password) if password else None
    except (psycopg.Error, UnicodeError):  # not a URL libpq can read: nothing to mask
        return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def translate(exc: psycopg.Error) -> DrainerError:
    """Map a psycopg error to the hierarchy, with a message that says what to do."""
    detail = redact(_first_line(exc))
    if isinstance(exc, pg.UndefinedTable | pg.UndefinedColumn | pg.UndefinedFunction):
        if 'relation "jobs" does not exist' in detail:
            return SchemaMissing(f"{NO_JOBS_TABLE} ({detail})")
        return SchemaMissing(f"the drainer schema is missing ({detail}); {MIGRATE_HINT}")
    if isinstance(exc, pg.InvalidPassword | pg.InvalidAuthorizationSpecification) or (
        "authentication failed" in detail or "no password supplied" in detail
    ):
        return AuthenticationFailed(
            f"authentication failed ({detail}); check the user and password of the database URL"
        )
    if isinstance(exc, pg.InsufficientPrivilege):
        return ConfigError(f"permission denied ({detail}); grant the role what the drain needs")
    if isinstance(exc, pg.ReadOnlySqlTransaction):  # also every write on a hot standby
        return ConfigError(
            f"the database is read-only ({detail}); point the drainer at a writable primary, "
            "and check default_transaction_read_only of its role and database")
    if isinstance(exc, pg.QueryCanceled | pg.LockNotAvailable):
        return StatementCancelled(
            f"a statement was cancelled ({detail}): a statement timeout, a lock timeout or an "
            "administrator's cancel; the database is busy or a lock is held, see `drainer doctor`")
    if isinstance(exc, CONFLICTS):  # an OperationalError, but the server is fine
        return Conflict(f"conflict with another transaction, try again ({detail})")
    if isinstance(exc, pg.UntranslatableCharacter):
        return BadInput(f"the database's encoding cannot hold a character of the value ({detail})")
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
def translated(*, keep: tuple[type[psycopg.Error], ...] = ()) -> Iterator[None]:
    """Run a block with psycopg errors translated into DrainerError, and a value the
    connection's encoding cannot carry (a user's LATIN1 connection) into BadInput;
    errors of the classes `keep` names are raised unchanged."""
    try:
        yield
    except keep:
        raise
    except psycopg.Error as exc:
        raise translate(exc) from exc
    except UnicodeEncodeError as exc:
        raise unencodable(exc) from exc


def unencodable(exc: UnicodeEncodeError) -> BadInput:
    """BadInput naming the first character psycopg could not encode for the server."""
    char = exc.object[exc.start:exc.start + 1] if isinstance(exc.object, str) else ""
    shown = f" {char!r} (U+{ord(char):04X})" if char else ""
    return BadInput(f"the database's encoding ({exc.encoding}, as the connection speaks it) "
                    f"cannot hold the character{shown}")


MAX_ERROR = 2000  # characters of last_error kept per failure
MAX_TRACEBACK = 20_000  # characters of a traceback shown by --verbose


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


def describe(exc: BaseException) -> str:
    """`Type: message`, bounded, storable in a text column (no NUL, valid UTF-8) and
    with URL passwords masked.

    It never raises: a handler's exception may have a `__str__` that fails, or a
    message with lone surrogates, and either would otherwise kill the handler thread
    or the statement that records the failure.
    """
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - whatever a broken __str__ raises
        message = "<the exception's message could not be read>"
    # Cut first (messages may be huge), with room left so a URL at the cut is still
    # seen whole by redact (a connection string in a handler's error, say).
    text = f"{type(exc).__name__}: {message}"[: 2 * MAX_ERROR]
    text = text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode()
    return _bounded(redact(text))


def trace(exc: BaseException) -> str:
    """The exception's traceback, for `--verbose` logs only: last_error keeps to
    `describe`'s one bounded line, so the table never holds frames or source lines.
    Printable, URL passwords masked and bounded as `describe` does; cut at its end,
    where a huge message would be, so the frames survive. The first frame, the one
    that caught it (drainer's own), is left out when the handler's frames follow."""
    frames = exc.__traceback__
    if frames is not None and frames.tb_next is not None:
        frames = frames.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, frames)).rstrip()
    except BaseException:  # noqa: BLE001 - never lose the failure for its traceback
        return describe(exc)
    text = text[: MAX_TRACEBACK + MAX_ERROR].replace("\x00", "\\0")
    text = redact(text.encode("utf-8", "backslashreplace").decode())
    return text if len(text) <= MAX_TRACEBACK else text[: MAX_TRACEBACK - 1] + "…"
