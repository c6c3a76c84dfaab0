"""The test project's tasks."""

import asyncio

try:
    from django.tasks import task
except ImportError:  # Django before 6: the backport
    from django_tasks import task

from django.db import connection


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="emails", priority=7)
def send(to: str) -> dict[str, str]:
    return {"sent": to}


@task
def explode(why: str) -> None:
    raise ValueError(why)


@task
async def later(n: int) -> list[int]:
    await asyncio.sleep(0)
    return [n, n * 2]


@task
def database() -> str:
    """Uses Django's connection in the handler's thread."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        return str(cursor.fetchone()[0])


@task(takes_context=True)
def attempt(context, tag: str) -> list:  # type: ignore[no-untyped-def]
    return [tag, context.attempt, context.task_result.id]


def not_a_task() -> None:
    pass


@task
def database_rows() -> list[str]:
    """What the handler's connection sees of the app's rows."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT note FROM orders ORDER BY note")
        return [note for (note,) in cursor.fetchall()]


@task
def remember(note: str) -> int:
    """An order through the ORM: a note already there is a unique violation."""
    from tests.djangoproject.shop.models import Order

    return Order.objects.create(note=note).pk
