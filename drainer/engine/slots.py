"""A batch's handler slots: each takes the next job that may start, calls its
handler and records how it ended, until none is left. A slot that may block (sync
handlers, heartbeats) runs where its runner's `spawn` puts it; one on a thread that
must not block (the event loop's, or the batch's own as it opens the slots) starts
async handlers only, and hands a sync one to a fresh slot. An async handler's work
goes on where the runner's `submit` sends it: on the event loop, its task records it
and starts the slot's next job itself.
"""

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Any, cast

from .. import clock
from ..model import Job
from .calls import Calls
from .core import Core
from .outcome import Ended, close_unrun
from .runners import Runner


class Slots:
    """The slots of one batch (`core`), calling its handlers (`calls`) as `runner`
    says; `heartbeat()` confirms the leases before a job whose lease is stale starts
    (False: it could not be sent)."""

    def __init__(self, core: Core, calls: Calls, runner: Runner,
                 heartbeat: Callable[[], bool]) -> None:
        self.core, self.calls = core, calls
        self.spawn, self.submit = runner.spawn, runner.submit
        self.heartbeat = heartbeat
        self.confirming = threading.Lock()
        # The context each async handler's task starts with a copy of: the drain's.
        self.context = contextvars.copy_context()

    def work(self) -> None:
        """A slot where it may block: sync handlers, heartbeats."""
        self._slot(self.core.take, self.core.leave)

    def carry_on(self) -> None:
        """A slot on a thread that must not block (the event loop's, or the batch's as
        it opens the slots): async handlers start here, and for a sync one, or a
        heartbeat due before the next job may start, a fresh slot takes over."""
        self._slot(functools.partial(self.core.take, True), self._hand_on)

    def open(self) -> None:
        """A fresh slot, where it may block."""
        self.spawn(self.work)

    def _slot(self, take: Callable[[], Job | None], end: Callable[[], None]) -> None:
        """Run a slot's jobs one after another, as long as `take` gives one and each
        ends here; `end()` when none is left (not when the slot went on in an async
        handler's task, nor when it was written off at a timeout)."""
        went_on = False
        try:
            while not went_on and (job := take()) is not None:
                went_on = not self._run(job)
        finally:
            if not went_on:
                end()

    def _hand_on(self) -> None:
        """A slot's end where nothing may block: a fresh slot takes over if a job is
        left that may start (a sync handler's, or one waiting for a heartbeat)."""
        if self.core.waiting():
            self.open()
        else:
            self.core.leave()

    def _run(self, job: Job) -> bool:
        """Start the job's handler; True when it ended and was recorded here, or was
        put back unstarted (the slot is free for its next job), False when its work
        went on elsewhere (the slot goes on from there) or its result came too late
        (the slot was written off)."""
        called = self.calls.call(job)
        if isinstance(called, Ended):
            return self.core.finish(job, called)
        if called is None:  # its lease was stale: confirm it on this thread first
            if not self.core.put_back(job):
                return False
            self.confirm()
            return True
        return self.submit(self, job, called)

    def confirm(self) -> None:
        """Heartbeat before starting a job whose lease may be near its end; one thread
        does it while the others wait for its answer. If it cannot be sent, no job
        starts any more: what is left pending is given back."""
        with self.confirming:
            core = self.core
            if not core.freshness.fresh() and not core.unconfirmable:
                core.unconfirmable = not self.heartbeat()

    def _refresh(self) -> None:
        """A slot on a pool thread whose async job was put back (`awaiting`): confirm
        the leases, which the event loop's thread must not wait for, and go on."""
        self.confirm()
        self.work()

    async def awaiting(self, job: Job, awaitable: Awaitable[Any]) -> None:
        """An async handler's work, in its task: as it ends, the task records it and
        starts the slot's next job itself, which saves the loop a done-callback's turn
        per job. A write-off cancels the task; one that came before the task began (a
        timeout, a loss, the stop's bound) ends it unrun."""
        unrun = self.core.unrun(job, cast("asyncio.Task[Any]", asyncio.current_task()))
        # The task waited its turn past the lease: an `async def`'s has not begun. A
        # plain function that returned this awaitable has (`Calls.call` looked before).
        if not unrun and not self.calls.looks_first(job) and not self.core.freshness.fresh():
            close_unrun(awaitable)
            if self.core.put_back(job):
                clock.spawn(self._refresh)
            return
        try:
            if unrun:
                close_unrun(awaitable)
                raise asyncio.CancelledError("written off before it began")
            result = await clock.awaited(awaitable)
        except BaseException as exc:  # noqa: BLE001 - as in Calls.call; CancelledError too
            ended = self.calls.raised(job, exc)
        else:
            ended = self.calls.returned(job, result)
        finally:
            with self.core.lock:
                self.core.futures.pop(job.token, None)
        if self.core.finish(job, ended):
            self.carry_on()

    def write_off(self, job: Job) -> None:
        """Tell a handler whose work no longer counts (timed out, lost, or past the
        stop's bound) to stop: a sync one runs on, but may watch `job.cancelled`; an
        async one really stops (CancelledError at its next await)."""
        job.cancelled.set()
        with self.core.lock:
            future = self.core.futures.get(job.token)
        if future is not None:
            clock.cancel(future)
