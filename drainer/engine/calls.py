"""Calling a job's handler, and judging how it ended: a return (its result kept
when the task keeps results), an exception (the task's retry policy judges it), or
an awaitable, whose work a runner carries on."""

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from .. import clock
from ..errors import describe, trace
from ..model import Job, Setback, Undecodable
from ..tasks import Task
from .outcome import RETURNED, Ended, kept, unawaited


class Calls:
    """A batch's handlers. `fresh()`: whether the batch's leases are recent enough for
    a job to start, looked at right before a plain function's call (an `async def`'s
    as its coroutine starts: the slots look then). `tracebacks`: keep each raised
    exception's traceback (`--verbose`; formatting costs). `codecs`: what a kept
    result's text must encode to (db.codecs)."""

    def __init__(self, tasks: Mapping[str, Task], fresh: Callable[[], bool], *,
                 tracebacks: bool = False, codecs: Sequence[str] = ()) -> None:
        self.tasks = tasks
        self.fresh = fresh
        self.tracebacks = tracebacks
        self.codecs = codecs
        # Queues whose handler is an `async def`: a thread that must not block may
        # start their jobs (an awaitable from another function takes a pool thread).
        self.async_queues = {q for q, t in tasks.items() if inspect.iscoroutinefunction(t.fn)}
        # Each queue's handler, and whether its lease is looked at as it is called: an
        # `async def`'s is looked at as its coroutine starts.
        self.calls = {q: (t.fn, q not in self.async_queues) for q, t in tasks.items()}
        self.keeping = {q for q, t in tasks.items() if t.keep_result}

    def looks_first(self, job: Job) -> bool:
        """Whether `call` looked at the lease before calling the job's handler."""
        return self.calls[job.queue][1]

    def call(self, job: Job) -> "Ended | Awaitable[Any] | None":
        """Call the job's handler: how it ended (what went wrong, None when it
        returned; its kept result; when asked for, the exception's traceback), the
        awaitable it returned, or None when the lease was not fresh right before the
        call."""
        if isinstance(job.payload, Undecodable):
            return Ended(Setback(f"the payload cannot be loaded: {job.payload.reason}"))
        fn, looks = self.calls[job.queue]
        if looks and not self.fresh():
            return None
        try:
            result = fn(job)
            if result is not None and inspect.isawaitable(result):  # an `async def`
                return result
        except BaseException as exc:  # noqa: BLE001 - sys.exit in a handler is a failure too
            return self.raised(job, exc)
        return self.returned(job, result)

    def raised(self, job: Job, exc: BaseException) -> Ended:
        if isinstance(exc, clock.HandlerExit) and exc.__cause__ is not None:
            exc = exc.__cause__  # an async handler's exit: judged and shown as a plain one's
        return Ended(self.tasks[job.queue].policy.judge(job, exc, describe(exc)),
                     traced=trace(exc) if self.tracebacks else None)

    def returned(self, job: Job, result: object) -> Ended:
        if result is None and job.queue not in self.keeping:
            return RETURNED  # most handlers: nothing to check, nothing to keep
        unrun = unawaited(result)  # work that never ran
        if unrun is not None or job.queue not in self.keeping:
            return Ended(unrun)
        value = kept(result, self.codecs)
        return Ended(value) if isinstance(value, Setback) else Ended(kept=value)
