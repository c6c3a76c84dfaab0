"""What the cloud functions share: connecting with credentials that may be a cached
secret, migrating, and a run's drains up to the decision of what comes next.

The AWS Lambda function and the Google Cloud function differ in how they are
started, where their secrets live and how they arm wake-ups; a run's drains and
its `drainer.wake.after_run` decision are the same code.
"""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg

from . import clock
from . import settings as s
from .db import connect
from .engine import session as engine_session
from .errors import AuthenticationFailed, BadInput
from .run import Options, Summary, drain
from .storage import schema
from .tasks import Handler
from .wake import Next, after_run

log = logging.getLogger(__name__)


class Credentials(Protocol):
    def conninfo(self) -> str:
        """Parameters for the next connection."""

    def forget(self) -> bool:
        """Drop a cached secret; True when there was one."""


@dataclass(frozen=True)
class FunctionSettings:
    """What every cloud function's settings hold: its database credentials, the
    drain's settings, prepared statements, the statement timeout, the safety margin
    kept back from its time, and how many continuations may follow in a row."""

    credentials: Credentials
    drain: s.Drain = field(default_factory=s.Drain)
    prepare: bool = True
    connect_timeout: float = s.DEFAULT_CONNECT_TIMEOUT  # seconds, across attempts
    statement_timeout: timedelta = timedelta(seconds=s.DEFAULT_STATEMENT_TIMEOUT)
    margin: float = s.DEFAULT_STATEMENT_TIMEOUT + s.BATCH_ALLOWANCE + s.INVOKE_ALLOWANCE
    max_depth: int = s.DEFAULT_MAX_DEPTH

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.drain.lease)

    @staticmethod
    def common_from_env() -> dict[str, Any]:
        """The fields above but the credentials, from the environment, read the same
        way by every function; ConfigError names a bad variable."""
        timeout = s.STATEMENT_TIMEOUT.resolve()
        margin = s.SAFETY_MARGIN.resolve()
        return {
            "drain": s.Drain.resolve(),
            "prepare": not s.NO_PREPARE.resolve(),
            "connect_timeout": s.CONNECT_TIMEOUT.resolve(),
            "statement_timeout": timedelta(seconds=timeout),
            # The deadline keeps back one statement timeout (the last writes and
            # next_due), a batch's overrun, and the continuation or wake-up call.
            "margin": (timeout + s.BATCH_ALLOWANCE + s.INVOKE_ALLOWANCE
                       if margin is None else margin),
            "max_depth": s.MAX_DEPTH.resolve(),
        }


def continuation_depth(value: object) -> int:
    """A continuation's depth from its event, or BadInput."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadInput(f"a continuation needs a depth of 1 or more, not {value!r}")
    return value


def open_session(settings: FunctionSettings, **options: Any) -> psycopg.Connection:
    """A connection (`options`: drainer.db.connect's, the statement timeout the
    settings' unless given); when the server refuses a cached secret (it may have
    been rotated), one more try with the secret read again."""
    options.setdefault("statement_timeout", settings.statement_timeout)

    def attempt() -> psycopg.Connection:
        return connect(settings.credentials.conninfo(), prepare=settings.prepare, **options)

    try:
        return attempt()
    except AuthenticationFailed:
        if not settings.credentials.forget():
            raise
        log.info("the database refused the cached secret; reading the secret again")
        return attempt()


def first_session(settings: FunctionSettings, deadline: float) -> psycopg.Connection:
    """A drain's first connection, waiting for a database that is resuming
    (DRAINER_CONNECT_TIMEOUT), never past the run's deadline."""
    return engine_session.first_session(
        lambda within: open_session(settings, connect_timeout=within),
        settings.connect_timeout, deadline)


def migrate(settings: FunctionSettings) -> dict[str, object]:
    """Apply the schema's migrations (with no statement timeout: building an index
    on a big hand-made table may take longer than a drain's)."""
    with open_session(settings, statement_timeout=None) as conn:
        applied = schema.migrate(conn)
        version = schema.version(conn)
    log.info("schema at version %d", version,
             extra={"data": {"event": "migrated", "version": version, "applied": applied}})
    return {"version": version, "applied": applied}


class Member(Protocol):
    """A run's part in a fleet of runs (drainer.aws.fanout's): it joins on the run's
    first session (`refused`: the fleet no longer needs it), is told of each drain and
    batch, and leaves with the run's decision, returning how the run continues."""

    refused: bool

    def join(self, conn: psycopg.Connection) -> None: ...

    def draining(self, conn: psycopg.Connection) -> None: ...

    def on_batch(self, summary: Summary) -> None: ...

    def leave(self, conn: psycopg.Connection, decision: Next, summary: Summary) -> Any: ...


@dataclass(frozen=True)
class Ran:
    """A run's drains: their total, the last decision (None: a member the fleet
    refused, which drained nothing), the database's time at the end, and how the
    run continues (the member's word, if any)."""

    total: Summary
    decision: Next | None = None
    now: datetime | None = None
    continuation: Any = None


def drains(session: Callable[[], psycopg.Connection],
           reopen: Callable[[], psycopg.Connection], handlers: Mapping[str, Handler],
           options: Options, *, depth: int, max_depth: int,
           on_claim: Callable[[], None] | None = None, member: Member | None = None) -> Ran:
    """Drain, decide; while the decision is to wait for a job due within the minute,
    sleep with no session open and drain again. `session` opens each drain's first
    session (waiting for a database that is resuming), `reopen` one after a drop."""
    assert options.deadline is not None  # a cloud run always has one
    total, joined = Summary(), member is None
    while True:
        with session() as conn:
            if not joined and member is not None:
                member.join(conn)
                if member.refused:
                    return Ran(total)
                joined = True
            if member is not None:
                member.draining(conn)
            summary = drain(conn, handlers, options, on_claim=on_claim, reopen=reopen,
                            on_batch=member.on_batch if member is not None else None)
            now = summary.ended_at
            assert now is not None  # every drain that returns has read the database clock
            total = total.plus(summary)
            left = timedelta(seconds=max(0.0, options.deadline - clock.monotonic()))
            decision = after_run(summary, now=now, depth=depth, max_depth=max_depth,
                                 remaining=left)
            if decision.action != "wait":
                went_on = member.leave(conn, decision, summary) if member is not None else None
                return Ran(total, decision, now, went_on)
        assert decision.at is not None  # a wait is until a moment
        # Due within the minute and time to spare: cheaper than a wake-up, and no
        # session is open while we sleep.
        log.info("waiting until %s", decision.at.isoformat(),
                 extra={"data": {"event": "wait", "at": decision.at}})
        clock.sleep((decision.at - now).total_seconds())


def prune_logged(prune: Callable[[], list[str]], failures: tuple[type[Exception], ...]
                 ) -> list[str]:
    """`prune()`, which deletes the stale lease wake-ups and returns their names,
    logged. A failure among `failures` is logged, not raised: a stale wake-up costs
    one run that finds nothing."""
    try:
        pruned = prune()
    except failures as exc:
        log.error("could not delete stale lease wake-ups: %s", exc,
                  extra={"data": {"event": "prune_failed"}})
        return []
    if pruned:
        log.info("deleted %d stale lease wake-ups", len(pruned),
                 extra={"data": {"event": "pruned", "names": pruned}})
    return pruned
