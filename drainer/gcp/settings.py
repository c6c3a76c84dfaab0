"""The function's configuration, all from its environment (see infra/gcp/README.md).

The drain's settings are the command line's (`drainer.settings.Drain`), read the
same way; the database's, the timeout and the wake-ups' are the function's own.
"""

from dataclasses import dataclass

from .. import cloud
from .. import settings as s
from ..errors import ConfigError
from ..run import Options
from .credentials import Credentials


@dataclass(frozen=True)
class Wakeups:
    """Where wake-ups go: a Cloud Tasks queue, the function's URL, and the service
    account whose OIDC token the tasks carry (the function's invoker)."""

    queue: str  # projects/P/locations/L/queues/Q
    url: str
    service_account: str


@dataclass(frozen=True)
class Settings(cloud.FunctionSettings):
    credentials: Credentials
    timeout: float = s.DEFAULT_FUNCTION_TIMEOUT  # seconds: the function's --timeout
    wakeups: Wakeups | None = None

    @classmethod
    def from_env(cls) -> "Settings":
        """Every setting from the environment; ConfigError names a bad variable."""
        return cls(
            credentials=Credentials.from_env(),
            **cls.common_from_env(),
            timeout=s.FUNCTION_TIMEOUT.resolve(),
            wakeups=_wakeups(),
        )

    def options(self, deadline: float) -> Options:
        return self.drain.options(self.drain.queues, deadline)


def _wakeups() -> Wakeups | None:
    """All three variables, or none (no wake-ups: the backstop runs what is due)."""
    given = {setting.env: setting.resolve()
             for setting in (s.TASKS_QUEUE, s.WAKE_URL, s.TASKS_SERVICE_ACCOUNT)}
    if not any(given.values()):
        return None
    missing = [name for name, value in given.items() if not value]
    if missing:
        raise ConfigError(f"wake-ups need {', '.join(given)}; {', '.join(missing)} "
                          "missing")
    queue, url, account = given.values()
    assert queue and url and account  # none missing
    if not queue.startswith("projects/") or "/queues/" not in queue:
        raise ConfigError(f"DRAINER_TASKS_QUEUE={queue!r}: expected "
                          "projects/PROJECT/locations/REGION/queues/NAME")
    return Wakeups(queue, url, account)
