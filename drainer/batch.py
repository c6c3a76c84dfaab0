"""Running the handlers of one claimed batch, outside any transaction.

The batch has up to `concurrency` slots, each running one job at a time, while the
calling thread keeps the leases alive and watches the deadline, the stop signal and
the tasks' timeouts. Handlers that end within microseconds get few slots (`Pace`): a
slot's thread hand-off would cost more than their work. A sync handler runs on a
daemon thread of the pool; an `async def` one runs on the process's event loop and
holds no thread while it waits: its task records it and starts the slot's next job.
Daemon threads, because a handler that never returns must not keep the process from
exiting: its lease runs out and the next run's reaper takes the job back. A handler
past its task's timeout is failed and its slot written off (an async one is
cancelled); a fresh slot takes its place, so the batch goes on. The threads, the loop
and the waits come from `drainer.clock` (its pool keeps threads for the next batch).
"""

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import threading
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple, cast

from . import clock, db, stopping
from .errors import DrainerError, redact
from .model import Job, Setback, Token, Undecodable
from .storage.enqueue import encode_payload
from .tasks import Handler, Task, as_task

log = logging.getLogger(__name__)

MAX_ERROR = 2000  # characters of last_error kept per failure
MAX_TRACEBACK = 20_000  # characters of a traceback shown by --verbose
# Heartbeats come every third of the lease, and at least this often (seconds), so a
# session idle limit of a minute or more (a pooler's, a proxy's, a NAT gateway's 350 s)
# never sees the drain's connection idle while handlers run.
MAX_HEARTBEAT = 60.0
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


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


def _close(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine that will never run: no "never awaited" warning."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


def _unawaited(result: object) -> Setback | None:
    """A failure when a handler returned an async generator (an `async def` that
    yields): it is no work drainer can run to an end, and the job must not be marked
    done."""
    if inspect.isasyncgen(result):
        result.aclose().close()  # no "never awaited" warning: the failure says it instead
        return Setback("TypeError: the handler returned an async generator (an `async def` "
                       "with yield); make it return, or return a value")
    return None


def _kept(result: object, codecs: Sequence[str] = ()) -> str | Setback:
    """The return value of a task that keeps results, as JSON text; a value that is
    not JSON, or holds a character the database cannot store (`codecs`: what the text
    must encode to, see db.codecs), fails the job for good (running it again would
    return the same), and only that job: its batch's write-back would fail whole."""
    try:
        text = encode_payload(result)
    except DrainerError as exc:
        return _unkept("TypeError", str(exc).removeprefix("the payload "))
    unfit = db.unfit(text, codecs) if codecs else None
    return text if unfit is None else _unkept("ValueError", unfit)


def _unkept(kind: str, why: str) -> Setback:
    return Setback(f"{kind}: the return value cannot be kept as the job's result "
                   f"(keep_result=True): {why}", "failed")


def describe(exc: BaseException) -> str:
    """`Type: message`, bounded, storable in a text column (no NUL, valid UTF-8) and
    with URL passwords masked.

    It never raises: a handler's exception may have a `__str__` that fails, or a
    message with lone surrogates, and either would otherwise kill the handler thread
    or the statement that records the failure.
    """
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - whatever a broken __str__ raises
        message = "<the exception's message could not be read>"
    # Cut first (messages may be huge), with room left so a URL at the cut is still
    # seen whole by redact (a connection string in a handler's error, say).
    text = f"{type(exc).__name__}: {message}"[: 2 * MAX_ERROR]
    text = text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode()
    return _bounded(redact(text))


def trace(exc: BaseException) -> str:
    """The exception's traceback, for `--verbose` logs only: last_error keeps to
    `describe`'s one bounded line, so the table never holds frames or source lines.
    Printable, URL passwords masked and bounded as `describe` does; cut at its end,
    where a huge message would be, so the frames survive. The first frame, the one
    that caught it (drainer's own), is left out when the handler's frames follow."""
    frames = exc.__traceback__
    if frames is not None and frames.tb_next is not None:
        frames = frames.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, frames)).rstrip()
    except BaseException:  # noqa: BLE001 - never lose the failure for its traceback
        return describe(exc)
    text = text[: MAX_TRACEBACK + MAX_ERROR].replace("\x00", "\\0")
    text = redact(text.encode("utf-8", "backslashreplace").decode())
    return text if len(text) <= MAX_TRACEBACK else text[: MAX_TRACEBACK - 1] + "…"


class Ended(NamedTuple):
    """How one handler's run ended: a setback (None: it returned), its kept result
    (JSON text, for a task that keeps results) and its traceback (`--verbose`)."""

    setback: Setback | None = None
    kept: str | None = None
    traced: str | None = None


RETURNED = Ended()  # a handler that returned, with nothing to keep


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


class _Timing:
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


@dataclass
class Outcome:
    """What became of a batch, before it is written back."""

    succeeded: list[Job] = field(default_factory=list)
    failed: list[tuple[Job, Setback]] = field(default_factory=list)
    results: dict[Token, str] = field(default_factory=dict)  # kept return values, as JSON
    unstarted: list[Job] = field(default_factory=list)
    # Claims (Job.token) found taken over, never recorded above.
    lost: set[Token] = field(default_factory=set)
    # Those of them whose handler has ended since, or never began (see run._ended_lost).
    ended_lost: list[Job] = field(default_factory=list)
    abandoned: list[Job] = field(default_factory=list)  # still running at the bound
    tracebacks: dict[Token, str] = field(default_factory=dict)  # failed claim -> trace()


# A batch's refill: given what finished so far (to be written back), a function that
# hands the batch the jobs claimed to go on with (called as soon as they are, before
# anything that may fail or wait) and how many handler slots are free as it is sent
# (a limited queue's claim takes no more), whether the batch may refill again (not
# when too few were ready, nor at a stop or the deadline).
Land = Callable[[list[Job]], None]
Refill = Callable[[Outcome, Land, int], bool]


class Batch:
    """One batch's handlers; `run()` returns when every handler has finished,
    or when a stop leaves only handlers that outlived the wait bound. With `refill`,
    the batch goes on: once its last rounds of jobs have started, what finished is
    written back and more jobs are claimed, on a pool thread, while the others run,
    so its slots do not wait for a write-back and a claim between batches. A refill
    that fails ends the batch as a stop would (nothing more starts; what never started
    is given back by the last write-back), and `failure` holds its error."""

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
        pace: Pace | None = None,
        hold: Callable[[list[Job]], object] | None = None,
        codecs: Sequence[str] = (),
    ):
        """`confirmed`: when the batch's leases were last known to be ours, on the clock
        seam's monotonic scale (when the claim was sent; default now). `took(job,
        seconds)` hears how long each handler ran. `tracebacks`: keep each raised
        exception's traceback in the outcome (`--verbose`; formatting costs).
        `refill_at`: a refill also waits until that many handler slots are free (a
        drain with limited queues, whose claims take no more jobs than free slots).
        `pace`: the handlers' times so far, which this batch's add to (a drain's
        batches share one). `hold(jobs)`: the heartbeat of jobs found no longer ours
        whose handler still runs (cancelled: their places stay held until it ends).
        `codecs`: what a kept result's text must encode to (db.codecs)."""
        self.pending = deque(jobs)
        self.tasks: dict[str, Task] = {q: as_task(q, h) for q, h in handlers.items()}
        self.cap = concurrency  # jobs in flight at most
        self.pace = pace or Pace()
        self.timing = _Timing(self.pace)
        self.withheld = False  # slots left unopened for jobs waiting (Pace)
        self.lease = lease.total_seconds()
        self.fresh_for = CONFIRM_AFTER * self.lease  # seconds a confirmation lets jobs start
        self.extend = extend
        self.hold = hold
        self.may_start = may_start
        self.stop = stop
        self.confirmed = clock.monotonic() if confirmed is None else confirmed
        # The same moment on the wall clock, which goes on while the machine sleeps
        # (the monotonic clock stops then, on Linux and macOS).
        self.confirmed_wall = clock.wall() - (clock.monotonic() - self.confirmed)
        self.took = took
        self.tracebacks = tracebacks
        self.confirming = threading.Lock()
        self.unconfirmable = False
        self.closed = False  # set when run() returns: written-off handlers change nothing
        # Per-job state is keyed by the claim's token, (id, attempts): a refill may claim
        # again a job the batch ran before (a retry whose backoff ended meanwhile).
        self.running: dict[Token, Job] = {}
        self.started: dict[Token, float] = {}  # when each handler began
        self.timed_out: set[Token] = set()
        self.futures: dict[Token, asyncio.Task[Any]] = {}  # async handlers' tasks
        # The context each async handler's task starts with a copy of: the drain's.
        self.context = contextvars.copy_context()
        # Queues whose handler is an `async def`: a thread that must not block may
        # start their jobs (an awaitable from another function takes a pool thread).
        self.async_queues = {q for q, t in self.tasks.items()
                             if inspect.iscoroutinefunction(t.fn)}
        # Each queue's handler, and whether its lease is looked at as it is called
        # (`_call`): an `async def`'s is looked at as its coroutine starts (`_await`).
        self.calls = {q: (t.fn, q not in self.async_queues) for q, t in self.tasks.items()}
        self.keeping = {q for q, t in self.tasks.items() if t.keep_result}
        self.codecs = codecs
        self.outcome = Outcome()
        self.lock = threading.Lock()
        self.wake = clock.event()  # set when no slot is left, or a refill is due
        self.active = 0
        self.refill = refill
        self.refill_at = refill_at
        self.refill_asked = False
        self.refilled = clock.event()  # clear while a refill's round trip is out
        self.refilled.set()
        self.failure: BaseException | None = None  # a refill's error
        self.landings = 0  # refills that brought jobs (see _heartbeat, _refill)
        # The last refill brought no job: the next one waits for a result to write back
        # (else it would be sent again at once, for nothing, while slots are free).
        self.idle_refill = False
        # Claims found taken over in the batch's whole run; each is in the outcome of
        # one write-back only.
        self.lost: set[Token] = set()

    def _fresh(self) -> bool:
        """Whether the batch's leases were confirmed recently enough to start a job, by
        both clocks: a wall clock set back or forward only costs a heartbeat."""
        return (clock.monotonic() - self.confirmed < self.fresh_for
                and abs(clock.wall() - self.confirmed_wall) < self.fresh_for)

    def _startable(self) -> Job | None:
        """The pending job that may start next; the caller holds the lock. None once the
        leases cannot be confirmed: what is left pending is given back."""
        if (self.pending and not self.closed and self.failure is None
                and not self.unconfirmable and self.may_start(self.pending[0])):
            return self.pending[0]
        return None

    def _take(self, without_blocking: bool = False) -> Job | None:
        """The next job, now running, if it may start; `without_blocking`: only one whose
        handler is an `async def` (calling it just makes a coroutine), for a thread that
        must not block. Whether its lease is fresh is looked at as its handler starts, on
        the handler's own thread (`_call`, `_await`): a thread may stall for seconds
        between here and there. The batch's last round starting asks for a refill."""
        with self.lock:
            job = self._startable()
            if job is None or (without_blocking and job.queue not in self.async_queues):
                return None
            self.pending.popleft()
            self.running[job.token] = job
            self.started[job.token] = clock.monotonic()
            self.timing.start(job.token)
            if self.refill is not None and not self.refill_asked and self._last_rounds():
                self.refill_asked = True
                self.wake.set()
            return job

    def _confirm(self) -> None:
        """Heartbeat before starting a job whose lease may be near its end; one thread
        does it while the others wait for its answer. If it cannot be sent, no job
        starts any more: what is left pending is given back."""
        with self.confirming:
            if not self._fresh() and not self.unconfirmable:
                self.unconfirmable = not self._heartbeat()

    def _put_back(self, job: Job) -> bool:
        """A job taken whose lease was found stale as its handler was about to start: it
        did not start, and waits again at the head of the batch for a heartbeat to
        confirm it (one found lost meanwhile never starts). False when its slot was
        written off meanwhile (a timeout, the batch's end), as `_finish`."""
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

    def _refresh(self) -> None:
        """A slot on a pool thread whose async job was put back (`_await`): confirm the
        leases, which the event loop's thread must not wait for, and go on."""
        self._confirm()
        self._work()

    def _finish(self, job: Job, ended: "Ended") -> bool:
        """Record a handler's result; False when it came after the job's timeout (its
        slot has gone to another) or after the batch ended: it changes nothing."""
        with self.lock:
            if job.token in self.timed_out or self.closed:
                return False
            self.running.pop(job.token, None)
            began = self.started.pop(job.token)
            self.timing.end(job.token, began)
            if (self.refill_at and self.refill_asked and self.refilled.is_set()
                    and not self.wake.is_set() and self._free() >= self.refill_at):
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

    def _slot(self, take: Callable[[], Job | None], end: Callable[[], None]) -> None:
        """Run a slot's jobs one after another, as long as `take` gives one and each
        ends here; `end()` when none is left (not when the slot went on in an async
        handler's callback, nor when it was written off at a timeout)."""
        went_on = False
        try:
            while not went_on and (job := take()) is not None:
                went_on = not self._run(job)
        finally:
            if not went_on:
                end()

    def _work(self) -> None:
        """A slot on a pool thread, which may block: sync handlers, heartbeats."""
        self._slot(self._take, self._leave)

    def _carry_on(self) -> None:
        """A slot on a thread that must not block (the event loop's, or run()'s as it
        opens the slots): async handlers start here, and for a sync one, or a heartbeat
        due before the next job may start, a pool thread takes the slot."""
        self._slot(functools.partial(self._take, True), self._hand_on)

    def _hand_on(self) -> None:
        """A slot's end where nothing may block: a pool thread takes the slot if a job
        is left that may start (a sync handler's, or one waiting for a heartbeat)."""
        with self.lock:
            waiting = self._startable() is not None
        if waiting:
            self._spawn()
        else:
            self._leave()

    def _leave(self) -> None:
        """A slot ends: no job is left that it may start."""
        with self.lock:
            self.active -= 1
            if not self.active:
                self.wake.set()

    def _run(self, job: Job) -> bool:
        """Start the job's handler; True when it ended and was recorded here, or was
        put back unstarted (the slot is free for its next job), False when its work
        went on to the event loop (the slot goes on from there) or its result came too
        late (the slot was written off)."""
        called = self._call(job)
        if isinstance(called, Ended):
            return self._finish(job, called)
        if called is None:  # its lease was stale: confirm it on this pool thread first
            if not self._put_back(job):
                return False
            self._confirm()
            return True
        return self._submit(job, called)

    def _call(self, job: Job) -> "Ended | Awaitable[Any] | None":
        """Call the job's handler: how it ended (what went wrong, None when it
        returned; its kept result; when asked for, the exception's traceback), the
        awaitable it returned, or None when the lease was not fresh right before the
        call (an `async def`'s is looked at as its coroutine starts, in `_await`)."""
        if isinstance(job.payload, Undecodable):
            return Ended(Setback(f"the payload cannot be loaded: {job.payload.reason}"))
        fn, looks = self.calls[job.queue]
        if looks and not self._fresh():
            return None
        try:
            result = fn(job)
            if result is not None and inspect.isawaitable(result):  # an `async def`
                return result
        except BaseException as exc:  # noqa: BLE001 - sys.exit in a handler is a failure too
            return self._raised(job, exc)
        return self._returned(job, result)

    def _submit(self, job: Job, awaitable: Awaitable[Any]) -> bool:
        """Run an async handler's work on the process's event loop, in a task of its
        own with a context of its own (what one job sets in a context variable never
        reaches the next): `_await` records it and carries its slot on. False: the
        slot went on there."""
        work, context = self._await(job, awaitable), self.context.copy()
        if clock.on_loop():
            clock.start_here(work, context)
        else:  # the task copies the context it is sent from: this thread's would leak
            context.run(clock.run_async, work)
        return False

    async def _await(self, job: Job, awaitable: Awaitable[Any]) -> None:
        """An async handler's work, in its task: as it ends, the task records it and
        starts the slot's next job itself, which saves the loop a done-callback's turn
        per job. A write-off (`_write_off`) cancels the task; one that came before the
        task began (a timeout, a loss, the stop's bound) ends it unrun."""
        with self.lock:
            self.futures[job.token] = cast("asyncio.Task[Any]", asyncio.current_task())
            unrun = self.closed or job.token in self.timed_out or job.token in self.lost
        # The task waited its turn past the lease: an `async def`'s has not begun. A
        # plain function that returned this awaitable has (`_call` looked before it).
        if not unrun and not self.calls[job.queue][1] and not self._fresh():
            _close(awaitable)
            if self._put_back(job):
                clock.spawn(self._refresh)
            return
        try:
            if unrun:
                _close(awaitable)
                raise asyncio.CancelledError("written off before it began")
            result = await clock.awaited(awaitable)
        except BaseException as exc:  # noqa: BLE001 - as in _call; CancelledError too
            ended = self._raised(job, exc)
        else:
            ended = self._returned(job, result)
        finally:
            with self.lock:
                self.futures.pop(job.token, None)
        if self._finish(job, ended):
            self._carry_on()

    def _raised(self, job: Job, exc: BaseException) -> "Ended":
        if isinstance(exc, clock.HandlerExit) and exc.__cause__ is not None:
            exc = exc.__cause__  # an async handler's exit: judged and shown as a plain one's
        return Ended(self.tasks[job.queue].policy.judge(job, exc, describe(exc)),
                     traced=trace(exc) if self.tracebacks else None)

    def _returned(self, job: Job, result: object) -> "Ended":
        if result is None and job.queue not in self.keeping:
            return RETURNED  # most handlers: nothing to check, nothing to keep
        unawaited = _unawaited(result)  # work that never ran
        if unawaited is not None or job.queue not in self.keeping:
            return Ended(unawaited)
        kept = _kept(result, self.codecs)
        return Ended(kept) if isinstance(kept, Setback) else Ended(kept=kept)

    def _spawn(self) -> None:
        clock.spawn(self._work)

    def _time_out(self, now: float) -> None:
        """Fail the jobs whose handlers outlived their task's timeout, and hand each
        stuck slot's place to a fresh one."""
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
        for job, _ in late:
            self._write_off(job)
            self._spawn()

    def _write_off(self, job: Job) -> None:
        """Tell a handler whose work no longer counts (timed out, lost, or past the
        stop's bound) to stop: a sync one runs on, but may watch `job.cancelled`; an
        async one really stops (CancelledError at its next await)."""
        job.cancelled.set()
        with self.lock:
            future = self.futures.get(job.token)
        if future is not None:
            clock.cancel(future)

    def _heartbeat(self) -> bool:
        """Extend the leases of every unfinished job, and of the finished ones still to
        be written back (a reaper must not take a job back while its result waits for
        its batch's slowest handler), and drop the unfinished ones no longer ours (a
        finished one's guarded write-back tells); False when the heartbeat could not
        be sent (the leases stand as they were)."""
        sent, sent_wall = clock.monotonic(), clock.wall()
        with self.lock:
            unfinished = [*self.running.values(), *self.pending]
            waiting = [*self.outcome.succeeded, *(job for job, _ in self.outcome.failed)]
            landings = self.landings
        try:
            ours = self.extend([*unfinished, *waiting]) if unfinished or waiting else set()
        except DrainerError as exc:
            log.warning("heartbeat failed (%s); leases not extended", exc)
            return False
        with self.lock:
            gone = {j.token for j in unfinished if j.token not in ours}
            # A job that finished meanwhile keeps its result: its guarded write-back
            # tells whether it was still ours, and it is counted once, there.
            found = (gone & (self.running.keys() | {j.token for j in self.pending})) - self.lost
            self.lost |= found
            self.outcome.lost |= found
            self.outcome.ended_lost += (j for j in self.pending if j.token in gone)
            self.pending = deque(j for j in self.pending if j.token not in gone)
            if self.landings == landings:  # else jobs it did not carry joined meanwhile
                self.confirmed, self.confirmed_wall = sent, sent_wall
            # Their handlers may stop: nothing they do now changes anything.
            lost = [job for job in self.running.values() if job.token in self.lost]
        for job in lost:
            self._write_off(job)
        if lost and self.hold is not None:
            try:
                self.hold(lost)
            except DrainerError as exc:
                log.warning("heartbeat of cancelled jobs failed (%s)", exc)
        return True

    def _interval(self, steady: float) -> float:
        """Seconds between heartbeats: `steady`, or CANCEL_CHECK at most while a running
        job's handler watches its `cancelled` (one not yet found lost)."""
        with self.lock:
            watched = any(job.cancel_watched for job in self.running.values()
                          if job.token not in self.lost)
        return min(steady, CANCEL_CHECK) if watched else steady

    def _finished(self) -> Outcome:
        """What finished since the last refill (the caller holds the lock), taken out
        of the outcome: each result is written back once."""
        part, self.outcome = self.outcome, Outcome()
        return part

    def _last_rounds(self) -> bool:
        """Whether the batch's last two rounds of jobs have started, when it asks for a
        refill; the caller holds the lock."""
        return len(self.pending) <= 2 * self.cap

    def _free(self) -> int:
        """Handler slots no running or pending job holds; the caller holds the lock."""
        return self.cap - len(self.running) - len(self.pending)

    def _refill_due(self) -> tuple[Refill, Outcome, int] | None:
        """The refill to send now, with what finished (taken out of the outcome) and the
        free handler slots, when one was asked for, none is out and enough slots are
        free; the caller holds the lock. Until a refill's jobs land, slots only free
        up: a claim of no more than the free slots never leaves a job waiting."""
        if (self.refill is None or not self.refill_asked or self.closed or self.stop.is_set()
                or self.failure is not None or not self.refilled.is_set()
                or self._free() < self.refill_at
                or (self.idle_refill and not (self.outcome.succeeded or self.outcome.failed))):
            return None
        self.refilled.clear()
        return self.refill, self._finished(), self._free()

    def _refill(self, refill: Refill, part: Outcome, free: int) -> None:
        """On a pool thread: write `part` back and claim more, while run()'s thread goes
        on with heartbeats, timeouts and the stop, and opens slots for what comes."""
        more = False
        with self.lock:
            before = self.landings
        try:
            more = refill(part, functools.partial(self._land, clock.monotonic()), free)
        except BaseException as exc:  # noqa: BLE001 - run() ends the batch, the caller raises
            with self.lock:
                self.failure = exc
        finally:
            with self.lock:
                # The jobs taken while it was out (its own among them) asked for none: as
                # the last of them would have, ask for the next once its last rounds run.
                self.refill_asked = more and self._last_rounds()
                self.idle_refill = more and self.landings == before
                if not more:
                    self.refill = None
            self.refilled.set()
            self.wake.set()

    def _land(self, sent: float, jobs: list[Job]) -> None:
        """A refill's claimed jobs join the batch. Their leases were confirmed when the
        claim was sent, not at a later heartbeat that did not carry them: the batch's
        confirmation goes back to then if it is later."""
        if not jobs:
            return
        with self.lock:
            self.pending.extend(jobs)
            self.landings += 1
            if sent < self.confirmed:
                self.confirmed_wall -= self.confirmed - sent
                self.confirmed = sent
        self.wake.set()

    def _top_up(self, blocked: bool = False) -> int:
        """Open slots for startable jobs no slot will take (the batch's first, a
        refill's, some that came as a slot was leaving), as many as their pace is
        worth, or every one they may have (`blocked`: see Pace); the caller holds the
        lock. How many it opened."""
        self.withheld = False
        if self._startable() is None:
            return 0
        jobs = len(self.running) + len(self.pending)
        room = min(self.cap, jobs) - self.active
        opened = max(0, min(room, self.pace.slots(jobs, blocked) - self.active,
                            len(self.pending)))
        self.active += opened
        self.withheld = opened < min(room, len(self.pending))
        return opened

    def run(self) -> Outcome:
        try:
            return self._run_all()
        except BaseException:
            with self.lock:  # the batch is over: what the handlers do now changes nothing
                self.closed = True
            raise

    def _run_all(self) -> Outcome:
        with self.lock:
            opened = self._top_up()
        if not opened:
            self.wake.set()  # nothing may start: no slot's leaving will say so
        for _ in range(opened):
            self._carry_on()
        interval = min(self.lease / 3, MAX_HEARTBEAT)
        extended = self.confirmed
        stopped_at: float | None = None
        while True:
            # Slots withheld from waiting jobs: look again after WORK seconds (a timed
            # wait runs on the real clock, even under a test's frozen one).
            polled, ended = self.withheld, self.timing.ended
            # After a stop, a second one is looked at often: it does not wake the batch.
            idle = min(interval, 0.5 if stopped_at is None else stopping.POLL)
            woken = self.wake.wait(timeout=Pace.WORK if polled else idle)
            now = clock.monotonic()
            beat = now - max(extended, self.confirmed) >= self._interval(interval)
            with self.lock:
                self.wake.clear()
                refill = self._refill_due()
                # Every waiting job gets a slot when no handler ended while WORK passed,
                # or before a heartbeat holds this thread for its round trip.
                opened = self._top_up(blocked=beat or (
                    polled and not woken and self.timing.ended == ended))
                if not self.active and self.refilled.is_set():
                    break  # a refill out may bring jobs: wait for it
            if refill is not None:
                clock.spawn(functools.partial(self._refill, *refill))
            for _ in range(opened):
                self._carry_on()
            self._time_out(now)
            if beat:
                self._heartbeat()
                extended = now
            if (self.stop.is_set() or self.failure is not None) and stopped_at is None:
                stopped_at = now
            # After a stop, running handlers get at most one lease to finish; none after
            # a second stop.
            if stopped_at is not None and (now - stopped_at >= self.lease
                                           or stopping.hurried(self.stop)):
                break
        # What a refill out claims is given back with the rest (a second stop waits for
        # it no longer than for the last write-back).
        self.refilled.wait(self.stop.left() if isinstance(self.stop, stopping.Stop) else None)
        with self.lock:
            unstarted = list(self.pending)
            # A job still running but already lost is counted lost, not abandoned.
            abandoned = [job for job in self.running.values()
                         if job.token not in self.lost]
            self.closed = True
            self.pending.clear()
            outcome = self._finished()
        outcome.unstarted, outcome.abandoned = unstarted, abandoned
        for job in abandoned:
            self._write_off(job)  # past the stop's bound: what it does now changes nothing
        return outcome
