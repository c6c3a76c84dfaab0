"""One drain for one authenticated request: its settings from the environment, the
replay check, the drain within the request's deadline, and the same wake-up decision
as the Lambda function's (`drainer.wake.after_run`), as the answer for the caller's
scheduler: `continue` (call again now), `wait` or `wake` (call again at `at`), `none`.
"""

from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

import psycopg

from .. import clock, config
from .. import settings as s
from ..db import connect
from ..engine.session import first_session
from ..errors import ConfigError
from ..run import drain
from ..storage import signatures
from ..tasks import select
from ..wake import after_run
from .auth import Keys, Refused


def keys_from_env() -> Keys:
    """The secret, the token and the timestamp window; ConfigError names a bad one."""
    return Keys(secret=s.HTTP_SECRET.resolve(), token=s.HTTP_TOKEN.resolve(),
                window=s.HTTP_WINDOW.resolve())


@dataclass(frozen=True)
class Settings:
    """What a request's drain reads from the environment: the drain's own settings
    (DRAINER_TASKS, ...), the database's, and the cap on its runtime."""

    url: str
    drain: s.Drain = field(default_factory=s.Drain)
    prepare: bool = True
    statement_timeout: float = s.DEFAULT_STATEMENT_TIMEOUT
    connect_timeout: float = s.DEFAULT_CONNECT_TIMEOUT
    max_runtime: float = s.DEFAULT_HTTP_MAX_RUNTIME

    @classmethod
    def from_env(cls) -> "Settings":
        url = config.database_url(None)
        if url is None:
            raise ConfigError("no database URL: set DATABASE_URL (or DRAINER_DATABASE_URL) "
                              "in the service's environment")
        return cls(url=url, drain=s.Drain.resolve(), prepare=not s.NO_PREPARE.resolve(),
                   statement_timeout=s.STATEMENT_TIMEOUT.resolve(),
                   connect_timeout=s.CONNECT_TIMEOUT.resolve(),
                   max_runtime=s.HTTP_MAX_RUNTIME.resolve())

    def connect(self, within: float | None = None) -> psycopg.Connection:
        return connect(self.url, prepare=self.prepare, connect_timeout=within,
                       statement_timeout=timedelta(seconds=self.statement_timeout))


def drain_once(settings: Settings, signature: str | None, window: float,
               runtime: float) -> dict[str, object]:
    """Drain for at most `runtime` seconds; first remember the request's `signature`
    (if signed) for twice the `window` (a timestamp may be that far ahead), refusing
    a replay with 409 before anything is claimed. Returns the summary and what next."""
    deadline = clock.monotonic() + runtime
    handlers, queues = select(settings.drain.tasks, settings.drain.queues)
    conn = first_session(settings.connect, settings.connect_timeout, deadline)
    with conn:
        if signature is not None and not signatures.remember(
                conn, signature, timedelta(seconds=2 * window)):
            raise Refused(409, "this signed request was seen already: sign each request "
                               "anew, with the time it is sent")
        summary = drain(conn, handlers, settings.drain.options(queues, deadline),
                        reopen=partial(settings.connect, None))
    assert summary.ended_at is not None  # every drain that returns has read the clock
    left = timedelta(seconds=max(0.0, deadline - clock.monotonic()))
    decision = after_run(summary, now=summary.ended_at, depth=0, max_depth=1,
                         remaining=left)
    return {**summary.as_json(), "next": decision.action,
            "at": decision.at.isoformat() if decision.at else None}
