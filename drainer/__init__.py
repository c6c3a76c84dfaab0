"""drainer: background jobs out of a plain PostgreSQL table, drained by short-lived runs.

The library API: `task` registers handlers; `enqueue`/`enqueue_many` add jobs in the
caller's transaction; the lifecycle functions are the classic jobs-table statements.
"""

__version__ = "0.1.0"

from .errors import (
    AuthenticationFailed,
    BadInput,
    ConfigError,
    DatabaseUnavailable,
    DrainerError,
    SchemaMissing,
    StatementCancelled,
)
from .queue import (
    Job,
    archive,
    cancel,
    claim,
    complete,
    enqueue,
    enqueue_many,
    extend,
    fail,
    next_due,
    reap,
    release,
    requeue,
)
from .run import Options, Summary, drain
from .schema import migrate
from .tasks import task

__all__ = [
    "AuthenticationFailed", "BadInput", "ConfigError", "DatabaseUnavailable", "DrainerError",
    "Job", "Options", "SchemaMissing", "StatementCancelled", "Summary", "__version__",
    "archive", "cancel", "claim", "complete", "drain", "enqueue", "enqueue_many", "extend",
    "fail", "migrate", "next_due", "reap", "release", "requeue", "task",
]
