"""The PostgreSQL the replays drain: drainer's schema and statements, each replay
on an emptied table, its `now` the virtual clock's.

An observer connection, which the compute model does not see, reads what the
metrics need (a claimed job's run_at, what is left at the day's end, the backoff
the fail statement gives) and stores the day's schedules before it begins.
"""

from datetime import UTC, datetime, timedelta
from functools import cached_property

import psycopg

from drainer import schedules
from drainer.schedules import Schedule
from drainer.storage import enqueue, roundtrip, writeback
from drainer.storage.schema import migrate

from .compute import Connection, Cursor, Session

PROBE = "simulator-probe"


class Database:
    """A migrated database; `reset()` empties its jobs for the next replay."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.observer = psycopg.connect(url, autocommit=True)
        migrate(self.observer)
        self.connections: list[Connection] = []  # every one made
        self.idle: list[Connection] = []

    def connect(self, session: Session) -> Connection:
        """A connection for `session`, once it has connected on virtual time."""
        session.open()
        conn = self.idle.pop() if self.idle else self._new()
        conn.session = session
        return conn

    def _new(self) -> Connection:
        conn = Connection.connect(self.url, autocommit=True, cursor_factory=Cursor,
                                  prepare_threshold=0)
        conn.pool = self.idle
        self.connections.append(conn)
        return conn

    def restart(self) -> None:
        """Cut every session but the observer's, as a restart of the server does:
        each connection fails at its next statement, and is never reused."""
        self.observer.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        for conn in self.connections:
            conn.cut = True
        self.idle.clear()

    def reset(self) -> None:
        """An empty table, and every connection idle (a replay ends with some open)."""
        for conn in [c for c in self.connections if c.cut or c.closed]:
            conn.discard()
            self.connections.remove(conn)
        for conn in self.connections:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            conn.session = None
        self.idle[:] = self.connections
        self.observer.execute(
            "TRUNCATE jobs, jobs_archive, drainer_schedules RESTART IDENTITY")

    def sync(self, declared: list[Schedule], now: datetime) -> None:
        """Store the schedules and queue each one's next slot after `now`, as
        `drainer schedules --sync` does at a deploy (unseen by the compute model)."""
        schedules.reconcile(self.observer, declared, sorted({s.queue for s in declared}),
                            now=now)

    def run_at(self, job_id: int) -> datetime:
        return self.observer.execute("SELECT run_at FROM jobs WHERE id = %s",
                                     (job_id,)).fetchone()[0]

    def unfinished(self, end: datetime) -> int:
        """Jobs neither done nor failed for good, but for the slot a schedule queued
        for `end` or later (the next day's)."""
        return self.observer.execute(
            "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running') "
            "AND NOT (meta ? 'schedule' AND run_at >= %s)", (end,)).fetchone()[0]

    @cached_property
    def backoff(self) -> list[float]:
        """Seconds from a failure to its retry, by attempt (index 0: the first attempt),
        as the fail statement computes them: a probe job failed again and again in a
        transaction that is rolled back."""
        lease, moment = timedelta(minutes=5), datetime(2100, 1, 1, tzinfo=UTC)
        delays = []
        with psycopg.connect(self.url) as conn, conn.transaction(force_rollback=True):
            enqueue.enqueue(conn, PROBE, {}, max_attempts=100, now=moment)
            for _ in range(12):  # past the cap
                [job] = roundtrip.claim(conn, [PROBE], 1, lease, now=moment)
                writeback.fail(conn, [(job, "probe")], now=moment)
                due = conn.execute("SELECT run_at FROM jobs WHERE queue = %s",
                                   (PROBE,)).fetchone()[0]
                delays.append((due - moment).total_seconds())
                moment = due
        return delays

    def close(self) -> None:
        for conn in self.connections:
            conn.discard()
        self.observer.close()
