"""Where a batch's handlers run, chosen per drain: a `Runner` is a way to run a slot
that may block (`spawn`) and a way to carry an async handler's work (`submit`).

- THREADS, a drain's: each slot on a daemon thread of the handler pool, and async
  handlers' work on the process's event loop, where it holds no thread while it
  waits. Daemon threads, because a handler that never returns must not keep the
  process from exiting: its lease runs out and the next run's reaper takes the job
  back. The threads and the loop come from `drainer.clock` (its pool keeps threads
  for the next batch).
- CALLER, drain_now(in_transaction=True)'s: every handler on the caller's thread,
  one after the other (an async one's work awaited there), so a framework's
  connection of that thread is the same transaction.
"""

import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from .. import clock
from ..model import Job
from .calls import Calls
from .core import Core


class Slots(Protocol):
    """What a runner uses of the batch's handler slots (engine/slots.py), which
    choose their runner: named here so the slots import the runners, not back."""

    context: contextvars.Context
    calls: Calls
    core: Core

    def awaiting(self, job: Job, awaitable: Awaitable[Any]) -> Coroutine[Any, Any, None]: ...


Spawn = Callable[[Callable[[], None]], None]
# Carries an async handler's work on; whether the slot is free for its next job here
# (False: the slot went on elsewhere, or was written off).
Submit = Callable[[Slots, Job, Awaitable[Any]], bool]


def on_handler_threads(work: Callable[[], None]) -> None:
    """A slot on a daemon thread of the handler pool."""
    clock.spawn(work)


def on_event_loop(slots: Slots, job: Job, awaitable: Awaitable[Any]) -> bool:
    """Run an async handler's work on the process's event loop, in a task of its own
    with a context of its own (what one job sets in a context variable never reaches
    the next): `Slots.awaiting` records it and carries its slot on."""
    work, context = slots.awaiting(job, awaitable), slots.context.copy()
    if clock.on_loop():
        clock.start_here(work, context)
    else:  # the task copies the context it is sent from: this thread's would leak
        context.run(clock.run_async, work)
    return False


def on_caller_thread(work: Callable[[], None]) -> None:
    """A slot on the calling thread: it runs its jobs before this returns."""
    work()


def awaited_here(slots: Slots, job: Job, awaitable: Awaitable[Any]) -> bool:
    """An async handler's work run on the event loop, and waited for on this thread."""
    try:
        result = clock.run_async(awaitable).result()
    except BaseException as exc:  # noqa: BLE001 - as in Slots.awaiting
        ended = slots.calls.raised(job, exc)
    else:
        ended = slots.calls.returned(job, result)
    return slots.core.finish(job, ended)


@dataclass(frozen=True)
class Runner:
    """`alongside`: the handlers run alongside the batch's own thread, which meanwhile
    keeps the leases, the timeouts and the refills (a runner on the caller's thread
    runs them all before the batch's thread looks at the clock)."""

    spawn: Spawn
    submit: Submit
    alongside: bool = True


THREADS = Runner(on_handler_threads, on_event_loop)
CALLER = Runner(on_caller_thread, awaited_here, alongside=False)
