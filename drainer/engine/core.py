"""A batch's state and the decisions it makes, without I/O: which job starts next,
how many slots to open, what a handler's end, a timeout, a heartbeat's answer or a
refill's jobs change, when a refill is due, and what is left at the end. It calls no
handler, starts no thread and sends nothing: the slots (`slots`) and the batch's run
loop (`batch`) do, as it answers. Its times come from the clock seam.

Per-job state is keyed by the claim's token, (id, attempts): a refill may claim
again a job the batch ran before (a retry whose backoff ended meanwhile).
"""

import asyncio
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import clock
from ..errors import describe
from ..model import Job, Token
from ..tasks import Task
from .outcome import Ended, Outcome, Refill

# While a running job's handler has looked at `job.cancelled`, heartbeats come at least
# this often (seconds): the heartbeat is what finds a job cancelled or taken over, and a
# handler that watches for it should not go on for a third of the lease in vain.
# Batches whose handlers never look keep the slower pace.
CANCEL_CHECK = 5.0
# A job starts only while the lease its batch last confirmed (the claim, a heartbeat)
# is younger than this share of the lease; past it, a heartbeat confirms first. A
# worker paused past its lease (SIGSTOP, a long GC pause, a sleeping laptop) must not
# start a job that was reaped and may be running elsewhere. It is looked at on the
# handler's own thread right before the call: a job may wait for its thread, or for
# the event loop, longer than the lease.
CONFIRM_AFTER = 0.5
# One handler in this many is timed for the handlers' pace (Pace), the first included:
# a clock read for every job costs a drain of no-op jobs a percent.
PACE_SAMPLE = 16


class Pace:
    """How long the drain's handlers run, smoothed, for how many slots a batch opens:
    one for every WORK seconds its jobs are expected to take, all of them while that
    is unknown, or as soon as WORK seconds pass without a handler ending (jobs waiting
    behind one that runs long get slots of their own). Each slot is a thread's
    hand-off, tens of microseconds: fifty slots for fifty handlers of a few
    microseconds cost the batch more than the handlers themselves, and a GIL does not
    run them at once anyway."""

    WORK = 0.001  # seconds of handlers' work that pay for one more slot

    def __init__(self) -> None:
        self.seconds: float | None = None

    def ran(self, seconds: float) -> None:
        if seconds <= 0:  # a clock frozen (a test's) or too coarse to tell: learn nothing
            return
        self.seconds = seconds if self.seconds is None else 0.8 * self.seconds + 0.2 * seconds

    def slots(self, jobs: int, blocked: bool) -> int:
        """The slots worth opening for `jobs` unfinished jobs; `blocked`: no handler
        ended for WORK seconds while jobs waited."""
        if blocked or self.seconds is None or self.seconds >= self.WORK:
            return jobs
        return max(1, math.ceil(jobs * self.seconds / self.WORK))


class Timing:
    """A batch's part in the pace: which of its running handlers are timed (one in
    PACE_SAMPLE, chosen as they start: as they end, the first would be the fastest),
    and how many ended, for the run loop to see that none did."""

    def __init__(self, pace: Pace) -> None:
        self.pace = pace
        self.started = 0
        self.ended = 0
        self.timed: set[Token] = set()

    def start(self, token: Token) -> None:
        self.started += 1
        if self.started % PACE_SAMPLE == 1:
            self.timed.add(token)

    def end(self, token: Token, began: float) -> None:
        self.ended += 1
        if self.timed and token in self.timed:
            self.timed.discard(token)
            self.pace.ran(clock.monotonic() - began)

    def drop(self, token: Token) -> None:
        """A handler written off (timed out): its time says nothing of the pace."""
        self.timed.discard(token)


class Freshness:
    """When the batch's leases were last known to be ours, on the monotonic clock and
    the wall clock, which goes on while the machine sleeps (the monotonic clock stops
    then, on Linux and macOS); a job starts only while both say it is recent."""

    def __init__(self, lease: float, confirmed: float | None) -> None:
        self.fresh_for = CONFIRM_AFTER * lease  # seconds a confirmation lets jobs start
        self.confirmed = clock.monotonic() if confirmed is None else confirmed
        self.wall = clock.wall() - (clock.monotonic() - self.confirmed)

    def fresh(self) -> bool:
        """Whether the leases were confirmed recently enough to start a job, by both
        clocks: a wall clock set back or forward only costs a heartbeat."""
        return (clock.monotonic() - self.confirmed < self.fresh_for
                and abs(clock.wall() - self.wall) < self.fresh_for)

    def confirm(self, sent: float, sent_wall: float) -> None:
        self.confirmed, self.wall = sent, sent_wall

    def back_to(self, sent: float) -> None:
        """Jobs confirmed at `sent` joined: the confirmation goes back to then if later."""
        if sent < self.confirmed:
            self.wall -= self.confirmed - sent
            self.confirmed = sent


class Core:
    """One batch's jobs (pending, running, finished, lost, timed out), its slots'
    count, its refills and its leases' freshness. Its methods take `lock` themselves
    unless they say the caller holds it."""

    def __init__(self, jobs: Sequence[Job], tasks: Mapping[str, Task], *, concurrency: int,
                 freshness: Freshness, may_start: Callable[[Job], bool],
                 stop: threading.Event, took: Callable[[Job, float], None] | None,
                 refill: Refill | None, refill_at: int, pace: Pace | None,
                 async_queues: set[str], refill_lead: Callable[[], int] = lambda: 0) -> None:
        self.pending = deque(jobs)
        self.tasks = tasks
        self.cap = concurrency  # jobs in flight at most
        self.pace = pace or Pace()
        self.timing = Timing(self.pace)
        self.withheld = False  # slots left unopened for jobs waiting (Pace)
        self.freshness = freshness
        self.may_start, self.stop, self.took = may_start, stop, took
        self.async_queues = async_queues  # their jobs may start where nothing may block
        self.unconfirmable = False
        self.closed = False  # set when the batch ends: written-off handlers change nothing
        self.running: dict[Token, Job] = {}
        self.started: dict[Token, float] = {}  # when each handler began
        self.timed_out: set[Token] = set()
        self.futures: dict[Token, asyncio.Task[Any]] = {}  # async handlers' tasks
        self.outcome = Outcome()
        self.lock = threading.Lock()
        self.wake = clock.event()  # set when no slot is left, or a refill is due
        self.active = 0
        self.refills = Refills(self, refill, refill_at, refill_lead)
        self.failure: BaseException | None = None  # a refill's error
        # Claims found taken over in the batch's whole run; each is in the outcome of
        # one write-back only.
        self.lost: set[Token] = set()

    def startable(self) -> Job | None:
        """The pending job that may start next; the caller holds the lock. None once the
        leases cannot be confirmed: what is left pending is given back."""
        if (self.pending and not self.closed and self.failure is None
                and not self.unconfirmable and self.may_start(self.pending[0])):
            return self.pending[0]
        return None

    def take(self, without_blocking: bool = False) -> Job | None:
        """The next job, now running, if it may start; `without_blocking`: only one whose
        handler is an `async def` (calling it just makes a coroutine), for a thread that
        must not block. Whether its lease is fresh is looked at as its handler starts, on
        the handler's own thread: a thread may stall for seconds between here and
        there. The batch's last round starting asks for a refill."""
        with self.lock:
            job = self.startable()
            if job is None or (without_blocking and job.queue not in self.async_queues):
                return None
            self.pending.popleft()
            self.running[job.token] = job
            self.started[job.token] = clock.monotonic()
            self.timing.start(job.token)
            refills = self.refills
            if refills.fn is not None and not refills.asked and self.last_rounds():
                refills.asked = True
                self.wake.set()
            return job

    def waiting(self) -> bool:
        """Whether a job is left that may start."""
        with self.lock:
            return self.startable() is not None

    def put_back(self, job: Job) -> bool:
        """A job taken whose lease was found stale as its handler was about to start: it
        did not start, and waits again at the head of the batch for a heartbeat to
        confirm it (one found lost meanwhile never starts). False when its slot was
        written off meanwhile (a timeout, the batch's end), as `finish`."""
        with self.lock:
            self.futures.pop(job.token, None)
            if job.token in self.timed_out or self.closed:
                return False
            del self.running[job.token], self.started[job.token]
            self.timing.drop(job.token)
            if job.token in self.lost:
                self.outcome.ended_lost.append(job)
            else:
                self.pending.appendleft(job)
            return True

    def finish(self, job: Job, ended: Ended) -> bool:
        """Record a handler's result; False when it came after the job's timeout (its
        slot has gone to another) or after the batch ended: it changes nothing."""
        with self.lock:
            if job.token in self.timed_out or self.closed:
                return False
            self.running.pop(job.token, None)
            began = self.started.pop(job.token)
            self.timing.end(job.token, began)
            refills = self.refills
            if (refills.at and refills.asked and refills.done.is_set()
                    and not self.wake.is_set() and self.free() >= refills.at):
                self.wake.set()  # enough slots are free for the refill asked for
            if self.took:
                self.took(job, clock.monotonic() - began)
            if job.token in self.lost:
                self.outcome.ended_lost.append(job)
                return True  # no longer ours: its result must change nothing
            setback, kept, traced = ended
            if setback is None:
                self.outcome.succeeded.append(job)
                if kept is not None:
                    self.outcome.results[job.token] = kept
                return True
            self.outcome.failed.append((job, setback))
            if traced is not None:
                self.outcome.tracebacks[job.token] = traced
            return True

    def leave(self) -> None:
        """A slot ends: no job is left that it may start."""
        with self.lock:
            self.active -= 1
            if not self.active:
                self.wake.set()

    def unrun(self, job: Job, future: "asyncio.Task[Any]") -> bool:
        """An async job's task began: note it (a write-off cancels it); whether the job
        was written off before it began."""
        with self.lock:
            self.futures[job.token] = future
            return self.closed or job.token in self.timed_out or job.token in self.lost

    def late(self, now: float) -> list[Job]:
        """The jobs whose handlers outlived their task's timeout, failed now: their
        slots are to be written off and replaced."""
        with self.lock:
            late = [(job, limit) for job in self.running.values()
                    if (limit := self.tasks[job.queue].timeout) is not None
                    and now - self.started[job.token] >= limit]
            for job, limit in late:
                del self.running[job.token], self.started[job.token]
                self.timing.drop(job.token)
                self.timed_out.add(job.token)
                if self.took:
                    self.took(job, limit)
                if job.token not in self.lost:
                    late_error = TimeoutError(f"the handler ran longer than its {limit:g} s "
                                              "timeout and was abandoned")
                    self.outcome.failed.append((job, self.tasks[job.queue].policy.judge(
                        job, late_error, describe(late_error))))
        return [job for job, _ in late]

    def to_extend(self) -> tuple[list[Job], list[Job], int]:
        """A heartbeat's jobs: the unfinished ones, and the finished ones still to be
        written back (a reaper must not take a job back while its result waits for its
        batch's slowest handler); and the refills landed so far."""
        with self.lock:
            unfinished = [*self.running.values(), *self.pending]
            waiting = [*self.outcome.succeeded, *(job for job, _ in self.outcome.failed)]
            return unfinished, waiting, self.refills.landings

    def extended(self, unfinished: list[Job], ours: set[Token], landings: int,
                 sent: float, sent_wall: float) -> list[Job]:
        """A heartbeat sent at `sent` answered that `ours` are still ours: drop the
        unfinished jobs that are not; the running ones among them, to write off."""
        with self.lock:
            gone = {j.token for j in unfinished if j.token not in ours}
            # A job that finished meanwhile keeps its result: its guarded write-back
            # tells whether it was still ours, and it is counted once, there.
            found = (gone & (self.running.keys() | {j.token for j in self.pending})) - self.lost
            self.lost |= found
            self.outcome.lost |= found
            self.outcome.ended_lost += (j for j in self.pending if j.token in gone)
            self.pending = deque(j for j in self.pending if j.token not in gone)
            if self.refills.landings == landings:  # else jobs it did not carry joined meanwhile
                self.freshness.confirm(sent, sent_wall)
            return [job for job in self.running.values() if job.token in self.lost]

    def watched(self) -> bool:
        """Whether a running job's handler watches its `cancelled` (one not yet lost)."""
        with self.lock:
            return any(job.cancel_watched for job in self.running.values()
                       if job.token not in self.lost)

    def finished(self) -> Outcome:
        """What finished since the last refill (the caller holds the lock), taken out
        of the outcome: each result is written back once."""
        part, self.outcome = self.outcome, Outcome()
        return part

    def last_rounds(self) -> bool:
        """Whether the batch's last two rounds of jobs have started, or fewer jobs wait
        than the refill's lead, when it asks for a refill; the caller holds the lock."""
        return len(self.pending) <= max(2 * self.cap, self.refills.lead)

    def free(self) -> int:
        """Handler slots no running or pending job holds; the caller holds the lock."""
        return self.cap - len(self.running) - len(self.pending)

    def top_up(self, blocked: bool = False) -> int:
        """Open slots for startable jobs no slot will take (the batch's first, a
        refill's, some that came as a slot was leaving), as many as their pace is
        worth, or every one they may have (`blocked`: see Pace); the caller holds the
        lock. How many it opened."""
        self.withheld = False
        if self.startable() is None:
            return 0
        jobs = len(self.running) + len(self.pending)
        room = min(self.cap, jobs) - self.active
        opened = max(0, min(room, self.pace.slots(jobs, blocked) - self.active,
                            len(self.pending)))
        self.active += opened
        self.withheld = opened < min(room, len(self.pending))
        return opened

    def end(self) -> Outcome:
        """The batch is over: what finished, what never started and what still runs
        (abandoned; one already lost is counted lost)."""
        with self.lock:
            unstarted = list(self.pending)
            abandoned = [job for job in self.running.values() if job.token not in self.lost]
            self.closed = True
            self.pending.clear()
            outcome = self.finished()
        outcome.unstarted, outcome.abandoned = unstarted, abandoned
        return outcome

    def close(self) -> None:
        """The batch is over: what the handlers do now changes nothing."""
        with self.lock:
            self.closed = True

class Refills:
    """A batch's refills: the one to send (`fn`, None once the batch may refill no
    more), whether one is asked for, whether one is out, and the jobs they landed."""

    def __init__(self, core: Core, fn: Refill | None, at: int, lead: Callable[[], int]
                 ) -> None:
        self.core, self.fn = core, fn
        self.at = at  # free slots a refill waits for (limited queues)
        # Jobs still to start when a refill is asked for, at most, if more than two
        # rounds: about a round trip's worth of fast handlers, so that the next jobs
        # come as these run out rather than after (Sizer.lead). Read again as each
        # refill comes back, with the times it measured.
        self.read_lead = lead
        self.lead = lead()
        self.asked = False
        self.done = clock.event()  # clear while a refill's round trip is out
        self.done.set()
        self.landings = 0  # refills that brought jobs (see Core.extended, ended)
        # The last refill brought no job: the next one waits for a result to write back
        # (else it would be sent again at once, for nothing, while slots are free).
        self.idle = False

    def due(self) -> tuple[Refill, Outcome, int] | None:
        """The refill to send now, with what finished (taken out of the outcome) and the
        free handler slots, when one was asked for, none is out and enough slots are
        free (or, with a lead, no more jobs wait than it); the caller holds the core's
        lock. Until a refill's jobs land, slots only free up: a claim of no more than the
        free slots never leaves a job waiting."""
        core = self.core
        if (self.fn is None or not self.asked or core.closed or core.stop.is_set()
                or core.failure is not None or not self.done.is_set()
                or core.free() < self.at - self.lead
                or (self.idle and not (core.outcome.succeeded or core.outcome.failed))):
            return None
        self.done.clear()
        return self.fn, core.finished(), core.free()

    def ended(self, more: bool, before: int, failure: BaseException | None) -> None:
        """A refill sent when `before` refills had landed came back: `more`, whether the
        batch may refill again, or the `failure` that ends the batch."""
        core = self.core
        lead = self.read_lead()
        with core.lock:
            self.lead = lead
            if failure is not None:
                core.failure = failure
            # The jobs taken while it was out (its own among them) asked for none: as
            # the last of them would have, ask for the next once its last rounds run.
            self.asked = more and core.last_rounds()
            self.idle = more and self.landings == before
            if not more:
                self.fn = None
        self.done.set()
        core.wake.set()

    def land(self, sent: float, jobs: list[Job]) -> None:
        """A refill's claimed jobs join the batch. Their leases were confirmed when the
        claim was sent, not at a later heartbeat that did not carry them: the batch's
        confirmation goes back to then if it is later."""
        if not jobs:
            return
        core = self.core
        with core.lock:
            core.pending.extend(jobs)
            self.landings += 1
            core.freshness.back_to(sent)
        core.wake.set()
