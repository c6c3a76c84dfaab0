"""Wake-ups: one-time EventBridge Scheduler schedules `at(...)` the minute the next
job becomes due, so nothing polls the database while it could be suspended.

A wake-up lives in the function's own schedule group and is named after its
minute (`wake-20261202T1201Z`): runs that arm the same minute concurrently collide
on ConflictException instead of adding one each, and the schedule deletes itself
once it has fired (ActionAfterCompletion=DELETE). A wake-up for a running job's
lease end is named `lease-20261202T1201Z`: it is needed only if the holder dies,
so a run that learns it is stale (`drainer.wake.Next.stale`) deletes it; wake-ups
for queued jobs are never deleted. moto checks neither names nor expressions, so
they are checked here against the service's own patterns.
"""

import json
import re
from datetime import UTC, datetime

from .. import wake
from ..errors import ConfigError
from ..wake import Next
from . import clients, events

NAME = re.compile(r"[0-9a-zA-Z\-_.]{1,64}")  # Name and ScheduleGroupName
AT = re.compile(r"at\(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\)")
ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+")
# Scheduler retries a delivery that failed (say, a throttled invoke) for a little
# while; the backstop schedule covers anything older.
RETRY = {"MaximumRetryAttempts": 3, "MaximumEventAgeInSeconds": 600}
WAKE, LEASE = wake.WAKE_PREFIX, wake.LEASE_PREFIX  # a queued job's run_at, a lease end
name_for = wake.name_for
stale = wake.stale
MINUTE = wake.MINUTE


def expression_for(at: datetime) -> str:
    return f"at({_utc(at):%Y-%m-%dT%H:%M:%S})"


def _utc(at: datetime) -> datetime:
    if at.tzinfo is None:
        raise ValueError("a wake-up time must carry its time zone")
    return at.astimezone(UTC)


def _check(kind: str, pattern: re.Pattern[str], value: str) -> str:
    if not pattern.fullmatch(value):
        raise ConfigError(f"{kind} {value!r} is not valid for EventBridge Scheduler "
                          f"(expected {pattern.pattern})")
    return value


def arm(at: datetime, *, target_arn: str, role_arn: str, group: str,
        lease: bool = False) -> bool:
    """Schedule one invocation of `target_arn` at the minute `at` (for a lease end
    with `lease`); True when this call created it, False when another run had armed
    that minute already."""
    from botocore.exceptions import ClientError

    request = {
        "Name": _check("schedule name", NAME, name_for(at, lease=lease)),
        "GroupName": _check("schedule group (DRAINER_SCHEDULE_GROUP)", NAME, group),
        "ScheduleExpression": _check("schedule expression", AT, expression_for(at)),
        "ScheduleExpressionTimezone": "UTC",
        "FlexibleTimeWindow": {"Mode": "OFF"},
        "ActionAfterCompletion": "DELETE",
        "Target": {
            "Arn": target_arn,
            "RoleArn": _check("scheduler role (DRAINER_SCHEDULER_ROLE_ARN)", ROLE_ARN, role_arn),
            "Input": json.dumps(events.wake(_utc(at))),
            "RetryPolicy": RETRY,
        },
    }
    try:
        clients.get("scheduler").create_schedule(**request)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConflictException":
            return False
        raise
    return True


def prune(decision: Next, *, group: str) -> list[str]:
    """Delete the lease wake-ups of `group` that `decision` makes stale; returns their
    names. One that is gone already (fired, or deleted by a concurrent run) is fine."""
    from botocore.exceptions import ClientError

    if not decision.stops:
        return []  # the run drains again and decides then
    client = clients.get("scheduler")
    pages = client.get_paginator("list_schedules").paginate(GroupName=group, NamePrefix=LEASE)
    names = stale((s["Name"] for page in pages for s in page["Schedules"]), decision)
    for name in names:
        try:
            client.delete_schedule(GroupName=group, Name=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
    return names
