"""drainer: background jobs out of a plain PostgreSQL table, drained by short-lived runs.

The library API: `task` registers handlers (with their retry policy: `Exponential`,
`Constant`; a handler may raise `Retry` or `Snooze`); `enqueue`/`enqueue_many` add jobs
in the caller's transaction, on its own connection (psycopg 3 or 2, SQLAlchemy, Django;
`enqueue_async`/`enqueue_many_async` on asyncio's); `result` reads a kept return value;
`on_failure`/`on_dead` register alerting hooks (`drainer.hooks`); the lifecycle
functions are the classic jobs-table statements.
"""

__version__ = "0.2.0"

from .errors import (
    AuthenticationFailed,
    BadInput,
    ConfigError,
    Conflict,
    DatabaseUnavailable,
    DrainerError,
    NoResult,
    SchemaMissing,
    StatementCancelled,
)
from .hooks import on_dead, on_failure
from .model import Job
from .retry import Constant, Exponential, Retry, Snooze
from .run import Options, Summary, drain
from .schedules import schedule
from .storage.admin import archive, cancel, next_due, reap, requeue, result
from .storage.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from .storage.roundtrip import claim
from .storage.schema import migrate
from .storage.writeback import complete, extend, fail, release
from .tasks import Task, task

__all__ = [
    "AuthenticationFailed", "BadInput", "ConfigError", "Conflict", "Constant",
    "DatabaseUnavailable", "DrainerError", "Exponential", "Job", "NoResult", "Options", "Retry",
    "SchemaMissing", "Snooze", "StatementCancelled", "Summary", "Task", "__version__", "archive",
    "cancel", "claim", "complete", "drain", "enqueue", "enqueue_async", "enqueue_many",
    "enqueue_many_async", "extend", "fail", "migrate", "next_due", "on_dead", "on_failure",
    "reap", "release", "requeue", "result", "schedule", "task",
]
