"""The function's configuration, all from its environment (see infra/README.md).

The drain options read the same `DRAINER_*` variables as the command line
(`DRAINER_TASKS`, `DRAINER_QUEUES`, `DRAINER_BATCH_SIZE`, `DRAINER_LEASE`,
`DRAINER_CONCURRENCY`, `DRAINER_ARCHIVE_AFTER`, `DRAINER_NO_PREPARE`).
"""

import os
from dataclasses import dataclass
from datetime import timedelta

from ..config import (
    flag,
    from_env,
    lease_seconds,
    names,
    nonnegative_days,
    nonnegative_seconds,
    positive_int,
    positive_seconds,
)
from ..run import DEFAULT_ARCHIVE_AFTER, DEFAULT_LEASE, Options
from .credentials import Credentials

DEFAULT_STATEMENT_TIMEOUT = 10.0  # seconds
BATCH_ALLOWANCE = 5.0  # seconds a batch may overrun the handler-time estimate
INVOKE_ALLOWANCE = 5.0  # seconds for the continuation call or the schedule (client timeouts)
DEFAULT_MAX_DEPTH = 10


def _depth(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"{text!r} must be a whole number, 0 or more")
    return int(text)


@dataclass(frozen=True)
class Settings:
    credentials: Credentials
    tasks: list[str]
    queues: list[str]
    batch_size: int | None = None
    lease: timedelta = DEFAULT_LEASE
    concurrency: int = 1
    archive_after: timedelta = DEFAULT_ARCHIVE_AFTER
    prepare: bool = True
    statement_timeout: timedelta = timedelta(seconds=DEFAULT_STATEMENT_TIMEOUT)
    margin: float = DEFAULT_STATEMENT_TIMEOUT + BATCH_ALLOWANCE + INVOKE_ALLOWANCE
    max_depth: int = DEFAULT_MAX_DEPTH
    schedule_group: str | None = None
    scheduler_role_arn: str | None = None
    namespace: str = "drainer"

    @property
    def wakes(self) -> bool:
        """Whether wake-ups can be armed (a schedule group and a role for Scheduler)."""
        return bool(self.schedule_group and self.scheduler_role_arn)

    @classmethod
    def from_env(cls) -> "Settings":
        """Every setting from the environment; ConfigError names a bad variable."""
        timeout = from_env("DRAINER_STATEMENT_TIMEOUT", positive_seconds,
                           DEFAULT_STATEMENT_TIMEOUT)
        return cls(
            credentials=Credentials.from_env(),
            tasks=from_env("DRAINER_TASKS", names, []),
            queues=from_env("DRAINER_QUEUES", names, []),
            batch_size=from_env("DRAINER_BATCH_SIZE", positive_int, None),
            lease=timedelta(seconds=from_env("DRAINER_LEASE", lease_seconds,
                                             DEFAULT_LEASE.total_seconds())),
            concurrency=from_env("DRAINER_CONCURRENCY", positive_int, 1),
            archive_after=timedelta(days=from_env("DRAINER_ARCHIVE_AFTER", nonnegative_days,
                                                  DEFAULT_ARCHIVE_AFTER.days)),
            prepare=not from_env("DRAINER_NO_PREPARE", flag, False),
            statement_timeout=timedelta(seconds=timeout),
            # The deadline keeps back one statement timeout (the last writes and
            # next_due), a batch's overrun, and the continuation or schedule call.
            margin=from_env("DRAINER_SAFETY_MARGIN", nonnegative_seconds,
                            timeout + BATCH_ALLOWANCE + INVOKE_ALLOWANCE),
            max_depth=from_env("DRAINER_MAX_DEPTH", _depth, DEFAULT_MAX_DEPTH),
            schedule_group=os.environ.get("DRAINER_SCHEDULE_GROUP") or None,
            scheduler_role_arn=os.environ.get("DRAINER_SCHEDULER_ROLE_ARN") or None,
            namespace=os.environ.get("DRAINER_METRICS_NAMESPACE") or "drainer",
        )

    def options(self, queues: list[str], deadline: float) -> Options:
        return Options(queues=queues, batch_size=self.batch_size, lease=self.lease,
                       concurrency=self.concurrency, archive_after=self.archive_after,
                       deadline=deadline)

