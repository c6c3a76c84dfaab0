"""`@task("queue")`: the registry of functions that do the work, and loading their modules."""

import importlib
import inspect
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from .errors import ConfigError
from .queue import Job, check_queue

Handler = Callable[[Job], object]

_REGISTRY: dict[str, Handler] = {}


@dataclass(frozen=True)
class Timed:
    """A handler with a time limit, called like the function it wraps; what
    `@task(queue, timeout=...)` registers, and what `drain()` callers may pass."""

    fn: Handler
    timeout: float  # seconds

    def __call__(self, job: Job) -> object:
        return self.fn(job)


def timeout_of(handler: Handler) -> float | None:
    """The handler's time limit in seconds, or None when it may run as long as it likes."""
    return handler.timeout if isinstance(handler, Timed) else None


def task(queue: str, *, timeout: float | timedelta | None = None
         ) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of `queue`.

    Returning completes the job, whatever the function returns (the value is
    ignored, so it need not be serialisable); raising, or calling sys.exit, retries
    it with backoff, and fails it for good at max_attempts.

    `timeout`: a run still going after this many seconds fails the job with a
    TimeoutError (retried like any failure) and the drain goes on. Python cannot
    stop a thread, so the handler's thread is abandoned, and what it does or
    returns later changes nothing. Without a timeout a handler runs as long as it
    likes, its lease extended while the process lives.
    """
    check_queue(queue)
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if seconds is not None and not (
            isinstance(seconds, int | float) and 0 < seconds < float("inf")):
        raise ConfigError(f"@task({queue!r}): timeout must be a number of seconds above 0")

    def register(fn: Handler) -> Handler:
        if inspect.iscoroutinefunction(fn):  # called on a thread, it would only make a coroutine
            raise ConfigError(f"@task({queue!r}): {fn.__qualname__} is `async def`, which "
                              "drainer cannot run yet; make it a plain function (it may "
                              "call asyncio.run)")
        _REGISTRY[queue] = fn if seconds is None else Timed(fn, seconds)
        return fn

    return register


def registered() -> dict[str, Handler]:
    """Queue name -> handler, for every task imported so far."""
    return dict(_REGISTRY)


def replace_registry(handlers: dict[str, Handler]) -> dict[str, Handler]:
    """Make `handlers` the registered tasks and return the ones they replace. For
    tests (drainer.testing.separate_tasks): a module registers its tasks once, when
    first imported, so the registry is put back afterwards rather than emptied."""
    previous = dict(_REGISTRY)
    _REGISTRY.clear()
    _REGISTRY.update(handlers)
    return previous


def load(modules: Iterable[str]) -> dict[str, Handler]:
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


def select(modules: Iterable[str], queues: Sequence[str]) -> tuple[dict[str, Handler], list[str]]:
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
