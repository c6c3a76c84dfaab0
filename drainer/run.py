"""The drain: reap, claim batches and run them until nothing is ready, archive, report.

The loop never builds SQL; it calls `drainer.queue`. It decides only how much to
claim and when to stop, and those decisions live in `Sizer`. The scale-to-zero
simulator in `bench/` runs this very loop, on virtual time (`drainer.clock`).
"""

import contextlib
import logging
import math
import textwrap
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta
from typing import TypeVar

import psycopg

from . import clock, db, hooks, queue, schedules, stopping, tracing
from . import tasks as tasks_
from .engine.batch import Batch
from .engine.core import Pace
from .engine.outcome import Land, Outcome
from .errors import ConfigError, DatabaseUnavailable, DrainerError, SchemaMissing
from .limits import Limits
from .tasks import Handler, Task, as_task

log = logging.getLogger(__name__)

MAX_INT = 2**63 - 1  # PostgreSQL's bigint: job ids, a claim's LIMIT
DEFAULT_LEASE = timedelta(minutes=5)
DEFAULT_ARCHIVE_AFTER = timedelta(days=7)
DEFAULT_ARCHIVE_FAILED_AFTER = queue.ARCHIVE_FAILED_AFTER


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
    # Queues with ready jobs that no task of the run handles: nobody will run them.
    no_task: list[str] = field(default_factory=list)
    # next_due's sources, for the wake-up decisions (drainer.wake); not in the JSON.
    next_run_at: datetime | None = None
    next_lease_end: datetime | None = None
    ended_at: datetime | None = None  # the database clock when next_due was read

    def plus(self, later: "Summary") -> "Summary":
        """`later` (its stop reason, next_due...) with this summary's counts added to its
        own, and the queues without a task that either saw: the totals of a run made of
        several drains."""
        return replace(later, **{n: getattr(self, n) + getattr(later, n) for n in COUNTS},
                       no_task=sorted({*self.no_task, *later.no_task}))

    def as_json(self) -> dict[str, object]:
        data = asdict(self)
        del data["next_run_at"], data["next_lease_end"], data["ended_at"]
        data["seconds"] = round(self.seconds, 3)
        data["next_due"] = self.next_due.isoformat() if self.next_due else None
        return data


# Seconds a batch's last two rounds of handlers must be expected to take for the batch
# to be refilled as they run: about a write-back's round trip.
REFILL_AFTER = 0.002


class Sizer:
    """How many jobs to claim next.

    Adaptive unless pinned: it starts at one round of handlers (START at least),
    doubles while full batches finish well within TARGET seconds (fast handlers, deep
    queue: fewer round trips per job) and halves when a batch runs long (slow
    handlers: leave the rest to other drainers), but never below two rounds of
    handlers when there are several (fewer would leave slots idle, and a batch of one
    round is not refilled: every batch would wait for its slowest job). It never
    exceeds MAX, or two rounds when that is more, so a batch can always be refilled.
    Near the deadline it claims only what the observed handler time says can finish.
    """

    START, MIN, MAX = 10, 1, 500
    TARGET = 0.25  # seconds of work per batch

    def __init__(self, pinned: int | None = None, concurrency: int = 1):
        self.pinned = pinned
        self.concurrency = concurrency
        self.most = min(max(self.MAX, 2 * concurrency), MAX_INT)
        self.least = self.MIN if concurrency == 1 else min(2 * concurrency, MAX_INT)
        self.size = pinned or min(self.most, max(self.START, concurrency))
        self.per_job: float | None = None  # observed wall seconds per job, smoothed
        self.longest: dict[str, float] = {}  # queue -> the longest handler run seen

    def took(self, queue: str, seconds: float) -> None:
        """Learn how long one of `queue`'s handlers ran (as soon as it ends)."""
        self.longest[queue] = max(seconds, self.longest.get(queue, 0.0))

    def observe(self, jobs: int, wall: float, full: bool) -> None:
        """Learn from a finished batch of `jobs` that took `wall` seconds."""
        if not jobs:
            return
        per_job = wall / jobs
        self.per_job = per_job if self.per_job is None else 0.7 * self.per_job + 0.3 * per_job
        if self.pinned:
            return
        if wall > 2 * self.TARGET:
            self.size = max(self.least, self.size // 2)
        elif full and wall < self.TARGET / 2:
            self.size = min(self.most, self.size * 2)

    def fits(self, remaining: float | None) -> int:
        """The next claim's size, 0 when no job could finish in `remaining` seconds."""
        if remaining is None:
            return self.size
        if remaining <= 0:
            return 0
        if self.per_job is None:
            return min(self.size, self.concurrency)  # nothing observed yet: one round
        return min(self.size, math.floor(remaining / max(self.per_job, 1e-6)))

    def may_start(self, remaining: float | None, queue: str | None = None,
                  timeout: float | None = None) -> bool:
        """Whether a job of `queue` can finish in `remaining` seconds, judged from the
        longest that queue's handlers have run (a mean would start a slow job after
        fast ones with too little time left), and never longer than the task's
        `timeout`; from the mean of every job when none of the queue has run yet."""
        if remaining is None:
            return True
        longest = self.longest.get(queue) if queue is not None else None
        if longest is None:
            longest = timeout if timeout is not None else self.per_job or 0.0
        elif timeout is not None:
            longest = min(longest, timeout)
        return remaining > longest


@dataclass
class Options:
    queues: list[str]
    batch_size: int | None = None
    lease: timedelta = DEFAULT_LEASE
    concurrency: int = 1
    archive_after: timedelta = DEFAULT_ARCHIVE_AFTER  # done jobs, by created_at
    archive_failed_after: timedelta = DEFAULT_ARCHIVE_FAILED_AFTER  # failed, by run_at
    deadline: float | None = None  # on the clock seam's monotonic scale
    verbose: bool = False  # each failure's log line carries the handler's traceback
    # The kind of event loop async handlers run on (clock.LOOPS); None: the process's.
    event_loop: str | None = None


Reopen = Callable[[], psycopg.Connection]
T = TypeVar("T")
# Pauses before each new connection when the drain's session drops (an idle limit
# of the server or a pooler, a restart); then the drain gives up (exit 3).
RECONNECTS = (0.0, 0.5, 2.0)


class Link:
    """The drain's connection, opened again when its session drops, for what may
    safely be sent twice: guarded writes (complete, fail, extend), claims, reads.
    Connections it opened, it closes; the caller's stays the caller's."""

    def __init__(self, conn: psycopg.Connection, reopen: Reopen | None,
                 stop: threading.Event | None = None):
        self.conn = conn
        self.reopen = reopen
        self.stop = stop
        self.opened: list[psycopg.Connection] = []
        self.lock = threading.Lock()  # heartbeats come from handler threads too
        self.closed = False

    def send(self, first: Callable[[psycopg.Connection], T],
             again: Callable[[psycopg.Connection], T] | None = None) -> T:
        """`first(conn)`; if the session drops, `again` (default: `first`) on a new one.
        An error that leaves the session alive (a deadlock, a full disk) is raised as is:
        then what was sent is known to have rolled back. Once stopped, a second stop
        may cut the round trip short (`_within`)."""
        with self.lock:
            if self.closed:  # a handler written off at a stop, still going after the drain
                if stopping.stranded(self.stop):
                    raise stopping.Unanswered("the database did not answer in time")
                raise DatabaseUnavailable("the drain has ended; its connection is closed")
            if isinstance(self.stop, stopping.Stop) and self.stop.is_set():
                return self._within(self.stop, lambda: self._send(first, again))
            return self._send(first, again)

    def _within(self, stop: stopping.Stop, send: Callable[[], T]) -> T:
        """`send()` on another thread, waited for until a second stop's time is up:
        then the round trip, and its connection, are left as they are (`stranded`)."""
        done, answer, raised = clock.event(), list[T](), list[BaseException]()

        def run() -> None:
            try:
                answer.append(send())
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
                raised.append(exc)
            done.set()

        threading.Thread(target=run, daemon=True, name="drainer-round-trip").start()
        while not done.wait(stopping.POLL):
            left = stop.left()
            if left is not None and left <= 0:
                self.closed = stop.stranded = True
                raise stopping.Unanswered(
                    f"the database did not answer within {stopping.HURRY:g} s")
        if raised:
            raise raised[0]
        return answer[0]

    def _send(self, first: Callable[[psycopg.Connection], T],
              again: Callable[[psycopg.Connection], T] | None) -> T:
        """`send`'s round trip, and its reconnects; the caller holds the lock."""
        try:
            return first(self.conn)
        except DatabaseUnavailable as exc:
            if self.reopen is None or not (self.conn.broken or self.conn.closed):
                raise
            lost = exc
        for pause in RECONNECTS:
            clock.sleep(pause)
            log.warning("database connection lost (%s); sending again on a new one",
                        lost)
            try:
                self.conn = self.reopen()
                self.opened.append(self.conn)
                return (again or first)(self.conn)
            except DatabaseUnavailable as exc:
                lost = exc
        raise lost

    def close(self) -> None:
        with self.lock:
            self.closed = True
        if stopping.stranded(self.stop):
            return  # a thread may still wait on one of them
        for conn in self.opened:
            with contextlib.suppress(psycopg.Error):
                conn.close()


def _use_loop(kind: str | None) -> None:
    if kind is None:
        return
    try:
        kind = clock.loop_kind(kind)
    except ValueError as exc:
        raise ConfigError(f"event_loop={exc}") from None
    if kind == "uvloop" and not clock.uvloop_installed():
        raise ConfigError("the uvloop event loop was asked for, and uvloop is not installed: "
                          "pip install 'drainer[uvloop]', or ask for auto or asyncio")
    clock.use_loop(kind)


def drain(
    conn: psycopg.Connection,
    handlers: Mapping[str, Handler],
    options: Options,
    *,
    stop: threading.Event | None = None,
    on_batch: Callable[[Summary], None] | None = None,
    on_claim: Callable[[], None] | None = None,
    reopen: Reopen | None = None,
) -> Summary:
    """One drain on `conn`, which must be an autocommit connection. `on_claim` is
    called once, when the drain first holds jobs and before any handler starts (the
    cloud run arms its dead-man's switch there). `reopen` opens a new connection when
    the session drops mid-drain; without it the drain stops with the error.

    A DrainerError raised after the drain began carries `summary`, the JSON of the
    work done until then; SchemaMissing none (there was no table to work on)."""
    missing = sorted(set(options.queues) - set(handlers))
    if missing or not options.queues:
        raise ConfigError(f"no handler for queues {missing}" if missing else "no queues to drain")
    # A queue named twice (--queue q --queue q, DRAINER_QUEUES=q,q) is drained once: in
    # a claim twice, each of its scans took the same rows (SKIP LOCKED skips only other
    # transactions' locks), and every job ran twice.
    options = replace(options, queues=list(dict.fromkeys(options.queues)))
    if not conn.autocommit:
        raise ConfigError("drain() needs an autocommit connection (psycopg.connect(url, "
                          "autocommit=True)): on any other, its claims would stay in an "
                          "open transaction while the handlers run")
    _use_loop(options.event_loop)
    began = clock.monotonic()
    summary = Summary()
    stop = stop or threading.Event()
    link = Link(conn, reopen, stop)
    traced = tracing.DrainTrace.start(options.queues)
    failed: BaseException | None = None
    try:
        _drain(link, handlers, options, stop, summary, on_batch, on_claim, traced)
    except DrainerError as exc:
        summary.seconds = clock.monotonic() - began
        if not isinstance(exc, SchemaMissing):  # no jobs table: no work done, nor
            exc.summary = summary.as_json()     # queues found empty, to report
        failed = exc
        raise
    except BaseException as exc:
        failed = exc
        raise
    finally:
        link.close()
        if traced is not None:
            summary.seconds = clock.monotonic() - began
            traced.end(summary.as_json(), failed)
    summary.seconds = clock.monotonic() - began
    return summary


def _drain(link: Link, handlers: Mapping[str, Handler], options: Options, stop: threading.Event,
           summary: Summary, on_batch: Callable[[Summary], None] | None,
           on_claim: Callable[[], None] | None,
           traced: tracing.DrainTrace | None = None) -> None:
    """The drain's steps, counted into `summary` as they happen; `traced`: its spans."""
    try:
        steps = _Steps(link, handlers, options, stop, summary, traced)
        steps.batches(on_batch, on_claim)
        steps.end()
    except stopping.Unanswered as exc:  # a second stop: the drain ends as it is
        summary.stopped = "signal"
        log.warning("%s; stopping without its answer", exc)


class _Steps:
    """One drain's phases and what they share: the start (reap, schedules, limits) when
    made, then the batches, each written back with the next claim, then the end
    (archive, next_due)."""

    def __init__(self, link: Link, handlers: Mapping[str, Handler], options: Options,
                 stop: threading.Event, summary: Summary,
                 traced: tracing.DrainTrace | None) -> None:
        self.link, self.options, self.stop, self.summary = link, options, stop, summary
        summary.reaped, self.has_archive = link.send(
            lambda c: queue.start(c, now=clock.database_now()))
        self.tasks = {name: as_task(name, handler) for name, handler in handlers.items()}
        _check_results(link.conn, [t for name, t in self.tasks.items()
                                   if name in options.queues])
        self.db_now = link.send(lambda c: _reconcile(c, handlers, options.queues))
        self.plain, self.limited = _split(self.tasks, options.queues)
        if self.limited:
            link.send(lambda c: queue.record_limits(c, self.limited,
                                                    _unlimited(handlers, self.plain)))
        self.sizer = Sizer(options.batch_size, options.concurrency)
        self.pace = Pace()  # handlers' times: how many slots a batch opens
        self.own_hooks = {q: (t.on_failure, t.on_dead) for q, t in self.tasks.items()
                          if t.on_failure or t.on_dead}
        self.spans = traced if traced is not None and traced.recording else None
        self.on_batch: Callable[[Summary], None] | None = None
        # The running batch's claims not yet written back, and those found lost: the
        # jobs whose spans its write-backs may end (tracing).
        self.known: dict[queue.Token, queue.Job] = {}
        self.mark = clock.monotonic()  # when the batch, or its last refill, began
        self.left_out: list[Limits] = []  # limited queues the last claim left out

    def took(self, job: queue.Job, seconds: float) -> None:
        self.sizer.took(job.queue, seconds)
        if self.spans is not None:
            self.spans.took(job, seconds)

    def claim(self, size: int, free: int | None = None) -> queue.Claim:
        """A claim of `size` (what the deadline leaves time for), in which limited
        queues take no more than that nor the process's `free` handler slots (between
        batches, all of them): jobs waiting in a batch would hold a place its running
        ones could use, and a job given back unstarted keeps its rate's token."""
        slots = self.options.concurrency if free is None else free
        limited = self.limited
        if self.options.deadline is not None and limited:
            # A limited job claimed now but refused by may_start would wait in the batch,
            # 'running', holding its limit's place (and a token) until the batch ends.
            remaining = self.remaining()
            limited = [lim for lim in limited if self.sizer.may_start(
                remaining, lim.queue, self.tasks[lim.queue].timeout)]
        # Whether they held ready jobs is known at the end (end(): 'deadline' then).
        # A set: looked up in the list, 1,000 limited queues cost a million compares.
        kept = set(limited)
        self.left_out = [lim for lim in self.limited if lim not in kept]
        return queue.Claim(self.plain, size, self.options.lease, limited,
                           take=min(size, slots))

    def remaining(self) -> float | None:
        deadline = self.options.deadline
        return None if deadline is None else deadline - clock.monotonic()

    def next_size(self) -> tuple[int, str]:
        """The next claim's size, or 0 and why the drain stops instead."""
        if self.stop.is_set():
            return 0, "signal"
        size = self.sizer.fits(self.remaining())
        return (size, "empty") if size >= 1 else (0, "deadline")

    def may_start(self, job: queue.Job) -> bool:
        if self.options.deadline is None:  # nothing to judge but the stop, at each job
            return not self.stop.is_set()
        return not self.stop.is_set() and self.sizer.may_start(
            self.remaining(), job.queue, self.tasks[job.queue].timeout)

    def batches(self, on_batch: Callable[[Summary], None] | None,
                on_claim: Callable[[], None] | None) -> None:
        """Claim, run and write back until nothing is ready, a stop or the deadline."""
        self.on_batch = on_batch
        size, self.summary.stopped = self.next_size()
        sent = clock.monotonic()
        spec = self.claim(size)
        jobs = self.link.send(lambda c: queue.claim(
            c, spec.queues, spec.size, spec.lease, limited=spec.limited, take=spec.take,
            now=clock.database_now())) if size else []
        if jobs and on_claim:
            on_claim()
        while jobs:
            jobs, size, sent = self.batch(jobs, size, sent)

    def batch(self, jobs: list[queue.Job], size: int, sent: float
              ) -> tuple[list[queue.Job], int, float]:
        """Run one batch, refilled while a full claim's jobs keep coming, and write it
        back with the next claim: the jobs that claim took, its size and when it was
        sent."""
        self.known = {job.token: job for job in jobs}  # the batch's, its refills' too
        self.mark = clock.monotonic()
        running = Batch(
            jobs, self.tasks, concurrency=self.options.concurrency, lease=self.options.lease,
            extend=lambda js: self.link.send(
                lambda c: queue.extend_claims(c, js, self.options.lease,
                                              now=clock.database_now())),
            hold=lambda js: self.link.send(
                lambda c: queue.hold(c, js, self.options.lease, now=clock.database_now())),
            may_start=self.may_start, stop=self.stop, confirmed=sent,
            # Handlers' times serve the deadline's judgement and tracing only.
            took=(self.took if self.options.deadline is not None or self.spans is not None
                  else None),
            tracebacks=self.options.verbose,
            refill=self.refill if self.refills(size, len(jobs)) else None,
            refill_at=max(1, self.options.concurrency // 4) if self.limited else 0,
            pace=self.pace, codecs=db.codecs(self.link.conn))
        outcome = running.run()
        started = len(outcome.succeeded) + len(outcome.failed) + len(outcome.abandoned)
        self.sizer.observe(started, clock.monotonic() - self.mark, full=len(jobs) == size)
        if running.core.failure is not None:
            size = 0  # write back what finished and give back what never started
        elif outcome.unstarted and not self.stop.is_set():
            size, self.summary.stopped = 0, "deadline"
        else:
            size, self.summary.stopped = self.next_size()
        if stopping.hurried(self.stop):
            _left_running(outcome.abandoned, running, self.options.lease)
        sent = clock.monotonic()
        try:
            settled = self.write_back(outcome, self.claim(size) if size else None,
                                      list(self.known.values()))
        except stopping.Unanswered:
            _left_unwritten(outcome)
            raise
        if running.core.failure is not None:
            raise running.core.failure
        return settled.claimed, size, sent

    def refill(self, part: Outcome, land: Land, free: int) -> bool:
        """A running batch's refill (see Batch): write back what finished, with a claim
        of the next batch's size (limited queues: no more than the `free` handler
        slots) whose jobs join the batch; it may refill again as `refills` says."""
        now = clock.monotonic()
        self.sizer.observe(len(part.succeeded) + len(part.failed), now - self.mark, full=True)
        self.mark = now
        size, self.summary.stopped = self.next_size()
        ended = [*part.succeeded, *(job for job, _ in part.failed)]
        lost = [self.known[t] for t in part.lost if t in self.known]

        def joined(jobs: list[queue.Job]) -> None:
            self.known.update((job.token, job) for job in jobs)
            land(jobs)

        # Written back: a batch refilled for hours holds only its live jobs. A lost job
        # stays, for the span its handler's end still owes (tracing).
        for job in ended:
            self.known.pop(job.token, None)
        settled = self.write_back(part, self.claim(size, free) if size else None,
                                  [*ended, *lost], joined)
        return self.refills(size, len(settled.claimed), refilling=True)

    def refills(self, size: int, claimed: int, refilling: bool = False) -> bool:
        """Whether a batch from a claim of `size` that took `claimed` jobs is refilled:
        when the claim came back full (more are likely ready) and holds two rounds of
        handlers or more. A smaller one is written back between batches, as a claim
        while its few handlers run would hold the next jobs' leases for no gain. A
        drain with limited queues, whose claims never take more jobs than free slots,
        is refilled once its claim took any, even by refills that take none (the next
        then waits for a result to write back, Batch): each refill waits for a quarter of
        the slots to be free (Batch's refill_at), so the slots do not wait for the
        batch's slowest job, whatever the time per job seen so far: once the refills of
        fast jobs are quick, that time says nothing of a slow one holding a slot. No
        other batch is refilled when its last two rounds are expected to take less than
        REFILL_AFTER, by the time per job seen so far (fast handlers, few slots):
        writing back meanwhile would gain nothing but a thread's hand-off."""
        if self.limited:
            # Even when this claim took none: the batch's jobs that finish later must be
            # written back as they do (Batch waits for one before the next refill), or
            # each would hold its limit's place, and its group's next job, until the
            # batch's slowest job ends.
            return size > 0 and (claimed > 0 or refilling)
        rounds = 2 * self.options.concurrency
        per_job = self.sizer.per_job
        if per_job is not None and rounds * per_job < REFILL_AFTER:
            return False
        return size > 0 and claimed == size and size >= rounds

    def write_back(self, outcome: Outcome, claim_next: queue.Claim | None,
                   jobs: list[queue.Job], land: Land | None = None) -> queue.Settled:
        """Write `outcome` back with `claim_next`, and count, log, trace and tell the
        hooks of it; `jobs`: those it may hold. `land(claimed)` comes first: a refill's
        jobs join their batch before anything here may fail or wait."""
        settled = _settle(self.link, outcome, claim_next, self.db_now)
        if land is not None:
            land(settled.claimed)
        _record(settled, outcome, self.summary)
        ended = _ended_lost(settled, outcome)
        if ended:  # rare: only jobs cancelled, or taken over, while ours
            self.link.send(lambda c: queue.let_go(c, ended, now=clock.database_now()))
        _log_failures(settled, outcome)
        if self.spans is not None:
            self.spans.batch(jobs, settled, outcome)
        hooks.run(hooks.calls(settled, outcome.failed, self.own_hooks),
                  timeout=self.stop.left() if isinstance(self.stop, stopping.Stop) else None)
        if self.on_batch:
            self.on_batch(self.summary)
        return settled

    def end(self) -> None:
        """Archive, and learn when more work is due."""
        options, summary = self.options, self.summary
        if not stopping.hurried(self.stop):  # after a second stop, the next run archives
            summary.archived = self.link.send(lambda c: queue.archive(
                c, options.archive_after, failed_older_than=options.archive_failed_after,
                to_table=self.has_archive, now=clock.database_now()))
        due = self.link.send(lambda c: queue.due(c, self.plain, limited=self.limited,
                                                 now=clock.database_now(), known=list(self.tasks)))
        summary.next_due, summary.next_run_at, summary.next_lease_end, summary.ended_at = (
            due.next_due, due.run_at, due.lease_end, due.now)
        summary.no_task = due.no_task
        warn_no_task(due.no_task)
        if self.left_out and summary.stopped == "empty" and due.next_due is not None \
                and due.next_due <= due.now:
            # Something is due now, but is it a left-out queue's job that may start?
            # Not a plain queue's (an expired lease to reap, a job enqueued since the
            # last claim), nor a running job's lease end of a left-out queue.
            left = self.link.send(lambda c: queue.due(c, [], limited=self.left_out,
                                                      now=clock.database_now()))
            if left.run_at is not None and left.run_at <= left.now:
                summary.stopped = "deadline"  # ready jobs left out: the deadline stopped them


def _left_running(jobs: list[queue.Job], batch: Batch, lease: timedelta) -> None:
    """Say which jobs a second stop leaves running, and until about when: the end of
    the lease their batch last confirmed (by this machine's clock: a rough time)."""
    if not jobs:
        return
    ends = clock.wall() + batch.core.freshness.confirmed + lease.total_seconds() - clock.monotonic()
    until = datetime.fromtimestamp(ends).astimezone().isoformat(timespec="seconds")
    log.warning("%d jobs still running are left to their lease: their handlers are "
                "abandoned as the process exits, and the jobs go back to the queue when "
                "the lease ends, at about %s (ids %s)", len(jobs), until,
                ", ".join(str(job.id) for job in jobs[:10]) + (", ..." if len(jobs) > 10 else ""))


def _left_unwritten(outcome: Outcome) -> None:
    """Say what a write-back left unanswered after a second stop leaves to its lease."""
    finished = len(outcome.succeeded) + len(outcome.failed)
    if outcome.unstarted or finished:
        log.warning("the database did not answer in time: %d jobs that never started and "
                    "%d that finished are left to their lease (the finished ones run again)",
                    len(outcome.unstarted), finished)


def warn_no_task(queues: list[str]) -> None:
    """One stderr line naming the ready queues no task handles: their jobs would wait
    for ever, and a misspelled queue name says nothing otherwise."""
    if queues:
        log.warning("ready jobs in queues no task drains: %s (check the queue name, or "
                    "--tasks)", ", ".join(queues),
                    extra={"data": {"event": "no_task", "queues": queues}})


def _check_results(conn: psycopg.Connection, tasks: list[Task]) -> None:
    """ConfigError before any claim when a task keeps results the table cannot hold."""
    keeping = sorted(t.queue for t in tasks if t.keep_result)
    if keeping and not queue.has_results(conn):
        raise ConfigError(f"the task of queue {', '.join(map(repr, keeping))} keeps results "
                          "(keep_result=True), but the jobs table has no result column: run "
                          "`drainer migrate` to add it")


def _reconcile(conn: psycopg.Connection, handlers: Mapping[str, Handler],
               queues: list[str]) -> "DatabaseClock | None":
    """Bring the drained queues' schedules in line with the declared ones, once the
    start told whether the schema has schedules; the database clock it read then.
    Only a queue whose handler is a registered task (its module loaded) may lose a
    schedule its module no longer declares."""
    declared = [s for s in schedules.declared().values() if s.queue in queues]
    if not queue.has_schedules(conn):
        if declared:
            raise ConfigError(f"schedule {declared[0].name!r}: the database has no schedules "
                              "table: run `drainer migrate` to add it")
        return None
    if not declared and not queue.has_schedules(conn, stored=True):
        return None  # none declared, none ever stored: nothing to do, no statement
    registered = tasks_.registered()
    loaded = [q for q in queues if registered.get(q) is handlers[q]]
    now = schedules.reconcile(conn, declared, queues, withdraw=loaded,
                              now=clock.database_now())
    return DatabaseClock(now, clock.monotonic())


@dataclass(frozen=True)
class DatabaseClock:
    """The database clock, as read at one moment and carried on by the monotonic one:
    what a schedule's next slot is judged by while the drain goes on."""

    read: datetime
    at: float

    def now(self) -> datetime:
        faked = clock.database_now()
        return faked if faked is not None else self.read + timedelta(
            seconds=clock.monotonic() - self.at)


def _split(tasks: Mapping[str, Task], queues: list[str]) -> tuple[list[str], list[Limits]]:
    """The drained queues without limits, and the limits of the others."""
    limited = [tasks[q].limits for q in queues if tasks[q].limits.any]
    return [q for q in queues if not tasks[q].limits.any], limited


def _unlimited(handlers: Mapping[str, Handler], plain: list[str]) -> list[str]:
    """The queues without limits whose handler is a registered task (its module loaded):
    any limits recorded for them are gone from the code."""
    registered = tasks_.registered()
    return [q for q in plain if registered.get(q) is handlers[q]]


def _settle(link: Link, outcome: Outcome, claim_next: queue.Claim | None,
            db_now: DatabaseClock | None) -> queue.Settled:
    """Write a batch back with the next claim in one round trip (and what comes after
    the slots of schedules that ran). If the session drops, the results (guarded, so
    harmless if they had landed) and the claim go again on a new connection, but not
    the release: it lowers attempts, and had it landed, another worker may hold those
    jobs now. They are left to their lease."""
    ran = [*outcome.succeeded, *(job for job, _ in outcome.failed)]
    also = None if db_now is None else (
        lambda c: schedules.after_run(c, ran, db_now.now()))
    return link.send(
        lambda c: queue.settle(c, outcome.succeeded, outcome.failed, outcome.unstarted,
                               results=outcome.results, claim_next=claim_next, also=also,
                               now=clock.database_now()),
        lambda c: queue.settle_again(c, outcome.succeeded, outcome.failed,
                                     results=outcome.results, claim_next=claim_next,
                                     also=also, now=clock.database_now()))


def _record(settled: queue.Settled, outcome: Outcome, summary: Summary) -> None:
    """Count a batch's results as written back, each job once: a job is lost when the
    heartbeat found it taken over, or when its guarded write changed nothing. Claimed
    counts the jobs written back here (not those given back unstarted, nor those
    abandoned still running), so that claimed = done + retried + failed + lost."""
    lost = (
        outcome.lost
        | {job.token for job in outcome.succeeded if job.token not in settled.done}
        | {job.token for job, _ in outcome.failed if job.token not in settled.failed}
    )
    if lost:
        log.warning("jobs lost: %d no longer ours (lease expired and taken over, or "
                    "cancelled)", len(lost))
    statuses = [failure.status for failure in settled.failed.values()]
    summary.claimed += len(outcome.succeeded) + len(outcome.failed) + len(outcome.lost)
    summary.done += len(settled.done)
    summary.failed += sum(1 for s in statuses if s == "failed")
    summary.retried += sum(1 for s in statuses if s == "queued")
    summary.lost += len(lost)


def _ended_lost(settled: queue.Settled, outcome: Outcome) -> list[queue.Job]:
    """The batch's claims no longer ours whose handler has ended, or never began: those
    the heartbeat found taken over, and those whose guarded completion or failure
    changed nothing. A job cancelled while running holds its limits' places until then
    (queue.let_go). Unstarted jobs whose release changed nothing too, but not after a
    lost answer (`resent`): the release is not sent again then, and had it landed, its
    tokens (lowered by it) may be another drainer's now."""
    unstarted = () if settled.resent else outcome.unstarted
    if (len(settled.done) + len(settled.failed) + len(settled.released)
            == len(outcome.succeeded) + len(outcome.failed) + len(unstarted)):
        return outcome.ended_lost  # every write landed: the usual case, nothing built
    written = settled.done | settled.failed.keys() | settled.released
    ended = (*outcome.succeeded, *(job for job, _ in outcome.failed), *unstarted)
    return [*outcome.ended_lost, *(job for job in ended if job.token not in written)]


def _log_failures(settled: queue.Settled, outcome: Outcome) -> None:
    """One stderr line per failed attempt that was still ours once written back: the
    summary's counts alone (`retried 14`) leave a user no way to learn why short of
    psql. A failure no longer ours changed nothing and is counted lost instead."""
    for job, setback in outcome.failed:
        failure = settled.failed.get(job.token)
        if failure is None:
            continue
        if setback.then == "snooze":
            log.info("job %d (queue %s) snoozed until %s: %s", job.id, job.queue,
                     failure.run_at.isoformat(), setback.error,
                     extra={"data": {"event": "job_snoozed", "id": job.id, "queue": job.queue,
                                     "until": failure.run_at}})
        else:
            _log_failure(job, setback, failure, outcome.tracebacks.get(job.token))


def _log_failure(job: queue.Job, setback: queue.Setback, failure: queue.Failure,
                 traced: str | None) -> None:
    """The failure as one line (a multi-line message shows its newlines as \\n), and
    as structured fields for the cloud function's JSON logs; a retry is a warning, a
    job failed for good an error. `traced` (--verbose) follows, indented."""
    retry = failure.status == "queued"
    then = (f"retry at {failure.run_at.isoformat()}" if retry else "failed for good" + (
        f" ({setback.why})" if setback.why else ""))
    error = setback.error
    shown = error.replace("\r", "\\r").replace("\n", "\\n")
    # A hand-made table may hold a NULL max_attempts, which the fail statement reads as 5.
    limit = queue.DEFAULT_MAX_ATTEMPTS if job.max_attempts is None else job.max_attempts
    line = (f"job {job.id} (queue {job.queue}) failed, attempt {job.attempts} of {limit}: "
            f"{shown}; {then}")
    data = {"event": "job_failed", "id": job.id, "queue": job.queue, "attempt": job.attempts,
            "max_attempts": limit, "error": error,
            "next": "retry" if retry else "failed", "retry_at": failure.run_at if retry else None}
    if traced is not None:
        line += "\n" + textwrap.indent(traced, "  ")
        data["traceback"] = traced
    log.log(logging.WARNING if retry else logging.ERROR, "%s", line, extra={"data": data})
