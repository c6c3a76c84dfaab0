"""What the cloud functions share: connecting with credentials that may be a cached
secret, migrating, and a run's drains up to the decision of what comes next.

The AWS Lambda function and the Google Cloud function differ in how they are
started, where their secrets live and how they arm wake-ups; a run's drains and
its `drainer.wake.after_run` decision are the same code.
"""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import psycopg

from . import clock
from .db import connect
from .errors import AuthenticationFailed
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


def connect_with(credentials: Credentials, *, prepare: bool, **options: Any
                 ) -> psycopg.Connection:
    """A connection (`options`: drainer.db.connect's); when the server refuses a
    cached secret (it may have been rotated), one more try with the secret read again."""

    def attempt() -> psycopg.Connection:
        return connect(credentials.conninfo(), prepare=prepare, **options)

    try:
        return attempt()
    except AuthenticationFailed:
        if not credentials.forget():
            raise
        log.info("the database refused the cached secret; reading the secret again")
        return attempt()


def migrate(conn: psycopg.Connection) -> dict[str, object]:
    """Apply the schema's migrations on `conn` (with no statement timeout: building an
    index on a big hand-made table may take longer than a drain's)."""
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
