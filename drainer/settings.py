"""Every setting drainer reads, in one place: its option, its `DRAINER_*` variable,
how its text is parsed and checked, and its default.

The command line and the cloud function resolve them the same way: the command
line's value, else the variable, else the default, each parsed and checked once,
for the command being run only (a bad variable breaks only what reads it).
`Drain` is the drain's settings, typed, and the one mapping to `run.Options`.
"""

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from . import defaults
from .clock import loop_kind
from .errors import ConfigError
from .run import MAX_INT, Options

T = TypeVar("T")

# Durations beyond a century are typos, and would overflow timedelta or timestamptz.
MAX_DAYS = 36_525
MAX_SECONDS = MAX_DAYS * 86_400
# The shortest durations that make sense, in seconds; below them a value is a typo,
# or makes the drain busy with itself.
MIN_LEASE = 1.0  # a handler's heartbeat runs every lease/3: an UPDATE each time
MIN_MAX_RUNTIME = 1.0  # the process's start and first connection take most of a second
MIN_POLL_INTERVAL = 1.0  # each poll is a query, and keeps a compute awake
MIN_MAX_READY_AGE = 1.0  # ready ages are reported in whole seconds

# The defaults (drainer/defaults.py) in the units the options take.
DEFAULT_LEASE = defaults.LEASE.total_seconds()
DEFAULT_ARCHIVE_AFTER = defaults.ARCHIVE_AFTER.total_seconds() / 86_400
DEFAULT_ARCHIVE_FAILED_AFTER = defaults.ARCHIVE_FAILED_AFTER.total_seconds() / 86_400
DEFAULT_POLL = defaults.POLL
DEFAULT_MAX_READY_AGE = defaults.MAX_READY_AGE
DEFAULT_STATEMENT_TIMEOUT = defaults.STATEMENT_TIMEOUT
DEFAULT_SECRET_TTL = defaults.SECRET_TTL
DEFAULT_MAX_DEPTH = defaults.MAX_DEPTH
DEFAULT_CONNECT_TIMEOUT = defaults.CONNECT_TIMEOUT
DEFAULT_HTTP_WINDOW = defaults.HTTP_WINDOW
DEFAULT_HTTP_MAX_RUNTIME = defaults.HTTP_MAX_RUNTIME
DEFAULT_FUNCTION_TIMEOUT = 60.0  # seconds: a Cloud Run function's own default timeout
BATCH_ALLOWANCE = 5.0  # seconds a batch may overrun the handler-time estimate
INVOKE_ALLOWANCE = 5.0  # seconds for the continuation call or the schedule (client timeouts)


def env_name(option: str) -> str:
    """`--batch-size` -> `DRAINER_BATCH_SIZE`."""
    return "DRAINER_" + option.lstrip("-").replace("-", "_").upper()


def _number(text: str, kind: Callable[[str], T], what: str) -> T:
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


def count(text: str) -> int:
    """A whole number, 0 or more."""
    if not text.strip().isdigit():
        raise ValueError(f"{text!r} must be a whole number, 0 or more")
    return int(text)


def seconds_from(minimum: float, *, above: bool = False) -> Callable[[str], float]:
    """A parser of a duration of at least `minimum` seconds (more than it, if
    `above`), and at most a century."""

    def parse(text: str) -> float:
        value = _number(text, float, "a number of seconds")
        if not (minimum < value if above else minimum <= value) or not value <= MAX_SECONDS:
            least = (f" above {minimum:g}" if above
                     else ", 0 or more" if minimum == 0 else f", at least {minimum:g}")
            raise ValueError(f"{text!r} must be a number of seconds{least} "
                             "(at most a century)")
        return value

    return parse


lease_seconds = seconds_from(MIN_LEASE)
max_runtime_seconds = seconds_from(MIN_MAX_RUNTIME)
poll_seconds = seconds_from(MIN_POLL_INTERVAL)
max_ready_age_seconds = seconds_from(MIN_MAX_READY_AGE)
nonnegative_seconds = seconds_from(0)
positive_seconds = seconds_from(0, above=True)


def processes(text: str) -> int:
    """--processes: a whole number from 1, or auto (the CPUs this process may use)."""
    if text.strip() == "auto":
        return cpus()
    return positive_int(text)


def cpus() -> int:
    """The CPUs this process may run on (its affinity, where the OS has one)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def nonnegative_days(text: str) -> float:
    value = _number(text, float, "a number of days")
    if not 0 <= value <= MAX_DAYS:
        raise ValueError(f"{text!r} must be a number of days, 0 or more (at most a century)")
    return value


def port_number(text: str) -> int:
    number = _number(text, int, "a port number")
    if not 0 <= number <= 65535:
        raise ValueError(f"{text!r} is not a port number (0 to 65535)")
    return number


def names(text: str) -> list[str]:
    """A comma-separated list, blanks dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 1/0, true/false, yes/no or on/off")


def text(value: str) -> str:
    return value


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: `--name` on the command line of the commands that offer it,
    DRAINER_NAME in the environment, parsed by `parse`, else `default`."""

    name: str
    parse: Callable[[str], T]
    default: T
    help: str = ""  # for --help; the function-only settings are documented in infra/
    metavar: str | None = None
    alias: str | None = None  # a shorter option that means the same on the command line

    @property
    def option(self) -> str:
        return f"--{self.name}"

    @property
    def env(self) -> str:
        return env_name(self.name)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def resolve(self, given: T | None = None, environ: Mapping[str, str] = os.environ) -> T:
        """The command line's value if given, else the variable's, else the default;
        ConfigError naming the variable when its value is refused."""
        if given is not None:
            return given
        raw = environ.get(self.env)
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{self.env}={raw!r}: {exc}") from exc


# The database.
DATABASE_URL = Setting[str | None](
    "database-url", text, None, "postgresql:// URL (else DATABASE_URL)", "URL")
NO_PREPARE = Setting(
    "no-prepare", flag, False,
    "for transaction-mode poolers (PgBouncer, RDS Proxy): no prepared statements and no "
    "startup options, which they refuse; the statement timeout is then the role's "
    "(ALTER ROLE ... SET statement_timeout)")
CONNECT_TIMEOUT = Setting(
    "connect-timeout", nonnegative_seconds, DEFAULT_CONNECT_TIMEOUT,
    "seconds a drain keeps trying to reach the database, across attempts, before it exits "
    "3: a database that scales to zero refuses or holds connections while it resumes "
    "(each attempt's own limit is libpq's connect_timeout; --max-runtime, when sooner, "
    f"wins; 0: one attempt; default {DEFAULT_CONNECT_TIMEOUT:g})", "SECONDS")

# A drain.
TASKS = Setting[list[str]](
    "tasks", names, [], "comma-separated modules that define @task handlers", "MODULES")
QUEUES = Setting[list[str]]("queues", names, [])  # the command line's is --queue Q, repeated
BATCH_SIZE = Setting[int | None](
    "batch-size", positive_int, None,
    "jobs per claim, pinned (default: adaptive, from one round of --concurrency "
    "handlers, 10 at least, up to 500 or two rounds)", "N")
LEASE = Setting(
    "lease", lease_seconds, DEFAULT_LEASE,
    "seconds a claim holds a job before a reaper may take it back; extended while a "
    f"handler runs (at least {MIN_LEASE:g}, default {DEFAULT_LEASE:g})", "SECONDS")
MAX_RUNTIME = Setting[float | None](
    "max-runtime", max_runtime_seconds, None,
    "stop claiming so the run ends within this many seconds of the process's start (as "
    "the OS counts it: the interpreter's start and the imports included); unstarted "
    f"claims are given back (at least {MIN_MAX_RUNTIME:g}, default: none)", "SECONDS")
CONCURRENCY = Setting(
    "concurrency", positive_int, 1,
    "handlers this process runs at once at most, for I/O-bound jobs (default 1; sync "
    "ones on threads, fewer when they end within microseconds; async ones on one "
    "event loop); "
    "per process, unlike a task's concurrency=, which holds across every drainer", "N")
PROCESSES = Setting(
    "processes", processes, 1,
    "run the command as this many processes at once, each with its own session and "
    "--concurrency handlers, their summaries added up into one; auto: one per CPU, for "
    "CPU-bound handlers (default 1)", "N|auto")
ARCHIVE_AFTER = Setting(
    "archive-after", nonnegative_days, DEFAULT_ARCHIVE_AFTER,
    "days after which done jobs leave the jobs table, counted from their creation "
    f"(default {DEFAULT_ARCHIVE_AFTER:g})", "DAYS")
ARCHIVE_FAILED_AFTER = Setting(
    "archive-failed-after", nonnegative_days, DEFAULT_ARCHIVE_FAILED_AFTER,
    "days after which failed jobs, cancelled ones too, leave the jobs table, counted from "
    "when they failed (their run_at, set then); until then "
    f"`requeue` can run them again (default {DEFAULT_ARCHIVE_FAILED_AFTER:g})", "DAYS")
EVENT_LOOP = Setting(
    "event-loop", loop_kind, "auto",
    "the event loop async handlers run on: uvloop (faster: install drainer[uvloop]), "
    "asyncio (the standard library's), or auto, uvloop when it is installed (the "
    "default)", "KIND")
VERBOSE = Setting(
    "verbose", flag, False,
    "under each failed attempt's log line, the handler's traceback (passwords in URLs "
    "masked; never stored: last_error keeps `Type: message`)")

# Widening: more drains at once while a backlog lasts.
def share(text: str) -> float:
    """A fraction above 0, at most 1."""
    value = _number(text, float, "a fraction")
    if not 0 < value <= 1:
        raise ValueError(f"{text!r} must be a fraction above 0 and at most 1")
    return value


MAX_WIDTH = Setting(
    "max-width", positive_int, defaults.MAX_WIDTH,
    "the most drains of these queues at once while a backlog lasts, each with its own "
    f"session (default {defaults.MAX_WIDTH}; 1: never widen)", "N")
BUDGET_SHARE = Setting(
    "budget-share", share, defaults.BUDGET_SHARE,
    "the part of the database's sessions a fleet of drains may hold: of those its "
    "drains hold and those the server, the role and the database still take (behind a "
    "pooler, of the pool); the rest stays for the application (default "
    f"{defaults.BUDGET_SHARE:g})",
    "FRACTION")
POOL_SIZE = Setting[int | None](
    "pool-size", positive_int, None,
    "behind a pooler (PgBouncer, RDS Proxy), its pool's size: the sessions a fleet of "
    "drains shares with the application, instead of the server's connection limits "
    "(default: none, the server's limits are read)", "N")

# `work`, always on.
LISTEN_URL = Setting[str | None](
    "listen-url", text, None,
    "direct postgresql:// URL for LISTEN, never a transaction pooler, which hands the "
    "session to others (default: the database URL; claims may still go through a pooled "
    "--database-url)", "URL")
POLL_INTERVAL = Setting(
    "poll-interval", poll_seconds, DEFAULT_POLL,
    "seconds between fallback polls, which find work whose notification was missed (a "
    f"reconnect, a table without the trigger) (at least {MIN_POLL_INTERVAL:g}, default "
    f"{DEFAULT_POLL:g}). Every poll is activity: on a scale-to-zero compute an interval "
    "under the database's suspend timeout (often 5 to 10 minutes) keeps the compute awake "
    "around the clock, even with an empty queue; there, prefer `drain` on a schedule",
    "SECONDS")

# `doctor`.
MAX_READY_AGE = Setting(
    "max-ready-age", max_ready_age_seconds, DEFAULT_MAX_READY_AGE,
    "seconds a ready job may wait before it is a problem; set it above the time between "
    f"scheduled drains (at least {MIN_MAX_READY_AGE:g}, default {DEFAULT_MAX_READY_AGE:g})",
    "SECONDS")

# `ui`, the dashboard.
HOST = Setting(
    "host", text, "127.0.0.1",
    "the address the dashboard listens on (default 127.0.0.1: this machine only; any "
    "other lets the network reach it, behind its token)", "ADDRESS")
PORT = Setting("port", port_number, 8765, "the dashboard's port (default 8765; 0: a free one)",
               "N")
READ_ONLY = Setting(
    "read-only", flag, False,
    "show and accept no action (requeue, cancel): for a role that may only SELECT")

# `resume` and `ui`: the drainer function a resume starts, on AWS Lambda.
KICK_FUNCTION = Setting[str | None](
    "kick-function", text, None,
    "the drainer Lambda function (name or ARN) to invoke once a resume has committed, as "
    "a producer's kick does, so that the resumed queue drains now rather than at the "
    "backstop; a failed invoke is logged, the resume stands (the aws extra; default: none)",
    "FUNCTION", alias="--kick")

# The cloud function only, from its environment (infra/README.md says what each does).
STATEMENT_TIMEOUT = Setting("statement-timeout", positive_seconds, DEFAULT_STATEMENT_TIMEOUT)
SAFETY_MARGIN = Setting[float | None]("safety-margin", nonnegative_seconds, None)
MAX_DEPTH = Setting("max-depth", count, DEFAULT_MAX_DEPTH)
SCHEDULE_GROUP = Setting[str | None]("schedule-group", text, None)
SCHEDULER_ROLE_ARN = Setting[str | None]("scheduler-role-arn", text, None)
METRICS_NAMESPACE = Setting("metrics-namespace", text, "drainer")
DATABASE_SECRET_ARN = Setting[str | None]("database-secret-arn", text, None)
DATABASE_IAM_AUTH = Setting("database-iam-auth", flag, False)
SECRET_TTL = Setting("secret-ttl", nonnegative_seconds, DEFAULT_SECRET_TTL)
# Google Cloud's function only (infra/gcp/README.md).
FUNCTION_TIMEOUT = Setting("function-timeout", positive_seconds, DEFAULT_FUNCTION_TIMEOUT)
DATABASE_SECRET = Setting[str | None]("database-secret", text, None)
TASKS_QUEUE = Setting[str | None]("tasks-queue", text, None)
WAKE_URL = Setting[str | None]("wake-url", text, None)
TASKS_SERVICE_ACCOUNT = Setting[str | None]("tasks-service-account", text, None)

# The HTTP entry point only, from its environment (drainer.http; README "Any platform
# that can call a URL"). With neither a secret nor a token it refuses every request.
HTTP_SECRET = Setting[str | None]("http-secret", text, None)
HTTP_TOKEN = Setting[str | None]("http-token", text, None)
HTTP_WINDOW = Setting("http-window", positive_seconds, DEFAULT_HTTP_WINDOW)
HTTP_MAX_RUNTIME = Setting("http-max-runtime", max_runtime_seconds, DEFAULT_HTTP_MAX_RUNTIME)


@dataclass(frozen=True)
class Drain:
    """A drain's settings, however it was started."""

    tasks: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    batch_size: int | None = None
    lease: float = DEFAULT_LEASE  # seconds
    concurrency: int = 1
    archive_after: float = DEFAULT_ARCHIVE_AFTER  # days
    archive_failed_after: float = DEFAULT_ARCHIVE_FAILED_AFTER  # days
    event_loop: str = "auto"
    verbose: bool = False

    @classmethod
    def resolve(cls, given: Mapping[str, Any] | None = None) -> "Drain":
        """Each field from `given` (the command line's values, None where absent),
        else its variable, else its default."""
        given = given or {}
        return cls(
            tasks=TASKS.resolve(given.get("tasks")),
            queues=QUEUES.resolve(given.get("queues")),
            batch_size=BATCH_SIZE.resolve(given.get("batch_size")),
            lease=LEASE.resolve(given.get("lease")),
            concurrency=CONCURRENCY.resolve(given.get("concurrency")),
            archive_after=ARCHIVE_AFTER.resolve(given.get("archive_after")),
            archive_failed_after=ARCHIVE_FAILED_AFTER.resolve(given.get("archive_failed_after")),
            event_loop=EVENT_LOOP.resolve(given.get("event_loop")),
            verbose=VERBOSE.resolve(given.get("verbose")))

    def options(self, queues: list[str], deadline: float | None) -> Options:
        """The drain loop's options, for `queues` and a deadline on `clock.monotonic`."""
        return Options(queues=queues, batch_size=self.batch_size,
                       lease=timedelta(seconds=self.lease), concurrency=self.concurrency,
                       archive_after=timedelta(days=self.archive_after),
                       archive_failed_after=timedelta(days=self.archive_failed_after),
                       deadline=deadline, event_loop=self.event_loop, verbose=self.verbose)
