"""The jobs table's semantics in memory: what the SQL in drainer/sql/queries.sql does
to a row, on the simulated clock (which plays the database clock).

Kept to the queue's rules: ready is queued with run_at <= now, oldest run_at
first; a failure retries after least(1 hour, 10 s * 2^attempts) or fails for good
at max_attempts; release gives the attempt back; next_due is the earliest queued
run_at or running lease end, clamped to now (with both sources). tests/test_simulate.py checks the
backoff against the database's own.
"""

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field


def backoff(attempts: int) -> float:
    """Seconds to the retry after failed attempt number `attempts` (the default backoff)."""
    return min(3600.0, 10.0 * 2.0**attempts)


@dataclass(frozen=True)
class Spec:
    """A job the day will enqueue: when, due when (scheduled ahead), how long its
    handler runs and how many of its attempts fail."""

    id: int
    enqueue_at: float
    run_at: float | None
    duration: float
    failures: int
    max_attempts: int


@dataclass
class Row:
    spec: Spec
    committed: float
    run_at: float
    status: str = "queued"
    attempts: int = 0
    locked_until: float | None = None
    starts: list[tuple[float, float]] = field(default_factory=list)  # (due, started)

    @property
    def id(self) -> int:
        return self.spec.id


class Table:
    def __init__(self) -> None:
        self.rows: dict[int, Row] = {}
        self._ready: list[tuple[float, int]] = []  # (run_at, id) of queued rows
        self._running: dict[int, Row] = {}

    def insert(self, spec: Spec, now: float) -> Row:
        row = Row(spec, committed=now, run_at=max(now, spec.run_at or now))
        self.rows[spec.id] = row
        self._queue(row)
        return row

    def claim(self, now: float, limit: int, lease: float) -> list[Row]:
        claimed = []
        while self._ready and len(claimed) < limit and self._ready[0][0] <= now:
            row = self.rows[heapq.heappop(self._ready)[1]]
            row.status, row.attempts, row.locked_until = "running", row.attempts + 1, now + lease
            self._running[row.id] = row
            claimed.append(row)
        return claimed

    def extend(self, rows: Iterable[Row], now: float, lease: float) -> None:
        for row in rows:
            row.locked_until = now + lease

    def complete(self, rows: Iterable[Row]) -> None:
        for row in rows:
            self._stop(row, "done")

    def fail(self, rows: Iterable[Row], now: float) -> None:
        for row in rows:
            if row.attempts >= row.spec.max_attempts:
                self._stop(row, "failed")
            else:
                row.run_at = now + backoff(row.attempts)
                self._stop(row, "queued")

    def release(self, rows: Iterable[Row]) -> None:
        for row in rows:
            row.attempts -= 1
            self._stop(row, "queued")

    def due(self, now: float) -> tuple[float | None, float | None, float | None]:
        """`drainer.queue.due`: (next_due, earliest queued run_at, earliest lease end)."""
        run_at = self._ready[0][0] if self._ready else None
        lease_end = min((r.locked_until for r in self._running.values()), default=None)
        due = min((t for t in (run_at, lease_end) if t is not None), default=None)
        return None if due is None else max(due, now), run_at, lease_end

    def _stop(self, row: Row, status: str) -> None:
        del self._running[row.id]
        row.status, row.locked_until = status, None
        if status == "queued":
            self._queue(row)

    def _queue(self, row: Row) -> None:
        heapq.heappush(self._ready, (row.run_at, row.id))
