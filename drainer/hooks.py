"""Alerting hooks: functions told of a job's failures once they are written back.

`on_failure(job, error)` hears of every failed attempt that was still the drain's
once written back (retried, or failed for good); `on_dead(job, error)` of a job failed
for good (at max_attempts, or at once for an exception its task's `retry_on` does
not name). `error` is the text recorded as the job's last_error (`Type: message`).
A task's own hooks (`@task(..., on_failure=..., on_dead=...)`) are called first,
then the global ones (`drainer.on_failure(fn)`, `drainer.on_dead(fn)`), in the order
they were registered. Jobs no longer the drain's (lost) and snoozes are not failures.

Hooks run after the batch's write-back, outside any transaction, before the next
batch's handlers start, on a thread of the handler pool; an `async def` hook is
awaited on the process's event loop (the async handlers' one). The drain waits for a
batch's hooks at most HOOK_TIMEOUT seconds in all. A hook that raises is logged and
the next one called; one still running at the bound is logged, written off (a sync
one's thread runs on, an async one is cancelled) and the batch's hooks after it are
skipped. Hooks must be quick: hand a slow alert (an HTTP call) to a queue or give it
a timeout of its own.
"""

import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

from . import clock
from .errors import ConfigError, describe
from .model import Job, Setback, Settled

log = logging.getLogger(__name__)

Hook = Callable[[Job, str], object]
# The seconds the drain waits for one write-back's hooks in all, before it goes on
# without them. The next batch is claimed already: its leases run meanwhile.
HOOK_TIMEOUT = 5.0

_FAILURE: list[Hook] = []
_DEAD: list[Hook] = []


def check(fn: object, where: str) -> None:
    """ConfigError when `fn` (None: no hook) cannot be a hook."""
    if fn is not None and not callable(fn):
        raise ConfigError(f"{where}: a hook must be a function of (job, error)")


def on_failure(fn: Hook) -> Hook:
    """Call `fn(job, error)` for every failed attempt of any task (a decorator too)."""
    check(fn, "on_failure")
    _FAILURE.append(fn)
    return fn


def on_dead(fn: Hook) -> Hook:
    """Call `fn(job, error)` for every job of any task that failed for good (a
    decorator too)."""
    check(fn, "on_dead")
    _DEAD.append(fn)
    return fn


def replace_registered(failure: list[Hook], dead: list[Hook]) -> tuple[list[Hook], list[Hook]]:
    """Make these the global hooks and return the ones they replace (for tests:
    drainer.testing.separate_tasks)."""
    previous = list(_FAILURE), list(_DEAD)
    _FAILURE[:], _DEAD[:] = failure, dead
    return previous


class Call(NamedTuple):
    kind: str  # "on_failure" or "on_dead"
    hook: Hook
    job: Job
    error: str


def calls(settled: Settled, failed: Sequence[tuple[Job, Setback]],
          own: Mapping[str, tuple[Hook | None, Hook | None]]) -> list[Call]:
    """The hook calls a written-back batch makes, in order; `own`: each queue's task
    hooks (on_failure, on_dead)."""
    made: list[Call] = []
    if not (_FAILURE or _DEAD or own):
        return made
    for job, setback in failed:
        failure = settled.failed.get(job.token)
        if failure is None or setback.then == "snooze":
            continue  # lost, or snoozed: not a failure
        task_failure, task_dead = own.get(job.queue, (None, None))
        for hook in ([task_failure] if task_failure else []) + _FAILURE:
            made.append(Call("on_failure", hook, job, setback.error))
        if failure.status == "failed":
            for hook in ([task_dead] if task_dead else []) + _DEAD:
                made.append(Call("on_dead", hook, job, setback.error))
    return made


def run(made: Sequence[Call], timeout: float | None = None) -> None:
    """Make the calls, in order, on a thread of the handler pool; return when they
    are done or `timeout` (default HOOK_TIMEOUT) seconds have gone by. Never raises."""
    if not made:
        return
    bound = HOOK_TIMEOUT if timeout is None else timeout
    calls = _Calls(made)
    clock.spawn(calls.make)
    if calls.done.wait(timeout=bound):
        return
    given_up = calls.give_up()
    if given_up is None:  # they ended just now
        return
    stuck, skipped = given_up
    log.warning("job %d (queue %s): its %s hook %s still ran after %g s; the drain goes on "
                "without it%s", stuck.job.id, stuck.job.queue, stuck.kind, _name(stuck.hook),
                bound, f" ({skipped} later hook calls of this batch skipped)" if skipped else "")


class _Calls:
    """One batch's hook calls, made one after another, and giving up on them at the
    bound: a sync hook still running is written off (its thread runs on), an async
    one being awaited is cancelled, and the calls after it are skipped."""

    def __init__(self, made: Sequence[Call]):
        self.made = made
        self.done = clock.event()
        self.lock = threading.Lock()
        self.at = 0
        self.given_up = False
        self.awaiting: Future[Any] | None = None  # an async hook's work on the loop

    def make(self) -> None:
        try:
            for n, call in enumerate(self.made):
                with self.lock:
                    if self.given_up:
                        return
                    self.at = n
                self._call(call)
            with self.lock:
                self.at = len(self.made)
        finally:
            self.done.set()

    def give_up(self) -> tuple[Call, int] | None:
        """The call still running and how many are skipped after it; None when the
        calls have all ended."""
        with self.lock:
            if self.at == len(self.made):
                return None
            self.given_up = True
            awaiting = self.awaiting
        if awaiting is not None:
            awaiting.cancel()  # asyncio.CancelledError in the hook, at its next await
        return self.made[self.at], len(self.made) - self.at - 1

    def _call(self, call: Call) -> None:
        try:
            result = call.hook(call.job, call.error)
            if inspect.isawaitable(result):  # an `async def` hook: run it to its end
                self._await(result)
        except BaseException as exc:  # noqa: BLE001 - a hook must never break the drain
            with self.lock:
                if self.given_up:
                    return  # already logged as given up on

            log.warning("job %d (queue %s): its %s hook %s raised %s", call.job.id,
                        call.job.queue, call.kind, _name(call.hook), describe(exc))

    def _await(self, awaitable: Awaitable[Any]) -> None:
        """Wait for an async hook's work on the process's event loop (the handlers'
        one), where give_up() can cancel it."""
        future = clock.run_async(awaitable)
        with self.lock:
            self.awaiting = future
            cancel = self.given_up
        if cancel:
            future.cancel()
        try:
            future.result()
        finally:
            with self.lock:
                self.awaiting = None


def _name(hook: Hook) -> str:
    return str(getattr(hook, "__qualname__", None) or repr(hook))
