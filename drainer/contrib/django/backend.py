"""`DrainerBackend`: Django's task backend writing drainer jobs."""

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

import drainer
from drainer import config
from drainer.errors import BadInput, ConfigError, DrainerError
from drainer.storage import sql
from drainer.storage.adapters import DjangoCursors
from drainer.storage.drivers import blocking
from drainer.storage.enqueue import check_queue

from .framework import (
    ERRORS,
    WORKER,
    BaseTaskBackend,
    InvalidTask,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    module_path,
    normalize_json,
)

OPTIONS = {"DATABASE", "MAX_ATTEMPTS"}
_STATUS = {"queued": "READY", "running": "RUNNING", "done": "SUCCESSFUL", "failed": "FAILED"}


class DrainerBackend(BaseTaskBackend):  # type: ignore[misc]
    """Django's task backend writing drainer jobs: enqueued in the caller's
    transaction on the configured database, run by `drainer drain`, their results
    and errors read back from the jobs table (or its archive)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True  # drainer's priorities are Django's range, -100 to 100
    drainer_backend = True  # how the drain finds the database its backends name

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
        self.database: str = _alias(alias)
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
                   "args": normalize_json(list(args)), "kwargs": normalize_json(kwargs)}
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
        row = statement(self._connection(), "django_result", {"id": job_id})
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        (status, queue, priority, payload_text, attempts, created, done, run_at, kept,
         last_error, meta_text) = row
        payload = json.loads(payload_text)
        if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
            raise TaskResultDoesNotExist(f"job {result_id} is not a Django task's")
        task = task_at(payload["task"]).using(queue_name=queue, priority=priority,
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


def _alias(backend: str) -> str:
    """drainer's database, as the drain finds it: named once, in the DRAINER setting or
    this backend's OPTIONS (config.django_alias)."""
    try:
        return config.django_alias()
    except ConfigError as exc:
        raise ImproperlyConfigured(f"TASKS[{backend!r}]: {exc}") from None


def statement(connection: Any, name: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
    """The named statement's first row, through Django's own cursors of `connection`
    (its query log, its errors)."""
    return blocking(sql.fetch(DjangoCursors(connection), name, params))


def task_at(path: str) -> Any:
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
        found = [TaskError(exception_class_path=module_path(DrainerError),
                           traceback=last_error)]
    return found


# Running the jobs (the drain's side)

