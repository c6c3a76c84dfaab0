"""The drain loop: claim batches and run them until nothing is ready, each written
back with the next claim, then learn when more is due; around it, a drain's upkeep
(reap, schedules, limits' records, archive).

The loop never builds SQL; it calls `drainer.storage`, through a session (`session`),
and runs each batch's handlers with a runner (`runners`). It decides only how much
to claim and when to stop, and those decisions live in `Sizer`. drain() runs it on an
autocommit connection with handler threads; drain_now(in_transaction=True) runs the
same loop in the caller's transaction, on the caller's thread, without the upkeep.
The scale-to-zero simulator in `bench/` runs this very loop, on virtual time
(`drainer.clock`).
"""

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import psycopg

from .. import clock, db, defaults, hooks, model, schedules, stopping
from .. import tasks as tasks_
from ..errors import ConfigError
from ..storage import admin, roundtrip, writeback
from ..storage.claim import Claim
from ..storage.limits import Limits
from ..tasks import Handler, Task, as_task
from .batch import Batch
from .core import Pace
from .outcome import Land, Outcome
from .runners import Runner
from .session import Session
from .sizer import Sizer
from .spans import DrainTrace
from .summary import (
    Summary,
    ended_lost,
    left_running,
    left_unwritten,
    log_failures,
    record,
    warn_no_task,
)

log = logging.getLogger("drainer.run")  # the name its log lines always had



@dataclass
class Options:
    queues: list[str]
    batch_size: int | None = None
    lease: timedelta = defaults.LEASE
    concurrency: int = 1
    archive_after: timedelta = defaults.ARCHIVE_AFTER  # done jobs, by created_at
    archive_failed_after: timedelta = defaults.ARCHIVE_FAILED_AFTER  # failed, by run_at
    deadline: float | None = None  # on the clock seam's monotonic scale
    verbose: bool = False  # each failure's log line carries the handler's traceback
    # The kind of event loop async handlers run on (clock.LOOPS); None: the process's.
    event_loop: str | None = None


def checked(handlers: Mapping[str, Handler], options: Options) -> Options:
    """`options` with each queue named once, once every queue has a handler. A queue
    named twice (--queue q --queue q, DRAINER_QUEUES=q,q) is drained once: in a claim
    twice, each of its scans took the same rows (SKIP LOCKED skips only other
    transactions' locks), and every job ran twice."""
    missing = sorted(set(options.queues) - set(handlers))
    if missing or not options.queues:
        raise ConfigError(f"no handler for queues {missing}" if missing else "no queues to drain")
    return replace(options, queues=list(dict.fromkeys(options.queues)))


class Drain:
    """One drain's phases and what they share: with `upkeep`, the start (reap,
    schedules, limits); then the batches, each written back with the next claim; then
    the end (with `upkeep`, archive; next_due). `upkeep` also runs the failure hooks,
    which drain_now(in_transaction=True), a drain of a test's own jobs, leaves out."""

    def __init__(self, session: Session, runner: Runner, handlers: Mapping[str, Handler],
                 options: Options, stop: threading.Event, summary: Summary, *,
                 upkeep: bool = True, traced: DrainTrace | None = None) -> None:
        self.session, self.runner, self.handlers = session, runner, handlers
        self.options, self.stop, self.summary, self.upkeep = options, stop, summary, upkeep
        self.tasks = {name: as_task(name, handler) for name, handler in handlers.items()}
        self.plain, self.limited = split(self.tasks, options.queues)
        self.has_archive = False
        self.db_now: DatabaseClock | None = None  # with schedules, from the start
        self.sizer = Sizer(options.batch_size, options.concurrency)
        self.pace = Pace()  # handlers' times: how many slots a batch opens
        self.own_hooks = {q: (t.on_failure, t.on_dead) for q, t in self.tasks.items()
                          if t.on_failure or t.on_dead}
        self.spans = traced if traced is not None and traced.recording else None
        self.on_batch: Callable[[Summary], None] | None = None
        # The running batch's claims not yet written back, and those found lost: the
        # jobs whose spans its write-backs may end (tracing).
        self.known: dict[model.Token, model.Job] = {}
        self.mark = clock.monotonic()  # when the batch, or its last refill, began
        self.left_out: list[Limits] = []  # limited queues the last claim left out

    def run(self, on_batch: Callable[[Summary], None] | None = None,
            on_claim: Callable[[], None] | None = None) -> None:
        """The drain's steps, counted into its summary as they happen."""
        try:
            if self.upkeep:
                self.start()
            self.batches(on_batch, on_claim)
            self.end()
        except stopping.Unanswered as exc:  # a second stop: the drain ends as it is
            self.summary.stopped = "signal"
            log.warning("%s; stopping without its answer", exc)

    def start(self) -> None:
        """Reap, learn the schema, check that results can be kept, bring the schedules
        in line, and record the limits."""
        session, options, handlers = self.session, self.options, self.handlers
        self.summary.reaped, self.has_archive = session.send(
            lambda c: admin.start(c, now=clock.database_now()))
        check_results(session.conn, [t for name, t in self.tasks.items()
                                     if name in options.queues])
        self.db_now = session.send(lambda c: reconcile(c, handlers, options.queues))
        if self.limited:
            session.send(lambda c: admin.record_limits(c, self.limited,
                                                       unlimited(handlers, self.plain)))

    def took(self, job: model.Job, seconds: float) -> None:
        self.sizer.took(job.queue, seconds)
        if self.spans is not None:
            self.spans.took(job, seconds)

    def claim(self, size: int, free: int | None = None) -> Claim:
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
        return Claim(self.plain, size, self.options.lease, limited,
                           take=min(size, slots))

    def remaining(self) -> float | None:
        deadline = self.options.deadline
        return None if deadline is None else deadline - clock.monotonic()

    def next_size(self, ahead: int = 0) -> tuple[int, str]:
        """The next claim's size, or 0 and why the drain stops instead; `ahead`: jobs
        held that run first (a refill's: those its batch still runs or waits to)."""
        if self.stop.is_set():
            return 0, "signal"
        size = self.sizer.fits(self.remaining(), ahead)
        return (size, "empty") if size >= 1 else (0, "deadline")

    def may_start(self, job: model.Job) -> bool:
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
        jobs = self.take(spec) if size else []
        if jobs and on_claim:
            on_claim()
        while jobs:
            jobs, size, sent = self.batch(jobs, size, sent)

    def batch(self, jobs: list[model.Job], size: int, sent: float
              ) -> tuple[list[model.Job], int, float]:
        """Run one batch, refilled while a full claim's jobs keep coming, and write it
        back with the next claim: the jobs that claim took, its size and when it was
        sent."""
        self.known = {job.token: job for job in jobs}  # the batch's, its refills' too
        self.mark = clock.monotonic()
        # Only handlers that run alongside this thread leave it free to refill.
        refilled = self.runner.alongside and self.sizer.refills(
            size, len(jobs), limited=bool(self.limited))
        running = Batch(
            jobs, self.tasks, concurrency=self.options.concurrency, lease=self.options.lease,
            extend=lambda js: self.session.send(
                lambda c: writeback.extend_claims(c, js, self.options.lease,
                                              now=clock.database_now())),
            extend_cancelled=lambda js: self.session.send(lambda c: writeback.extend_cancelled(
                c, js, self.options.lease, now=clock.database_now())),
            may_start=self.may_start, stop=self.stop, confirmed=sent,
            # Handlers' times serve the deadline's judgement and tracing only.
            took=(self.took if self.options.deadline is not None or self.spans is not None
                  else None),
            tracebacks=self.options.verbose,
            refill=self.refill if refilled else None,
            refill_at=max(1, self.options.concurrency // 4) if self.limited else 0,
            refill_lead=(lambda: 0) if self.limited else self.sizer.lead,
            pace=self.pace, codecs=db.codecs(self.session.conn), runner=self.runner)
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
            left_running(outcome.abandoned, running.core.freshness.confirmed, running.lease)
        sent = clock.monotonic()
        try:
            claimed = self.written(outcome, self.claim(size) if size else None,
                                   list(self.known.values()))
        except stopping.Unanswered:
            left_unwritten(outcome)
            raise
        if running.core.failure is not None:
            raise running.core.failure
        return claimed, size, sent

    def refill(self, part: Outcome, land: Land, free: int) -> bool:
        """A running batch's refill (see Batch): write back what finished, with a claim
        of the next batch's size (limited queues: no more than the `free` handler
        slots) whose jobs join the batch; it may refill again as `Sizer.refills` says."""
        now = clock.monotonic()
        self.sizer.observe(len(part.succeeded) + len(part.failed), now - self.mark, full=True)
        self.mark = now
        size, self.summary.stopped = self.next_size(self.options.concurrency - free)
        ended = [*part.succeeded, *(job for job, _ in part.failed)]
        lost = [self.known[t] for t in part.lost if t in self.known]

        def joined(jobs: list[model.Job]) -> None:
            self.known.update((job.token, job) for job in jobs)
            land(jobs)

        # Written back: a batch refilled for hours holds only its live jobs. A lost job
        # stays, for the span its handler's end still owes (tracing).
        for job in ended:
            self.known.pop(job.token, None)
        claimed = self.written(part, self.claim(size, free) if size else None,
                               [*ended, *lost], joined)
        return self.sizer.refills(size, len(claimed), limited=bool(self.limited),
                                  refilling=True)

    def take(self, spec: Claim) -> list[model.Job]:
        """The jobs of a claim sent on its own."""
        jobs = self.session.send(lambda c: roundtrip.claim(
            c, spec.queues, spec.size, spec.lease, limited=spec.limited, take=spec.take,
            now=clock.database_now()))
        self.summary.took(len(jobs), spec)
        return jobs

    def written(self, outcome: Outcome, claim_next: Claim | None,
                jobs: list[model.Job], land: Land | None = None) -> list[model.Job]:
        """Write `outcome` back and claim `claim_next`, in one round trip unless the
        session says otherwise (Session.one_trip); the jobs claimed."""
        if self.session.one_trip:
            return self.write_back(outcome, claim_next, jobs, land).claimed
        self.write_back(outcome, None, jobs)
        claimed = self.take(claim_next) if claim_next is not None else []
        if land is not None:
            land(claimed)
        return claimed

    def write_back(self, outcome: Outcome, claim_next: Claim | None,
                   jobs: list[model.Job], land: Land | None = None) -> model.Settled:
        """Write `outcome` back with `claim_next`, and count, log, trace and tell the
        hooks of it; `jobs`: those it may hold. `land(claimed)` comes first: a refill's
        jobs join their batch before anything here may fail or wait."""
        sent = clock.monotonic()
        settled = settle(self.session, outcome, claim_next, self.db_now)
        self.sizer.tripped(clock.monotonic() - sent)  # the round trip alone: no hooks
        if claim_next is not None:
            self.summary.took(len(settled.claimed), claim_next)
        if land is not None:
            land(settled.claimed)
        record(settled, outcome, self.summary)
        ended = ended_lost(settled, outcome)
        if ended:  # rare: only jobs cancelled, or taken over, while ours
            self.session.send(lambda c: writeback.end_cancelled(c, ended, now=clock.database_now()))
        log_failures(settled, outcome)
        if self.spans is not None:
            self.spans.batch(jobs, settled, outcome)
        if self.upkeep:
            hooks.run(hooks.calls(settled, outcome.failed, self.own_hooks),
                      timeout=self.stop.left() if isinstance(self.stop, stopping.Stop) else None)
        if self.on_batch:
            self.on_batch(self.summary)
        return settled

    def end(self) -> None:
        """Archive, and learn when more work is due."""
        options, summary = self.options, self.summary
        # After a second stop, the next run archives.
        if self.upkeep and not stopping.hurried(self.stop):
            summary.archived = self.session.send(lambda c: admin.archive(
                c, options.archive_after, failed_older_than=options.archive_failed_after,
                to_table=self.has_archive, now=clock.database_now()))
        due = self.session.send(lambda c: admin.due(
            c, self.plain, limited=self.limited, now=clock.database_now(),
            known=list(self.tasks)))
        summary.next_due, summary.next_run_at, summary.next_lease_end, summary.ended_at = (
            due.next_due, due.run_at, due.lease_end, due.now)
        summary.no_task = due.no_task
        warn_no_task(due.no_task)
        if self.left_out and summary.stopped == "empty" and due.next_due is not None \
                and due.next_due <= due.now:
            # Something is due now, but is it a left-out queue's job that may start?
            # Not a plain queue's (an expired lease to reap, a job enqueued since the
            # last claim), nor a running job's lease end of a left-out queue.
            left = self.session.send(lambda c: admin.due(c, [], limited=self.left_out,
                                                         now=clock.database_now()))
            if left.run_at is not None and left.run_at <= left.now:
                summary.stopped = "deadline"  # ready jobs left out: the deadline stopped them


def check_results(conn: psycopg.Connection, tasks: list[Task]) -> None:
    """ConfigError before any claim when a task keeps results the table cannot hold."""
    keeping = sorted(t.queue for t in tasks if t.keep_result)
    if keeping and not admin.has_results(conn):
        raise ConfigError(f"the task of queue {', '.join(map(repr, keeping))} keeps results "
                          "(keep_result=True), but the jobs table has no result column: run "
                          "`drainer migrate` to add it")


def reconcile(conn: psycopg.Connection, handlers: Mapping[str, Handler],
               queues: list[str]) -> "DatabaseClock | None":
    """Bring the drained queues' schedules in line with the declared ones, once the
    start told whether the schema has schedules; the database clock it read then.
    Only a queue whose handler is a registered task (its module loaded) may lose a
    schedule its module no longer declares."""
    declared = [s for s in schedules.declared().values() if s.queue in queues]
    if not admin.has_schedules(conn):
        if declared:
            raise ConfigError(f"schedule {declared[0].name!r}: the database has no schedules "
                              "table: run `drainer migrate` to add it")
        return None
    if not declared and not admin.has_schedules(conn, stored=True):
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


def split(tasks: Mapping[str, Task], queues: list[str]) -> tuple[list[str], list[Limits]]:
    """The drained queues without limits, and the limits of the others."""
    limited = [tasks[q].limits for q in queues if tasks[q].limits.any]
    return [q for q in queues if not tasks[q].limits.any], limited


def unlimited(handlers: Mapping[str, Handler], plain: list[str]) -> list[str]:
    """The queues without limits whose handler is a registered task (its module loaded):
    any limits recorded for them are gone from the code."""
    registered = tasks_.registered()
    return [q for q in plain if registered.get(q) is handlers[q]]


def settle(session: Session, outcome: Outcome, claim_next: Claim | None,
            db_now: DatabaseClock | None) -> model.Settled:
    """Write a batch back with the next claim in one round trip (and what comes after
    the slots of schedules that ran). If the session drops, the results (guarded, so
    harmless if they had landed) and the claim go again on a new connection, but not
    the release: it lowers attempts, and had it landed, another worker may hold those
    jobs now. They are left to their lease."""
    ran = [*outcome.succeeded, *(job for job, _ in outcome.failed)]
    slots = None if db_now is None else (
        lambda c: schedules.after_run(c, ran, db_now.now()))
    return session.send(
        lambda c: roundtrip.settle(c, outcome.succeeded, outcome.failed, outcome.unstarted,
                                   results=outcome.results, claim_next=claim_next,
                                   same_transaction=slots, now=clock.database_now()),
        lambda c: writeback.settle_again(c, outcome.succeeded, outcome.failed,
                                         results=outcome.results, claim_next=claim_next,
                                         same_transaction=slots, now=clock.database_now()))
