"""Wake-ups as Cloud Tasks tasks: an HTTP POST to the function at a minute.

A task is named after its minute (`wake-20260303T1200Z`), so concurrent runs that
decide on the same minute create one task: the second create is refused with
AlreadyExists, which is fine. A lease wake-up (the minute a running job's lease
ends, which matters only if its holder dies) is named `lease-...`; a run that stops
and finds it stale (`drainer.wake.Next.stale`) deletes it. A continuation is a task
with no name and no time: a fresh run, now.

Cloud Tasks keeps a task's name for about an hour after the task ran or was
deleted: a name is never reused sooner, which a name per minute never needs.
"""

import contextlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .. import wake
from ..wake import Next
from . import clients, events
from .settings import Wakeups

if TYPE_CHECKING:
    from google.cloud.tasks_v2 import Task

# Cloud Tasks refuses a schedule_time more than 30 days ahead; a job due later is
# woken for at this horizon, and that run arms the next one.
HORIZON = timedelta(days=29)


def _task(target: Wakeups, body: bytes, **fields: object) -> "Task":
    from google.cloud.tasks_v2 import HttpMethod, HttpRequest, OidcToken, Task

    request = HttpRequest(http_method=HttpMethod.POST, url=target.url, body=body,
                          headers={"Content-Type": "application/json"},
                          oidc_token=OidcToken(service_account_email=target.service_account,
                                               audience=target.url))
    return Task(http_request=request, **fields)


def arm(at: datetime, target: Wakeups, *, now: datetime, lease: bool = False) -> bool:
    """A task that calls the function at the minute `at` (no later than the horizon
    from `now`); True when this call created it, False when another run had."""
    from google.api_core.exceptions import AlreadyExists

    if at > now + HORIZON:
        at = (now + HORIZON).replace(second=0, microsecond=0)
    task = _task(target, events.body("wake", at=at), schedule_time=at,
                 name=f"{target.queue}/tasks/{wake.name_for(at, lease=lease)}")
    try:
        clients.tasks().create_task(parent=target.queue, task=task, timeout=clients.TIMEOUT)
    except AlreadyExists:
        return False
    return True


def continuation(depth: int, target: Wakeups) -> None:
    """A fresh run now, `depth` continuations deep."""
    clients.tasks().create_task(parent=target.queue,
                                task=_task(target, events.body("continue", depth=depth)),
                                timeout=clients.TIMEOUT)


def prune(decision: Next, target: Wakeups) -> list[str]:
    """Delete the queue's lease wake-ups that `decision` makes stale; their names.
    One gone already (it ran, or a concurrent run deleted it) is fine."""
    from google.api_core.exceptions import NotFound

    if not decision.stops:
        return []  # the run drains again and decides then
    client = clients.tasks()
    tasks = client.list_tasks(parent=target.queue, timeout=clients.TIMEOUT)
    names = wake.stale((t.name.rpartition("/")[2] for t in tasks), decision)
    for name in names:
        with contextlib.suppress(NotFound):
            client.delete_task(name=f"{target.queue}/tasks/{name}", timeout=clients.TIMEOUT)
    return names
