"""Django's Tasks framework: Django 6's `django.tasks`, or before Django 6 the
`django-tasks` backport's `django_tasks`, under the same names."""

import importlib
from typing import Any


def _framework() -> str:
    """Django's own Tasks framework (Django 6) when there, else the backport's."""
    try:
        importlib.import_module("django.tasks.backends.base")
    except ImportError:
        return "django_tasks"
    return "django.tasks"


_FRAMEWORK = _framework()
_base: Any = importlib.import_module(f"{_FRAMEWORK}.backends.base")
tasks: Any = importlib.import_module(_FRAMEWORK)
_exceptions: Any = importlib.import_module(f"{_FRAMEWORK}.exceptions")

BaseTaskBackend: Any = _base.BaseTaskBackend
TaskResult: Any = tasks.TaskResult
TaskResultStatus: Any = tasks.TaskResultStatus
TaskContext: Any = tasks.TaskContext
TaskError: Any = importlib.import_module(f"{_FRAMEWORK}.base").TaskError
# Django 6 names it InvalidTask; the backport, InvalidTaskError.
InvalidTask: Any = getattr(_exceptions, "InvalidTask", None) or _exceptions.InvalidTaskError
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist

ERRORS = "django_errors"  # the meta key of a job's failures, one per failed attempt
WORKER = "drainer"  # each attempt's worker id: drainer does not record which process ran it


def normalize_json(value: object) -> Any:
    """The value as the framework stores task arguments and results (tuples as lists,
    bytes as text); TypeError or ValueError for what JSON cannot hold."""
    # Django 6 has it in django.utils.json; the backport, in django_tasks.utils.
    where = "django.utils.json" if _FRAMEWORK == "django.tasks" else "django_tasks.utils"
    return importlib.import_module(where).normalize_json(value)


def module_path(value: Any) -> str:
    return f"{value.__module__}.{value.__qualname__}"


