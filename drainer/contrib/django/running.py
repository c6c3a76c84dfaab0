"""The drain's side: the drainer handler that runs a Django task's job."""

import json
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from inspect import iscoroutinefunction
from typing import Any

from django.conf import settings
from django.core.exceptions import AppRegistryNotReady
from django.utils import timezone
from django.utils.module_loading import import_string

import drainer
from drainer.errors import MAX_TRACEBACK, describe, redact
from drainer.model import Job
from drainer.retry import Snooze
from drainer.storage.enqueue import check_queue

from .backend import DrainerBackend, statement, task_at
from .framework import (
    ERRORS,
    WORKER,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    module_path,
    normalize_json,
    tasks,
)

_SETUP = threading.Lock()
_ready = False


def _setup() -> None:
    """django.setup(), once per process."""
    global _ready
    with _SETUP:
        if not _ready:
            import django

            django.setup()
            _ready = True


def _close_old_connections() -> None:
    """Django's per-request clean-up around a task, but for a thread inside atomic():
    drainer.testing.drain_now(in_transaction=True) runs tasks in the test's own
    transaction (Django's TestCase), which closing the connection would break."""
    from django.db import close_old_connections, connections

    if not any(c.in_atomic_block for c in connections.all(initialized_only=True)):
        close_old_connections()


@contextmanager
def _savepoints() -> Iterator[None]:
    """In a test's transaction (drain_now(in_transaction=True) in Django's TestCase), the
    task in an atomic() block of each connection in one, as Django nests them: a query
    of the task's that fails rolls back to there, and the test's transaction goes on."""
    from django.db import connections, transaction

    with ExitStack() as blocks:
        for connection in connections.all(initialized_only=True):
            if connection.in_atomic_block:
                blocks.enter_context(transaction.atomic(using=connection.alias))
        yield


def _traceback(exc: BaseException) -> str:
    """The exception's traceback without the handler's own frame: URL passwords
    masked, bounded as drainer bounds `--verbose` tracebacks."""
    frames = exc.__traceback__
    if frames is not None and frames.tb_next is not None:
        frames = frames.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, frames))
    except BaseException:  # noqa: BLE001 - never lose the failure for its traceback
        return describe(exc)
    text = redact(text.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode())
    return text if len(text) <= MAX_TRACEBACK else text[: MAX_TRACEBACK - 1] + "…"


def _record(job: Job, alias: str, exc: BaseException) -> None:
    """Keep the failure's class and traceback in the running attempt's meta, through
    Django's connection; a failure to write it leaves the job's last error alone."""
    if isinstance(exc, Snooze):  # not a failure: the attempt is not even counted
        return
    error = {"exception_class_path": module_path(type(exc)), "traceback": _traceback(exc)}
    with suppress(Exception):  # the job's own failure is what counts
        statement(_backends()[alias]._connection(), "django_record_error", {
            "key": ERRORS, "error": json.dumps([error]), "id": job.id,
            "attempts": job.attempts})


def _backends() -> Any:
    return tasks.task_backends


def _context(task: Any, job: Job, payload: dict[str, Any]) -> Any:
    """The TaskContext of a task that takes one: its result, RUNNING."""
    result = TaskResult(task=task, id=str(job.id), status=TaskResultStatus.RUNNING,
                        enqueued_at=None, started_at=timezone.now(), finished_at=None,
                        last_attempted_at=timezone.now(), args=payload.get("args", []),
                        kwargs=payload.get("kwargs", {}), backend=payload.get("backend"),
                        errors=[], worker_ids=[WORKER] * job.attempts)
    return TaskContext(task_result=result)


def run(job: Job) -> object:
    """The drainer handler of every Django task's queue: run the task the job names
    and return its value (kept as the job's result)."""
    _setup()
    payload = job.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
        raise ValueError("the job names no Django task (a payload with 'task')")
    alias = payload.get("backend", "default")
    task = task_at(payload["task"])
    args = list(payload.get("args", []))
    kwargs = dict(payload.get("kwargs", {}))
    if task.takes_context:
        args.insert(0, _context(task, job, payload))
    if iscoroutinefunction(task.func):
        return _run_async(job, alias, task.func, args, kwargs)
    _close_old_connections()
    try:
        with _savepoints():
            value = task.func(*args, **kwargs)
        return normalize_json(value)
    except BaseException as exc:
        _record(job, alias, exc)
        raise
    finally:
        _close_old_connections()


async def _run_async(job: Job, alias: str, func: Callable[..., Any], args: list[Any],
                     kwargs: dict[str, Any]) -> object:
    """An `async def` task, awaited on drainer's event loop; Django's connections are
    those of the thread `sync_to_async` runs the ORM in, so they are closed there."""
    from asgiref.sync import sync_to_async

    await sync_to_async(_close_old_connections)()
    try:
        return normalize_json(await func(*args, **kwargs))
    except BaseException as exc:
        await sync_to_async(_record)(job, alias, exc)
        raise
    finally:
        await sync_to_async(_close_old_connections)()


def queues() -> list[str]:
    """The queues of the drainer backends of the settings' TASKS."""
    found: set[str] = set()
    configured: dict[str, Any] = getattr(settings, "TASKS", None) or {}
    for params in configured.values():
        try:
            backend = import_string(params.get("BACKEND", ""))
        except (ImportError, AppRegistryNotReady):  # the latter: its module imports
            continue  # models, and INSTALLED_APPS are loading; the app's ready() again
        if isinstance(backend, type) and issubclass(backend, DrainerBackend):
            found.update(_queue_names(params.get("QUEUES", ["default"])))
    return sorted(found)


def _queue_names(names: Iterable[str]) -> list[str]:
    return [check_queue(name) for name in names]


def register() -> None:
    """Register the handler for every queue of the settings' drainer backends."""
    for name in queues():
        drainer.task(name, keep_result=True)(run)


register()
