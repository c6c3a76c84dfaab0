"""The function's configuration, all from its environment (see infra/README.md).

The drain's settings are the command line's (`drainer.settings.Drain`: DRAINER_TASKS,
DRAINER_QUEUES, DRAINER_BATCH_SIZE, DRAINER_LEASE, DRAINER_CONCURRENCY,
DRAINER_ARCHIVE_AFTER, DRAINER_ARCHIVE_FAILED_AFTER, DRAINER_EVENT_LOOP,
DRAINER_VERBOSE), read the same way, as are DRAINER_CONNECT_TIMEOUT and the widening's
(DRAINER_MAX_WIDTH, DRAINER_POOL_SIZE, DRAINER_BUDGET_SHARE); the rest is the
function's own.
"""

from dataclasses import dataclass, field
from datetime import timedelta

from .. import settings as s
from ..run import Options
from .credentials import Credentials


@dataclass(frozen=True)
class Settings:
    credentials: Credentials
    drain: s.Drain = field(default_factory=s.Drain)
    prepare: bool = True
    connect_timeout: float = s.DEFAULT_CONNECT_TIMEOUT  # seconds, across attempts
    statement_timeout: timedelta = timedelta(seconds=s.DEFAULT_STATEMENT_TIMEOUT)
    margin: float = s.DEFAULT_STATEMENT_TIMEOUT + s.BATCH_ALLOWANCE + s.INVOKE_ALLOWANCE
    max_depth: int = s.DEFAULT_MAX_DEPTH
    schedule_group: str | None = None
    scheduler_role_arn: str | None = None
    namespace: str = "drainer"
    max_width: int = s.MAX_WIDTH.default
    pool_size: int | None = None
    budget_share: float = s.BUDGET_SHARE.default

    @property
    def scheduler(self) -> tuple[str, str] | None:
        """The schedule group and Scheduler's role, when wake-ups can be armed."""
        if self.schedule_group and self.scheduler_role_arn:
            return self.schedule_group, self.scheduler_role_arn
        return None

    @property
    def tasks(self) -> list[str]:
        return self.drain.tasks

    @property
    def queues(self) -> list[str]:
        return self.drain.queues

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.drain.lease)

    @classmethod
    def from_env(cls) -> "Settings":
        """Every setting from the environment; ConfigError names a bad variable."""
        timeout = s.STATEMENT_TIMEOUT.resolve()
        margin = s.SAFETY_MARGIN.resolve()
        return cls(
            credentials=Credentials.from_env(),
            drain=s.Drain.resolve(),
            prepare=not s.NO_PREPARE.resolve(),
            connect_timeout=s.CONNECT_TIMEOUT.resolve(),
            statement_timeout=timedelta(seconds=timeout),
            # The deadline keeps back one statement timeout (the last writes and
            # next_due), a batch's overrun, and the continuation or schedule call.
            margin=timeout + s.BATCH_ALLOWANCE + s.INVOKE_ALLOWANCE if margin is None else margin,
            max_depth=s.MAX_DEPTH.resolve(),
            schedule_group=s.SCHEDULE_GROUP.resolve(),
            scheduler_role_arn=s.SCHEDULER_ROLE_ARN.resolve(),
            namespace=s.METRICS_NAMESPACE.resolve(),
            max_width=s.MAX_WIDTH.resolve(),
            pool_size=s.POOL_SIZE.resolve(),
            budget_share=s.BUDGET_SHARE.resolve(),
        )

    def options(self, queues: list[str], deadline: float) -> Options:
        return self.drain.options(queues, deadline)
