"""Where settings come from: the command line, else `DRAINER_*` variables, else defaults.

Also resolves the database URL (flag, `DRAINER_DATABASE_URL`, `DATABASE_URL`, libpq's
`PG*` variables, and outside a cloud function the embedded server).
"""

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ConfigError

CLOUD_MARKERS = ("AWS_LAMBDA_FUNCTION_NAME", "K_SERVICE", "CLOUD_RUN_JOB", "FUNCTION_TARGET")
LIBPQ_MARKERS = ("PGHOST", "PGSERVICE", "PGDATABASE")
EMBEDDED_DIR = ".drainer"


def env_name(option: str) -> str:
    """`--batch-size` -> `DRAINER_BATCH_SIZE`."""
    return "DRAINER_" + option.lstrip("-").replace("-", "_").upper()


def in_cloud_function() -> bool:
    return any(os.environ.get(name) for name in CLOUD_MARKERS)


MAX_INT = 2**63 - 1  # PostgreSQL's bigint: job ids, LIMIT


def _number(text: str, kind: type, what: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{text!r} is not {what}") from None


def positive_int(text: str) -> int:
    value = _number(text, int, "a whole number")
    if value < 1:
        raise ValueError(f"{value} is too small: it must be at least 1")
    if value > MAX_INT:
        raise ValueError(f"{value} is too large: it must be at most {MAX_INT}")
    return value


# Durations beyond a century are typos, and would overflow timedelta or timestamptz.
MAX_DAYS = 36_525
MAX_SECONDS = MAX_DAYS * 86_400


def positive_seconds(text: str) -> float:
    value = _number(text, float, "a number of seconds")
    if not 0 < value <= MAX_SECONDS:
        raise ValueError(f"{text!r} must be a number of seconds above 0 (at most a century)")
    return value


# The shortest durations that make sense, in seconds; below them a value is a typo,
# or makes the drain busy with itself.
MIN_LEASE = 1.0  # a handler's heartbeat runs every lease/3: an UPDATE each time
MIN_MAX_RUNTIME = 1.0  # the process's start and first connection take most of a second
MIN_POLL_INTERVAL = 1.0  # each poll is a query, and keeps a compute awake
MIN_MAX_READY_AGE = 1.0  # ready ages are reported in whole seconds


def seconds_from(minimum: float) -> Callable[[str], float]:
    """A parser of a duration of at least `minimum` seconds (and at most a century)."""

    def parse(text: str) -> float:
        value = _number(text, float, "a number of seconds")
        if not minimum <= value <= MAX_SECONDS:
            raise ValueError(f"{text!r} must be a number of seconds, at least {minimum:g} "
                             "(at most a century)")
        return value

    return parse


lease_seconds = seconds_from(MIN_LEASE)
max_runtime_seconds = seconds_from(MIN_MAX_RUNTIME)
poll_seconds = seconds_from(MIN_POLL_INTERVAL)
max_ready_age_seconds = seconds_from(MIN_MAX_READY_AGE)


def nonnegative_seconds(text: str) -> float:
    value = _number(text, float, "a number of seconds")
    if not 0 <= value <= MAX_SECONDS:
        raise ValueError(f"{text!r} must be a number of seconds, 0 or more (at most a century)")
    return value


def nonnegative_days(text: str) -> float:
    value = _number(text, float, "a number of days")
    if not 0 <= value <= MAX_DAYS:
        raise ValueError(f"{text!r} must be a number of days, 0 or more (at most a century)")
    return value


def names(text: str) -> list[str]:
    """A comma-separated list, blanks dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 1/0, true/false, yes/no or on/off")


def from_env(name: str, kind: Callable, fallback: object) -> object:
    """The variable `name` parsed by `kind`, `fallback` when unset or empty;
    ConfigError naming the variable when `kind` refuses it."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return fallback
    try:
        return kind(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r}: {exc}") from exc


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
    print(f"drainer: no database URL given; using the embedded PostgreSQL in ./{EMBEDDED_DIR}/",
          file=sys.stderr)
    return embedded.use()
