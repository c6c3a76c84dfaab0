"""`@task("queue")`: the registry of functions that do the work, and loading their modules."""

import copy
import functools
import importlib
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

from . import hooks, schedules
from .errors import ConfigError
from .model import Job
from .retry import Backoff, Policy
from .schedules import Schedule
from .storage import enqueue
from .storage.drivers import Connectable
from .storage.enqueue import check_queue
from .storage.limits import limits

Handler = Callable[[Job], object]


class Task:
    """What `@task` returns: the function, still callable as itself, with its queue and
    its policies. `.enqueue` and `.enqueue_many` (and their `_async` twins) need no
    queue name and apply the task's defaults (max_attempts); `drain()` callers may pass
    a Task as a handler."""

    def __init__(self, fn: Handler, queue: str, *, timeout: float | timedelta | None = None,
                 max_attempts: int | None = None, backoff: Backoff | None = None,
                 retry_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
                 keep_result: bool = False, concurrency: int | None = None,
                 per_group: int | None = None, rate: str | None = None,
                 on_failure: hooks.Hook | None = None, on_dead: hooks.Hook | None = None):
        where = f"@task({queue!r})"
        self.fn = fn
        self.queue = check_queue(queue)
        self.timeout = _seconds(timeout, where)
        self.max_attempts = _attempts(max_attempts, where)
        if backoff is not None and not callable(backoff):
            raise ConfigError(f"{where}: backoff must be a function of the attempt number "
                              "(drainer.Exponential(), drainer.Constant(30), a lambda...)")
        self.policy = Policy(backoff, _exceptions(retry_on, where))
        self.keep_result = bool(keep_result)
        self.limits = limits(queue, concurrency, per_group, rate)
        hooks.check(on_failure, f"{where}: on_failure")
        hooks.check(on_dead, f"{where}: on_dead")
        self.on_failure, self.on_dead = on_failure, on_dead
        functools.update_wrapper(self, fn)

    def of(self, fn: Handler) -> "Task":
        """This task's queue and policies for another function."""
        made = copy.copy(self)
        made.fn = fn
        functools.update_wrapper(made, fn)
        return made

    def __call__(self, *args: Any, **kwargs: Any) -> object:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<task {getattr(self.fn, '__qualname__', self.fn)!r} of queue {self.queue!r}>"

    def _defaults(self, options: dict[str, Any]) -> dict[str, Any]:
        if options.get("max_attempts") is None and self.max_attempts is not None:
            options["max_attempts"] = self.max_attempts
        return options

    def enqueue(self, conn: Connectable, payload: object, **options: Any) -> int:
        """`drainer.enqueue` on this task's queue, with its defaults."""
        return enqueue.enqueue(conn, self.queue, payload, **self._defaults(options))

    def enqueue_many(self, conn: Connectable, payloads: Iterable[object],
                     **options: Any) -> int | list[int]:
        """`drainer.enqueue_many` on this task's queue, with its defaults."""
        found: int | list[int] = enqueue.enqueue_many(conn, self.queue, payloads,
                                                      **self._defaults(options))
        return found

    async def enqueue_async(self, conn: Connectable, payload: object, **options: Any) -> int:
        """`drainer.enqueue_async` on this task's queue, with its defaults."""
        return await enqueue.enqueue_async(conn, self.queue, payload, **self._defaults(options))

    async def enqueue_many_async(self, conn: Connectable, payloads: Iterable[object],
                                 **options: Any) -> int | list[int]:
        """`drainer.enqueue_many_async` on this task's queue, with its defaults."""
        found: int | list[int] = await enqueue.enqueue_many_async(
            conn, self.queue, payloads, **self._defaults(options))
        return found


def _seconds(timeout: float | timedelta | None, where: str) -> float | None:
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if seconds is not None and (isinstance(seconds, bool) or not (
            isinstance(seconds, int | float) and 0 < seconds < float("inf"))):
        raise ConfigError(f"{where}: timeout must be a number of seconds above 0")
    return seconds


def _attempts(max_attempts: int | None, where: str) -> int | None:
    if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(
            max_attempts, int) or not 1 <= max_attempts <= 2147483647):
        raise ConfigError(f"{where}: max_attempts must be a whole number from 1 up")
    return max_attempts


def _exceptions(retry_on: type[BaseException] | Iterable[type[BaseException]] | None,
                where: str) -> tuple[type[BaseException], ...] | None:
    if retry_on is None:
        return None
    given: object = retry_on
    types = tuple(given) if isinstance(given, list | tuple | set | frozenset) else (given,)
    if not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise ConfigError(f"{where}: retry_on must name exception classes")
    return types


def as_task(queue: str, handler: Handler) -> Task:
    """The handler as a Task: itself, or a plain function with the default policies."""
    return handler if isinstance(handler, Task) else Task(handler, queue)


_REGISTRY: dict[str, Task] = {}


def task(queue: str, *, timeout: float | timedelta | None = None,
         max_attempts: int | None = None, backoff: Backoff | None = None,
         retry_on: type[BaseException] | Iterable[type[BaseException]] | None = None,
         keep_result: bool = False, concurrency: int | None = None,
         per_group: int | None = None, rate: str | None = None, cron: str | None = None,
         tz: str = "UTC", on_failure: hooks.Hook | None = None,
         on_dead: hooks.Hook | None = None) -> Callable[[Handler], Task]:
    """Register the decorated function as the handler of `queue`; returns a Task.

    Returning completes the job (`keep_result`: the return value is stored on the job
    as JSON, for `drainer.result`; one that is not JSON fails the job for good).
    Raising, or calling sys.exit, retries it after the `backoff` (by default
    least(1 hour, 10 s * 2^attempt)), and fails it for good at max_attempts;
    `retry_on` (exception classes): any other exception fails the job at once.
    `drainer.Retry` and `drainer.Snooze` ask for a retry or a snooze explicitly.
    `max_attempts`: the default for jobs enqueued through the task object.
    `concurrency`: at most this many of the queue's jobs run at once across every
    drainer and invocation (`--concurrency` is one process's jobs in flight);
    `per_group`: at most this many per group (`enqueue(..., group=...)`), and with 1
    a group's jobs run one at a time in enqueue order; `rate` ("100/minute", per
    second, minute or hour): at most that many starts in any such window. The
    database enforces them in the claim.
    `cron` (with `tz`): the task's jobs come from a schedule of its own, named after
    the queue (`drainer.schedule` declares more than one, each with its payload).
    `on_failure(job, error)`: called for each failed attempt once it is written back;
    `on_dead(job, error)`: for each job failed for good (`drainer.hooks`).

    `timeout`: a run still going after this many seconds fails the job with a
    TimeoutError (retried like any failure) and the drain goes on. Python cannot
    stop a thread, so the handler's thread is abandoned, and what it does or
    returns later changes nothing; an `async def` handler is cancelled. Without a
    timeout a handler runs as long as it likes, its lease extended while the process
    lives.
    """
    # Built now, so that a bad option is an error where @task(...) is written.
    shape = Task(_unset, queue, timeout=timeout, max_attempts=max_attempts, backoff=backoff,
                 retry_on=retry_on, keep_result=keep_result, concurrency=concurrency,
                 per_group=per_group, rate=rate, on_failure=on_failure, on_dead=on_dead)
    own = None if cron is None else Schedule(queue, queue, cron, tz, max_attempts=max_attempts)

    def register(fn: Handler) -> Task:
        _check_unique(queue, fn)
        made = _REGISTRY[queue] = shape.of(fn)
        if own is not None:
            schedules.declare(own)
        return made

    return register


def _check_unique(queue: str, fn: Handler) -> None:
    """ConfigError when another function already handles `queue`: the later one would
    silently take its jobs. The same function registered again (its module executed
    anew, by Django's autoreload or pytest's importlib mode) replaces it quietly."""
    held = _REGISTRY.get(queue)
    if held is not None and _name(held.fn) != _name(fn):
        raise ConfigError(f"@task({queue!r}) on {_name(fn)}: queue {queue!r} already has a "
                          f"task, {_name(held.fn)}; a queue has one handler (give one of "
                          "them another queue)")


def _name(fn: Handler) -> str:
    """`module.qualname`: what stays the same when a module is executed again."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}"


def _unset(job: Job) -> object:
    raise NotImplementedError("a task's shape before @task is applied to its function")


def registered() -> dict[str, Task]:
    """Queue name -> handler, for every task imported so far."""
    return dict(_REGISTRY)


def replace_registry(handlers: dict[str, Task]) -> dict[str, Task]:
    """Make `handlers` the registered tasks and return the ones they replace. For
    tests (drainer.testing.separate_tasks): a module registers its tasks once, when
    first imported, so the registry is put back afterwards rather than emptied."""
    previous = dict(_REGISTRY)
    _REGISTRY.clear()
    _REGISTRY.update(handlers)
    return previous


def load(modules: Iterable[str]) -> dict[str, Task]:
    """Import the task modules; a module that fails to import is a ConfigError showing why."""
    if "" not in sys.path:
        sys.path.insert(0, "")  # the console script, unlike `python -m`, omits the cwd
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ConfigError(f"cannot import task module {name!r}: {_why(exc)}") from exc
    return registered()


def _why(exc: Exception) -> str:
    """`Type: message (file, line N)` at the user's code: the import machinery's own
    frames (frozen importlib, this module) say nothing about what to fix."""
    if isinstance(exc, SyntaxError):  # its location is the code that does not parse
        where = (exc.filename, exc.lineno)
        text = exc.msg
    else:
        ours = (__file__, importlib.__file__)
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if f.filename not in ours and not f.filename.startswith("<")]
        where = (frames[-1].filename, frames[-1].lineno) if frames else (None, None)
        text = str(exc)
    location = f" ({where[0]}, line {where[1]})" if where[0] and where[1] else ""
    return f"{type(exc).__name__}: {text}{location}"


def select(modules: Iterable[str], queues: Sequence[str]) -> tuple[dict[str, Task], list[str]]:
    """Load the task modules and pick the queues to drain (every queue with a task
    when `queues` is empty); ConfigError when there are no tasks or a queue has none."""
    modules = list(modules)
    handlers = load(modules)
    if not handlers and modules:  # imported fine, yet nothing registered: say which
        named = (f"task module {modules[0]!r} defines" if len(modules) == 1 else
                 f"task modules {', '.join(map(repr, modules))} define")
        raise ConfigError(f"no tasks: {named} no @task handler (a function decorated "
                          "with @drainer.task(\"queue\"))")
    if not handlers:
        raise ConfigError("no tasks: name the modules that define @task handlers with "
                          "--tasks or DRAINER_TASKS")
    queues = list(queues) or sorted(handlers)
    missing = [q for q in queues if q not in handlers]
    if missing:
        raise ConfigError(f"no task for queue {', '.join(map(repr, missing))}; "
                          f"tasks exist for {', '.join(map(repr, sorted(handlers)))}")
    return handlers, queues
