"""The project's side of the tests, in a process of its own (Django's settings are
made once per process): `python -m tests.djangoproject.app COMMAND`, JSON on stdout.

enqueue: the app's rows and tasks, in atomic() blocks committed and rolled back,
prints each task's result id; results IDS...: each result's state; invalid: the
InvalidTask errors of what the backend refuses; naive: a task due at a naive time;
in_test: what a test wrapped in a transaction (as Django's TestCase does) sees of
drainer.testing.drain_now.
"""

import json
import sys
from datetime import UTC, datetime, timedelta

import django

django.setup()

from django.db import connection, transaction  # noqa: E402

from tests.djangoproject import tasks  # noqa: E402

try:
    from django.tasks import default_task_backend
    from django.tasks.exceptions import InvalidTask
except ImportError:
    from django_tasks import default_task_backend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask


class Undo(Exception):
    pass


def enqueue() -> dict[str, object]:
    ids: dict[str, object] = {}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders (note) VALUES ('kept')")
        ids["add"] = tasks.add.enqueue(2, 3).id
        ids["send"] = tasks.send.enqueue("ann@example.com").id
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO orders (note) VALUES ('lost')")
            ids["lost"] = tasks.add.enqueue(1, 1).id
            raise Undo
    except Undo:
        pass
    ids["explode"] = tasks.explode.enqueue("no luck").id
    ids["later"] = tasks.later.enqueue(21).id
    ids["database"] = tasks.database.enqueue().id
    ids["attempt"] = tasks.attempt.enqueue("ctx").id
    future = datetime.now(UTC) + timedelta(hours=1)
    deferred = tasks.add.using(run_after=future, priority=-5).enqueue(0, 0)
    ids["deferred"], ids["run_after"] = deferred.id, future.isoformat()
    first = tasks.add.enqueue(7, 8)
    ids["first_status"] = first.status
    ids["first_backend"] = first.backend
    return ids


def naive() -> dict[str, object]:
    """A task due at a naive time, meant in TIME_ZONE (USE_TZ = False)."""
    return {"id": tasks.add.using(run_after=datetime(2030, 1, 1, 12)).enqueue(0, 0).id}


def results(ids: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for result_id in ids:
        result = default_task_backend.get_result(result_id)
        shown: dict[str, object] = {
            "status": result.status, "task": result.task.module_path,
            "queue": result.task.queue_name, "priority": result.task.priority,
            "args": result.args, "kwargs": result.kwargs, "attempts": result.attempts,
            "enqueued": result.enqueued_at is not None,
            "finished": result.finished_at is not None,
            "errors": [{"path": e.exception_class_path, "traceback": e.traceback,
                        "class": e.exception_class.__name__} for e in result.errors],
        }
        if result.status == "SUCCESSFUL":
            shown["value"] = result.return_value
        out[result_id] = shown
    # The task's own get_result checks the task matches.
    add_id = next(i for i in ids if out[i]["task"] == "tests.djangoproject.tasks.add")
    out["via_task"] = tasks.add.get_result(add_id).status
    return out


def in_test() -> dict[str, object]:
    """Tasks enqueued and drained inside one atomic() block, then rolled back."""
    import drainer.contrib.django  # noqa: F401 - registers the tasks' queues
    from drainer import testing

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders (note) VALUES ('in test')")
        add = tasks.add.enqueue(2, 3)
        seen = tasks.database_rows.enqueue()
        summary = testing.drain_now(connection, in_transaction=True)
        added = default_task_backend.get_result(add.id)
        found = {"done": summary.done, "failed": summary.failed,
                 "add": [added.status, added.return_value],
                 "rows": default_task_backend.get_result(seen.id).return_value,
                 "open": connection.in_atomic_block and not connection.needs_rollback}
        transaction.set_rollback(True)
    return found


def invalid() -> dict[str, str]:
    refused: dict[str, str] = {}

    def refuse(name: str, make) -> None:  # type: ignore[no-untyped-def]
        try:
            make()
        except InvalidTask as exc:
            refused[name] = f"InvalidTask: {exc}"
        except Exception as exc:  # noqa: BLE001 - what the framework raises instead
            refused[name] = f"{type(exc).__name__}: {exc}"

    refuse("queue", lambda: tasks.add.using(queue_name="elsewhere"))
    refuse("priority", lambda: tasks.add.using(priority=101))
    refuse("naive", lambda: tasks.add.using(run_after=datetime(2030, 1, 1)))
    refuse("local", lambda: default_task_backend.task_class(func=lambda: None))
    refuse("arguments", lambda: tasks.add.enqueue(datetime.now(UTC), 1))
    refuse("nul", lambda: tasks.send.enqueue("a\x00b"))
    try:
        default_task_backend.get_result("not-a-number")
    except Exception as exc:  # noqa: BLE001
        refused["missing"] = type(exc).__name__
    return refused


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    commands = {"enqueue": enqueue, "invalid": invalid, "in_test": in_test, "naive": naive}
    found = commands[command]() if not rest else results(rest)
    print(json.dumps(found, default=str))
