"""The function's configuration, all from its environment (see infra/README.md).

The drain's settings are the command line's (`drainer.settings.Drain`: DRAINER_TASKS,
DRAINER_QUEUES, DRAINER_BATCH_SIZE, DRAINER_LEASE, DRAINER_CONCURRENCY,
DRAINER_ARCHIVE_AFTER, DRAINER_ARCHIVE_FAILED_AFTER, DRAINER_EVENT_LOOP,
DRAINER_VERBOSE), read the same way, as are DRAINER_CONNECT_TIMEOUT and the widening's
(DRAINER_MAX_WIDTH, DRAINER_POOL_SIZE, DRAINER_BUDGET_SHARE); the rest is the
function's own.
"""

from dataclasses import dataclass

from .. import cloud
from .. import settings as s
from ..run import Options
from .credentials import Credentials


@dataclass(frozen=True)
class Settings(cloud.FunctionSettings):
    credentials: Credentials
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

    @classmethod
    def from_env(cls) -> "Settings":
        """Every setting from the environment; ConfigError names a bad variable."""
        return cls(
            credentials=Credentials.from_env(),
            **cls.common_from_env(),
            schedule_group=s.SCHEDULE_GROUP.resolve(),
            scheduler_role_arn=s.SCHEDULER_ROLE_ARN.resolve(),
            namespace=s.METRICS_NAMESPACE.resolve(),
            max_width=s.MAX_WIDTH.resolve(),
            pool_size=s.POOL_SIZE.resolve(),
            budget_share=s.BUDGET_SHARE.resolve(),
        )

    def options(self, queues: list[str], deadline: float) -> Options:
        return self.drain.options(queues, deadline)
