"""Running the handlers of one claimed batch, outside any transaction.

Handlers run on up to `concurrency` daemon threads while the calling thread keeps
the leases alive and watches the deadline and the stop signal. Daemon threads,
because a handler that never returns must not keep the process from exiting:
its lease runs out and the next run's reaper takes the job back.
"""

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from . import clock
from .queue import Job
from .tasks import Handler

MAX_ERROR = 2000  # characters of last_error kept per failure


def describe(exc: BaseException) -> str:
    """`Type: message`, bounded and storable in a text column (no NUL)."""
    text = f"{type(exc).__name__}: {exc}".replace("\x00", "\\0")
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"


@dataclass
class Outcome:
    """What became of a batch, before it is written back."""

    succeeded: list[Job] = field(default_factory=list)
    failed: list[tuple[Job, str]] = field(default_factory=list)
    unstarted: list[Job] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)  # jobs found taken over mid-run
    abandoned: list[Job] = field(default_factory=list)  # still running at the bound
    busy_seconds: float = 0.0  # summed handler time, for the batch sizer


class Batch:
    """One batch's handlers; `run()` returns when every handler has finished,
    or when a stop leaves only handlers that outlived the wait bound."""

    def __init__(
        self,
        jobs: Sequence[Job],
        handlers: dict[str, Handler],
        *,
        concurrency: int,
        lease: timedelta,
        extend: Callable[[list[Job]], set[int]],
        may_start: Callable[[], bool],
        stop: threading.Event,
    ):
        self.pending = deque(jobs)
        self.handlers = handlers
        self.threads = min(concurrency, len(jobs))
        self.lease = lease.total_seconds()
        self.extend = extend
        self.may_start = may_start
        self.stop = stop
        self.running: dict[int, Job] = {}
        self.outcome = Outcome()
        self.lock = threading.Lock()
        self.idle = threading.Event()
        self.active = self.threads

    def _next(self) -> Job | None:
        with self.lock:
            if self.pending and self.may_start():
                job = self.pending.popleft()
                self.running[job.id] = job
                return job
            return None

    def _finish(self, job: Job, error: str | None, seconds: float) -> None:
        with self.lock:
            self.running.pop(job.id, None)
            self.outcome.busy_seconds += seconds
            if job.id in self.outcome.lost:
                return  # no longer ours: its result must change nothing
            if error is None:
                self.outcome.succeeded.append(job)
            else:
                self.outcome.failed.append((job, error))

    def _work(self) -> None:
        try:
            while (job := self._next()) is not None:
                began = clock.monotonic()
                try:
                    self.handlers[job.queue](job)
                    error = None
                except BaseException as exc:  # noqa: BLE001 - sys.exit in a handler is a failure too
                    error = describe(exc)
                self._finish(job, error, clock.monotonic() - began)
        finally:
            with self.lock:
                self.active -= 1
                if not self.active:
                    self.idle.set()

    def _heartbeat(self) -> None:
        """Extend the leases of every unfinished job; drop those no longer ours."""
        with self.lock:
            unfinished = [*self.running.values(), *self.pending]
        if not unfinished:
            return
        ours = self.extend(unfinished)
        with self.lock:
            gone = {j.id for j in unfinished} - ours
            self.outcome.lost |= gone
            self.pending = deque(j for j in self.pending if j.id not in gone)

    def run(self) -> Outcome:
        for _ in range(self.threads):
            threading.Thread(target=self._work, daemon=True, name="drainer-handler").start()
        interval = self.lease / 3
        extended = clock.monotonic()
        stopped_at: float | None = None
        while not self.idle.wait(timeout=min(interval, 0.5)):
            now = clock.monotonic()
            if now - extended >= interval:
                self._heartbeat()
                extended = now
            if self.stop.is_set() and stopped_at is None:
                stopped_at = now
            # After a stop, running handlers get at most one lease to finish.
            if stopped_at is not None and now - stopped_at >= self.lease:
                break
        with self.lock:
            self.outcome.unstarted = list(self.pending)
            self.outcome.abandoned = list(self.running.values())
            self.pending.clear()
        return self.outcome
