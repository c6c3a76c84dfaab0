"""Django's Tasks framework on drainer: `DrainerBackend`, a task backend that writes
each task as one drainer job through Django's own connection, and the drainer tasks
that run them.

Settings (Django 6's `django.tasks`, or the `django-tasks` backport on older Django)::

    TASKS = {"default": {
        "BACKEND": "drainer.contrib.django.DrainerBackend",
        "QUEUES": ["default", "emails"],   # the drainer queues of these tasks
        "OPTIONS": {"DATABASE": "default", "MAX_ATTEMPTS": 1},
    }}

A drain runs them with the same settings::

    DJANGO_SETTINGS_MODULE=mysite.settings python -m drainer drain --tasks drainer.contrib.django

Importing this module registers one drainer task (keep_result=True) per queue listed
by the drainer backends of `TASKS`; its handler imports the Django task named in the
job, calls `django.setup()` once, runs the task's function (an `async def` on
drainer's event loop) and closes Django's stale connections before and after, as
Django's request cycle does. A failure's exception class and traceback are kept in
the job's meta for `get_result()`.
"""

import importlib
import json
import threading
import traceback
from collections.abc import Callable, Iterable
from contextlib import suppress
from inspect import iscoroutinefunction
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

import drainer
from drainer.errors import MAX_TRACEBACK, BadInput, DrainerError, describe, redact
from drainer.model import Job
from drainer.retry import Snooze
from drainer.storage import sql
from drainer.storage.adapters import DjangoCursors
from drainer.storage.drivers import blocking
from drainer.storage.enqueue import check_queue


def _framework() -> str:
    """Django's own Tasks framework (Django 6) when there, else the backport's."""
    try:
        importlib.import_module("django.tasks.backends.base")
    except ImportError:
        return "django_tasks"
    return "django.tasks"


_FRAMEWORK = _framework()
_base: Any = importlib.import_module(f"{_FRAMEWORK}.backends.base")
_tasks: Any = importlib.import_module(_FRAMEWORK)
_exceptions: Any = importlib.import_module(f"{_FRAMEWORK}.exceptions")

BaseTaskBackend: Any = _base.BaseTaskBackend
TaskResult: Any = _tasks.TaskResult
TaskResultStatus: Any = _tasks.TaskResultStatus
TaskContext: Any = _tasks.TaskContext
TaskError: Any = importlib.import_module(f"{_FRAMEWORK}.base").TaskError
# Django 6 names it InvalidTask; the backport, InvalidTaskError.
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist

OPTIONS = {"DATABASE", "MAX_ATTEMPTS"}
ERRORS = "django_errors"  # the meta key of a job's failures, one per failed attempt
WORKER = "drainer"  # each attempt's worker id: drainer does not record which process ran it
_STATUS = {"queued": "READY", "running": "RUNNING", "done": "SUCCESSFUL", "failed": "FAILED"}


def _normalize_json(value: object) -> Any:
    """The value as the framework stores task arguments and results (tuples as lists,
    bytes as text); TypeError or ValueError for what JSON cannot hold."""
    # Django 6 has it in django.utils.json; the backport, in django_tasks.utils.
    where = "django.utils.json" if _FRAMEWORK == "django.tasks" else "django_tasks.utils"
    return importlib.import_module(where).normalize_json(value)


def _module_path(value: Any) -> str:
    return f"{value.__module__}.{value.__qualname__}"


class DrainerBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django's task backend writing drainer jobs: enqueued in the caller's
    transaction on the configured database, run by `drainer drain`, their results
    and errors read back from the jobs table (or its archive)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True  # drainer's priorities are Django's range, -100 to 100

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        unknown = sorted(set(self.options) - OPTIONS)
        if unknown:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: unknown OPTIONS {unknown}; "
                                       f"known: {sorted(OPTIONS)}")
        if not self.queues:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: QUEUES must list the queues of "
                                       "its tasks: a drain runs these queues")
        for name in self.queues:
            try:
                check_queue(name)
            except BadInput as exc:
                raise ImproperlyConfigured(f"TASKS[{alias!r}]: QUEUES: {exc}") from None
        self.database: str = self.options.get("DATABASE", "default")
        attempts = self.options.get("MAX_ATTEMPTS", 1)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: OPTIONS MAX_ATTEMPTS must be a "
                                       "whole number from 1 up")
        self.max_attempts: int = attempts

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        try:
            check_queue(task.queue_name)
        except BadInput as exc:
            raise InvalidTask(str(exc)) from None

    def _connection(self) -> Any:
        from django.db import connections

        return connections[self.database]

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Write the task as one job through Django's connection: in the caller's
        `transaction.atomic()` it commits or rolls back with the caller's data."""
        self.validate_task(task)
        payload = {"task": task.module_path, "backend": self.alias,
                   "args": _normalize_json(list(args)), "kwargs": _normalize_json(kwargs)}
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):  # USE_TZ = False: local time
            run_at = timezone.make_aware(run_at, timezone.get_default_timezone())
        try:
            job_id = drainer.enqueue(self._connection(), task.queue_name, payload,
                                     priority=task.priority, run_at=run_at,
                                     max_attempts=self.max_attempts)
        except BadInput as exc:
            raise InvalidTask(str(exc)) from exc
        return TaskResult(task=task, id=str(job_id), status=TaskResultStatus.READY,
                          enqueued_at=timezone.now(), started_at=None, finished_at=None,
                          last_attempted_at=None, args=payload["args"],
                          kwargs=payload["kwargs"], backend=self.alias, errors=[],
                          worker_ids=[])

    def get_result(self, result_id: str) -> Any:
        """The job's state as Django's result: READY (queued, a retry too), RUNNING,
        SUCCESSFUL with its return value, or FAILED with its errors."""
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        row = _statement(self._connection(), "django_result", {"id": job_id})
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        (status, queue, priority, payload_text, attempts, created, done, run_at, kept,
         last_error, meta_text) = row
        payload = json.loads(payload_text)
        if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
            raise TaskResultDoesNotExist(f"job {result_id} is not a Django task's")
        task = _task(payload["task"]).using(queue_name=queue, priority=priority,
                                            backend=self.alias)
        meta = json.loads(meta_text) if meta_text else None
        errors = _errors(meta, status, last_error)
        finished = done if status == "done" else run_at if status == "failed" else None
        result = TaskResult(task=task, id=str(job_id), status=TaskResultStatus(_STATUS[status]),
                            enqueued_at=created, started_at=None, finished_at=finished,
                            last_attempted_at=None, args=payload.get("args", []),
                            kwargs=payload.get("kwargs", {}), backend=self.alias,
                            errors=errors, worker_ids=[WORKER] * attempts)
        if status == "done" and kept is not None:
            object.__setattr__(result, "_return_value", json.loads(kept))
        return result


def _statement(connection: Any, name: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """The named statement's first row, through Django's own cursors of `connection`
    (its query log, its errors)."""
    return blocking(sql.fetch(DjangoCursors(connection), name, params))


def _task(path: str) -> Any:
    """The Django task at `path` (its module's attribute, as @task made it)."""
    task = import_string(path)
    if not hasattr(task, "func") or not hasattr(task, "takes_context"):
        raise ImproperlyConfigured(f"{path} is not a Django task (@task)")
    return task


def _errors(meta: Any, status: str, last_error: str | None) -> list[Any]:
    """The failed attempts' errors the handler kept; a failure it could not see (the
    lease ran out, a timeout, a cancel) is the job's last error alone."""
    kept = meta.get(ERRORS) if isinstance(meta, dict) else None
    found = [TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"])
             for e in kept or [] if isinstance(e, dict)]
    if not found and last_error is not None and status in ("failed", "queued"):
        found = [TaskError(exception_class_path=_module_path(DrainerError),
                           traceback=last_error)]
    return found


# Running the jobs (the drain's side)

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
    error = {"exception_class_path": _module_path(type(exc)), "traceback": _traceback(exc)}
    with suppress(Exception):  # the job's own failure is what counts
        _statement(_backends()[alias]._connection(), "django_record_error", {
            "key": ERRORS, "error": json.dumps([error]), "id": job.id,
            "attempts": job.attempts})


def _backends() -> Any:
    return _tasks.task_backends


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
    task = _task(payload["task"])
    args = list(payload.get("args", []))
    kwargs = dict(payload.get("kwargs", {}))
    if task.takes_context:
        args.insert(0, _context(task, job, payload))
    if iscoroutinefunction(task.func):
        return _run_async(job, alias, task.func, args, kwargs)
    _close_old_connections()
    try:
        return _normalize_json(task.func(*args, **kwargs))
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
        return _normalize_json(await func(*args, **kwargs))
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
        except ImportError:
            continue
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
