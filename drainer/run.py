"""The drain: reap, claim batches and run them until nothing is ready, archive, report.

The loop never builds SQL; it calls `drainer.queue`. It decides only how much to
claim and when to stop, and those decisions live in `Sizer`, so the cloud entry
points and the simulator use the very same code.
"""

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta

import psycopg

from . import clock, queue
from .batch import Batch, Outcome
from .errors import ConfigError
from .tasks import Handler

log = logging.getLogger(__name__)

DEFAULT_LEASE = timedelta(minutes=5)
DEFAULT_ARCHIVE_AFTER = timedelta(days=7)


COUNTS = ("claimed", "done", "retried", "failed", "lost", "reaped", "archived")


@dataclass
class Summary:
    """The run's report; `claimed` counts claims kept (released ones are given back),
    so claimed = done + retried + failed + lost."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    reaped: int = 0
    archived: int = 0
    seconds: float = 0.0
    stopped: str = "empty"
    next_due: datetime | None = None
    # next_due's sources, for the wake-up decisions (drainer.wake); not in the JSON.
    next_run_at: datetime | None = None
    next_lease_end: datetime | None = None

    def plus(self, later: "Summary") -> "Summary":
        """`later` (its stop reason, next_due...) with this summary's counts added to its
        own: the totals of a run made of several drains."""
        return replace(later, **{n: getattr(self, n) + getattr(later, n) for n in COUNTS})

    def as_json(self) -> dict:
        data = asdict(self)
        del data["next_run_at"], data["next_lease_end"]
        data["seconds"] = round(self.seconds, 3)
        data["next_due"] = self.next_due.isoformat() if self.next_due else None
        return data


class Sizer:
    """How many jobs to claim next.

    Adaptive unless pinned: it doubles while full batches finish well within
    TARGET seconds (fast handlers, deep queue: fewer round trips per job) and halves
    when a batch runs long (slow handlers: leave the rest to other drainers). Near
    the deadline it claims only what the observed handler time says can finish.
    """

    START, MIN, MAX = 10, 1, 500
    TARGET = 0.25  # seconds of work per batch

    def __init__(self, pinned: int | None = None, concurrency: int = 1):
        self.pinned = pinned
        self.concurrency = concurrency
        self.size = pinned or self.START
        self.per_job: float | None = None  # observed wall seconds per job, smoothed

    def observe(self, jobs: int, wall: float, full: bool) -> None:
        """Learn from a finished batch of `jobs` that took `wall` seconds."""
        if not jobs:
            return
        per_job = wall / jobs
        self.per_job = per_job if self.per_job is None else 0.7 * self.per_job + 0.3 * per_job
        if self.pinned:
            return
        if wall > 2 * self.TARGET:
            self.size = max(self.MIN, self.size // 2)
        elif full and wall < self.TARGET / 2:
            self.size = min(self.MAX, self.size * 2)

    def fits(self, remaining: float | None) -> int:
        """The next claim's size, 0 when no job could finish in `remaining` seconds."""
        if remaining is None:
            return self.size
        if remaining <= 0:
            return 0
        if self.per_job is None:
            return min(self.size, self.concurrency)  # nothing observed yet: one round
        return min(self.size, math.floor(remaining / max(self.per_job, 1e-6)))

    def may_start(self, remaining: float | None) -> bool:
        """Whether one more job is expected to finish in `remaining` seconds."""
        if remaining is None:
            return True
        return remaining > (self.per_job or 0.0)


@dataclass
class Options:
    queues: list[str]
    batch_size: int | None = None
    lease: timedelta = DEFAULT_LEASE
    concurrency: int = 1
    archive_after: timedelta = DEFAULT_ARCHIVE_AFTER
    deadline: float | None = None  # on the clock seam's monotonic scale


def drain(
    conn: psycopg.Connection,
    handlers: dict[str, Handler],
    options: Options,
    *,
    stop: threading.Event | None = None,
    on_batch: Callable[[Summary], None] | None = None,
    on_claim: Callable[[], None] | None = None,
) -> Summary:
    """One drain on `conn`, which must be an autocommit connection. `on_claim` is
    called once, when the drain first holds jobs and before any handler starts (the
    cloud run arms its dead-man's switch there)."""
    missing = sorted(set(options.queues) - set(handlers))
    if missing or not options.queues:
        raise ConfigError(f"no handler for queues {missing}" if missing else "no queues to drain")
    began = clock.monotonic()
    stop = stop or threading.Event()
    summary = Summary()
    summary.reaped, has_archive = queue.start(conn)
    sizer = Sizer(options.batch_size, options.concurrency)

    def remaining() -> float | None:
        return None if options.deadline is None else options.deadline - clock.monotonic()

    def next_size() -> tuple[int, str]:
        """The next claim's size, or 0 and why the drain stops instead."""
        if stop.is_set():
            return 0, "signal"
        size = sizer.fits(remaining())
        return (size, "empty") if size >= 1 else (0, "deadline")

    size, summary.stopped = next_size()
    jobs = queue.claim(conn, options.queues, size, options.lease) if size else []
    if jobs and on_claim:
        on_claim()
    while jobs:
        batch_began = clock.monotonic()
        outcome = Batch(
            jobs,
            handlers,
            concurrency=options.concurrency,
            lease=options.lease,
            extend=lambda js: queue.extend(conn, js, options.lease),
            may_start=lambda: not stop.is_set() and sizer.may_start(remaining()),
            stop=stop,
        ).run()
        started = len(jobs) - len(outcome.unstarted)
        sizer.observe(started, clock.monotonic() - batch_began, full=len(jobs) == size)
        if outcome.unstarted and not stop.is_set():
            size, summary.stopped = 0, "deadline"
        else:
            size, summary.stopped = next_size()
        # This batch's results and the next claim share one round trip.
        settled = queue.settle(conn, outcome.succeeded, outcome.failed, outcome.unstarted,
                               claim_next=(options.queues, size, options.lease) if size else None)
        _record(settled, outcome, summary, len(jobs))
        if on_batch:
            on_batch(summary)
        jobs = settled.claimed

    summary.archived = queue.archive(conn, options.archive_after, to_table=has_archive)
    due = queue.due(conn, options.queues)
    summary.next_due, summary.next_run_at, summary.next_lease_end = (
        due.next_due, due.run_at, due.lease_end)
    summary.seconds = clock.monotonic() - began
    return summary


def _record(settled: queue.Settled, outcome: Outcome, summary: Summary, claimed: int) -> None:
    """Count a batch's results as written back."""
    done, statuses = settled.done, settled.failed
    lost = (
        len(outcome.lost)
        + len(outcome.succeeded) - len(done)
        + len(outcome.failed) - len(statuses)
    )
    if lost:
        log.warning("jobs lost: %d no longer ours (lease expired and taken over)", lost)
    summary.claimed += claimed - len(outcome.unstarted) - len(outcome.abandoned)
    summary.done += len(done)
    summary.failed += sum(1 for s in statuses.values() if s == "failed")
    summary.retried += sum(1 for s in statuses.values() if s == "queued")
    summary.lost += lost
