"""Running the handlers of one claimed batch, outside any transaction.

The batch has up to `concurrency` slots, each running one job at a time (`slots`,
on the threads its runner gives them, `runners`), while the calling thread keeps the
leases alive and watches the deadline, the stop signal and the tasks' timeouts.
Handlers that end within microseconds get few slots (`core.Pace`): a slot's thread
hand-off would cost more than their work. A handler past its task's timeout is
failed and its slot written off (an async one is cancelled); a fresh slot takes its
place, so the batch goes on. What the batch holds, and what each event changes in
it, is `core`'s; this module is the loop that waits, sends and spawns.
"""

import functools
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta

from .. import clock, stopping
from ..errors import DrainerError
from ..model import Job, Token
from ..tasks import Handler, as_task
from .calls import Calls
from .core import CANCEL_CHECK, Core, Freshness, Pace
from .outcome import Outcome, Refill
from .runners import THREADS, Runner
from .slots import Slots

log = logging.getLogger("drainer.batch")  # the name its log lines always had

# Heartbeats come every third of the lease, and at least this often (seconds), so a
# session idle limit of a minute or more (a pooler's, a proxy's, a NAT gateway's 350 s)
# never sees the drain's connection idle while handlers run.
MAX_HEARTBEAT = 60.0


class Batch:
    """One batch's handlers; `run()` returns when every handler has finished,
    or when a stop leaves only handlers that outlived the wait bound. With `refill`,
    the batch goes on: once its last rounds of jobs have started, what finished is
    written back and more jobs are claimed, on a pool thread, while the others run,
    so its slots do not wait for a write-back and a claim between batches. A refill
    that fails ends the batch as a stop would (nothing more starts; what never started
    is given back by the last write-back), and `core.failure` holds its error."""

    def __init__(
        self,
        jobs: Sequence[Job],
        handlers: Mapping[str, Handler],
        *,
        concurrency: int,
        lease: timedelta,
        extend: Callable[[list[Job]], set[Token]],
        may_start: Callable[[Job], bool],
        stop: threading.Event,
        confirmed: float | None = None,
        took: Callable[[Job, float], None] | None = None,
        tracebacks: bool = False,
        refill: Refill | None = None,
        refill_at: int = 0,
        refill_lead: Callable[[], int] = lambda: 0,
        pace: Pace | None = None,
        extend_cancelled: Callable[[list[Job]], object] | None = None,
        codecs: Sequence[str] = (),
        runner: Runner = THREADS,
    ):
        """`confirmed`: when the batch's leases were last known to be ours, on the clock
        seam's monotonic scale (when the claim was sent; default now). `took(job,
        seconds)` hears how long each handler ran. `tracebacks`: keep each raised
        exception's traceback in the outcome (`--verbose`; formatting costs).
        `refill_at`: a refill also waits until that many handler slots are free (a
        drain with limited queues, whose claims take no more jobs than free slots).
        `refill_lead()`: a refill is asked for once no more than that many jobs wait
        (at least the last two rounds); read again after each refill.
        `pace`: the handlers' times so far, which this batch's add to (a drain's
        batches share one). `extend_cancelled(jobs)`: the heartbeat of jobs found no
        longer ours whose handler still runs (cancelled: they keep their places until it
        ends).
        `codecs`: what a kept result's text must encode to (db.codecs). `runner`:
        where the handlers run (`runners`)."""
        tasks = {q: as_task(q, h) for q, h in handlers.items()}
        self.lease = lease.total_seconds()
        freshness = Freshness(self.lease, confirmed)
        self.calls = Calls(tasks, freshness.fresh, tracebacks=tracebacks, codecs=codecs)
        self.core = Core(jobs, tasks, concurrency=concurrency, freshness=freshness,
                         may_start=may_start, stop=stop, took=took, refill=refill,
                         refill_at=refill_at, pace=pace, async_queues=self.calls.async_queues,
                         refill_lead=refill_lead)
        self.slots = Slots(self.core, self.calls, runner, self._heartbeat)
        self.extend, self.extend_cancelled, self.stop = extend, extend_cancelled, stop

    def _heartbeat(self) -> bool:
        """Extend the leases of every unfinished job, and of the finished ones still to
        be written back, and drop the unfinished ones no longer ours (a finished one's
        guarded write-back tells); False when the heartbeat could not be sent (the
        leases stand as they were)."""
        sent, sent_wall = clock.monotonic(), clock.wall()
        unfinished, waiting, landings = self.core.to_extend()
        try:
            ours = self.extend([*unfinished, *waiting]) if unfinished or waiting else set()
        except DrainerError as exc:
            log.warning("heartbeat failed (%s); leases not extended", exc)
            return False
        lost = self.core.extended(unfinished, ours, landings, sent, sent_wall)
        for job in lost:  # their handlers may stop: nothing they do now changes anything
            self.slots.write_off(job)
        if lost and self.extend_cancelled is not None:
            try:
                self.extend_cancelled(lost)
            except DrainerError as exc:
                log.warning("heartbeat of cancelled jobs failed (%s)", exc)
        return True

    def _interval(self, steady: float) -> float:
        """Seconds between heartbeats: `steady`, or CANCEL_CHECK at most while a running
        job's handler watches its `cancelled` (one not yet found lost)."""
        return min(steady, CANCEL_CHECK) if self.core.watched() else steady

    def _refill(self, refill: Refill, part: Outcome, free: int) -> None:
        """On a pool thread: write `part` back and claim more, while run()'s thread goes
        on with heartbeats, timeouts and the stop, and opens slots for what comes."""
        refills = self.core.refills
        more, failure = False, None
        with self.core.lock:
            before = refills.landings
        try:
            more = refill(part, functools.partial(refills.land, clock.monotonic()), free)
        except BaseException as exc:  # noqa: BLE001 - run() ends the batch, the caller raises
            failure = exc
        finally:
            refills.ended(more, before, failure)

    def _time_out(self, now: float) -> None:
        """Fail the jobs whose handlers outlived their task's timeout, and hand each
        stuck slot's place to a fresh one."""
        for job in self.core.late(now):
            self.slots.write_off(job)
            self.slots.open()

    def run(self) -> Outcome:
        try:
            return self._run_all()
        except BaseException:
            self.core.close()  # the batch is over: what the handlers do now changes nothing
            raise

    def _run_all(self) -> Outcome:
        core = self.core
        with core.lock:
            opened = core.top_up()
        if not opened:
            core.wake.set()  # nothing may start: no slot's leaving will say so
        for _ in range(opened):
            self.slots.carry_on()
        interval = min(self.lease / 3, MAX_HEARTBEAT)
        extended = core.freshness.confirmed
        stopped_at: float | None = None
        while True:
            # Slots withheld from waiting jobs: look again after WORK seconds (a timed
            # wait runs on the real clock, even under a test's frozen one).
            polled, ended = core.withheld, core.timing.ended
            # After a stop, a second one is looked at often: it does not wake the batch.
            idle = min(interval, 0.5 if stopped_at is None else stopping.POLL)
            woken = core.wake.wait(timeout=Pace.WORK if polled else idle)
            now = clock.monotonic()
            beat = now - max(extended, core.freshness.confirmed) >= self._interval(interval)
            with core.lock:
                core.wake.clear()
                refill = core.refills.due()
                # Every waiting job gets a slot when no handler ended while WORK passed,
                # or before a heartbeat holds this thread for its round trip.
                opened = core.top_up(blocked=beat or (
                    polled and not woken and core.timing.ended == ended))
                if not core.active and core.refills.done.is_set():
                    break  # a refill out may bring jobs: wait for it
            if refill is not None:
                clock.spawn(functools.partial(self._refill, *refill))
            for _ in range(opened):
                self.slots.carry_on()
            self._time_out(now)
            if beat:
                self._heartbeat()
                extended = now
            if (self.stop.is_set() or core.failure is not None) and stopped_at is None:
                stopped_at = now
            # After a stop, running handlers get at most one lease to finish; none after
            # a second stop.
            if stopped_at is not None and (now - stopped_at >= self.lease
                                           or stopping.hurried(self.stop)):
                break
        # What a refill out claims is given back with the rest (a second stop waits for
        # it no longer than for the last write-back).
        core.refills.done.wait(self.stop.left() if isinstance(self.stop, stopping.Stop)
                               else None)
        outcome = core.end()
        for job in outcome.abandoned:
            self.slots.write_off(job)  # past the stop's bound: what it does now changes nothing
        return outcome
