"""`@task("queue")`: the registry of functions that do the work, and loading their modules."""

import importlib
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
        _REGISTRY[queue] = fn if seconds is None else Timed(fn, seconds)
        return fn

    return register


def registered() -> dict[str, Handler]:
    """Queue name -> handler, for every task imported so far."""
    return dict(_REGISTRY)


def load(modules: Iterable[str]) -> dict[str, Handler]:
    """Import the task modules; a module that fails to import is a ConfigError showing why."""
    if "" not in sys.path:
        sys.path.insert(0, "")  # the console script, unlike `python -m`, omits the cwd
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = f" ({frame.filename}:{frame.lineno})" if frame else ""
            raise ConfigError(
                f"task module {name!r} failed to import: {type(exc).__name__}: {exc}{where}"
            ) from exc
    return registered()


def select(modules: Iterable[str], queues: Sequence[str]) -> tuple[dict[str, Handler], list[str]]:
    """Load the task modules and pick the queues to drain (every queue with a task
    when `queues` is empty); ConfigError when there are no tasks or a queue has none."""
    handlers = load(modules)
    if not handlers:
        raise ConfigError("no tasks: name the modules that define @task handlers with "
                          "--tasks or DRAINER_TASKS")
    queues = list(queues) or sorted(handlers)
    missing = [q for q in queues if q not in handlers]
    if missing:
        raise ConfigError(f"no task for queue {', '.join(map(repr, missing))}; "
                          f"tasks exist for {', '.join(map(repr, sorted(handlers)))}")
    return handlers, queues
