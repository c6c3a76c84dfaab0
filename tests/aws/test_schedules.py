"""Schedules through the Lambda function, which knows nothing of them: a slot is a
queued job whose run_at is the slot, so `next_due` arms the wake-up for it. A run
on a fresh database queues the first slot and arms its wake-up; the wake-up runs
the slot's job once, queues the next slot and arms that one's; the same wake-up
delivered again, while the job runs or after, runs nothing and queues nothing.

Python's clock is frozen by freezegun and the database is told the same time
(`drainer.clock.database_now`, the seam every statement's `now` comes from); moto
stands in for Scheduler, which never fires here: a test delivers the armed
schedule's input itself, as Scheduler would at that minute."""

import json
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import ModuleType
from zoneinfo import ZoneInfo

import boto3
import psycopg
import pytest

from drainer import testing
from drainer.aws import events, schedule
from drainer.defaults import LEASE as DEFAULT_LEASE
from handlers.aws_lambda import handler
from tests.aws.helpers import FUNCTION_ARN, GROUP, REGION, ROLE_ARN, FakeContext
from tests.helpers import at

MODULE = "tests.aws.scheduled"
PARIS = ZoneInfo("Europe/Paris")
# 03:00 in Paris is 02:00 UTC in winter (CET): the first run is at 06:00 UTC, so the
# first slot is 20 hours away, and the one after it a day later.
START = datetime(2026, 12, 2, 6, tzinfo=UTC)
SLOT = datetime(2026, 12, 3, 2, tzinfo=UTC)
NEXT = datetime(2026, 12, 4, 2, tzinfo=UTC)




@pytest.fixture
def scheduled(function_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The function configured with the scheduled task module and no queue list (every
    queue with a task, as an app deploys it), in a task registry of the test's own."""
    monkeypatch.setenv("DRAINER_TASKS", MODULE)
    monkeypatch.delenv("DRAINER_QUEUES")
    with testing.separate_tasks():
        sys.modules.pop(MODULE, None)
        try:
            yield
        finally:
            sys.modules.pop(MODULE, None)


def tasks() -> ModuleType:
    """The task module, as the function's first run imported it."""
    return sys.modules[MODULE]


def scheduler():
    return boto3.client("scheduler", region_name=REGION)


def schedule_names() -> set[str]:
    return {s["Name"] for s in scheduler().list_schedules(GroupName=GROUP)["Schedules"]}


def slot_jobs(conn: psycopg.Connection) -> list[tuple]:
    """(status, attempts, slot as the job's meta says, run_at) of each slot job."""
    return conn.execute("SELECT status, attempts, meta ->> 'slot', run_at FROM jobs "
                        "WHERE meta ->> 'schedule' = 'nightly' ORDER BY run_at, id").fetchall()


def last_slot(conn: psycopg.Connection) -> datetime:
    return conn.execute("SELECT last_slot FROM drainer_schedules WHERE name = 'nightly'"
                        ).fetchone()[0]


def armed_event(at_: datetime) -> dict:
    """The input of the wake-up armed for the minute `at_` (checked to be a one-time
    schedule at that minute in UTC, targeting the function): what Scheduler delivers."""
    got = scheduler().get_schedule(GroupName=GROUP, Name=schedule.name_for(at_))
    assert got["ScheduleExpression"] == f"at({at_.astimezone(UTC):%Y-%m-%dT%H:%M:%S})"
    assert (got["ScheduleExpressionTimezone"], got["ActionAfterCompletion"]) == ("UTC", "DELETE")
    assert (got["Target"]["Arn"], got["Target"]["RoleArn"]) == (FUNCTION_ARN, ROLE_ARN)
    event = json.loads(got["Target"]["Input"])
    assert event == events.wake(at_) and events.recognise(event).kind == "wake"
    return event


def fired(at_: datetime) -> dict:
    """The wake-up for `at_` delivered: its event, the schedule deleted as Scheduler
    does once it has invoked the target (ActionAfterCompletion=DELETE)."""
    event = armed_event(at_)
    scheduler().delete_schedule(GroupName=GROUP, Name=schedule.name_for(at_))
    return event


def first_run(start: datetime = START) -> dict:
    with at(start):
        return handler({"source": "drainer.cron"}, FakeContext(60))


@pytest.mark.parametrize(("start", "slot", "local"), [
    (START, SLOT, "2026-12-03T03:00:00+01:00"),  # CET: 02:00 UTC
    (datetime(2026, 7, 1, 5, tzinfo=UTC), datetime(2026, 7, 2, 1, tzinfo=UTC),
     "2026-07-02T03:00:00+02:00"),  # CEST: 01:00 UTC
])
def test_a_run_on_a_fresh_database_queues_the_first_slot_and_arms_its_wake_up(
        scheduled, conn, start, slot, local):
    assert slot - start == timedelta(hours=20)  # a daily slot far off still gets its wake-up
    assert slot_jobs(conn) == []
    result = first_run(start)
    assert (result["claimed"], result["next"], result["lease"], result["outcome"]) == (
        0, "wake", False, "armed")
    assert result["next_due"] == result["at"] == slot.isoformat()
    assert slot_jobs(conn) == [("queued", 0, local, slot)]
    assert last_slot(conn) == slot
    assert schedule_names() == {schedule.name_for(slot)}
    armed_event(slot)
    assert tasks().RAN == []


def test_the_wake_up_runs_the_slot_once_and_arms_the_next_slots_wake_up(scheduled, conn):
    first_run()
    event = fired(SLOT)
    with at(SLOT):
        woken = handler(event, FakeContext(60))
    [ran] = tasks().RAN
    assert ran == SLOT == datetime(2026, 12, 3, 3, tzinfo=PARIS)
    assert ran.utcoffset() == timedelta(hours=1)  # in the schedule's zone
    assert (woken["trigger"], woken["claimed"], woken["done"], woken["failed"]) == (
        "wake", 1, 1, 0)
    assert (woken["next"], woken["lease"], woken["outcome"]) == ("wake", False, "armed")
    assert woken["next_due"] == woken["at"] == NEXT.isoformat()
    assert slot_jobs(conn) == [("done", 1, "2026-12-03T03:00:00+01:00", SLOT),
                               ("queued", 0, "2026-12-04T03:00:00+01:00", NEXT)]
    assert last_slot(conn) == NEXT
    # The run's own lease wake-up (armed at its claim) went at its clean end.
    assert woken["pruned"] == [schedule.name_for(SLOT + DEFAULT_LEASE, lease=True)]
    assert schedule_names() == {schedule.name_for(NEXT)}
    armed_event(NEXT)


def test_the_wake_up_delivered_twice_runs_the_slot_once_and_queues_no_other(scheduled, conn):
    first_run()
    event = fired(SLOT)
    second: list[dict] = []

    def deliver_again() -> None:  # while the first delivery's run holds the slot's job
        context = FakeContext(60)
        thread = threading.Thread(target=lambda: second.append(handler(event, context)))
        thread.start()
        thread.join(30)

    with at(SLOT):
        tasks().DURING.append(deliver_again)
        woken = handler(event, FakeContext(60))
    [again] = second
    # The second finds the job held and the next slot queued already: it runs nothing,
    # queues nothing, and its wake-up for the holder's lease end is the one the
    # holder armed at its claim.
    assert (again["claimed"], again["done"], again["reaped"]) == (0, 0, 0)
    lease_end = SLOT + DEFAULT_LEASE  # a whole minute, so it is its wake-up's
    assert (again["next"], again["lease"], again["at"], again["outcome"]) == (
        "wake", True, lease_end.isoformat(), "already armed")
    assert (woken["claimed"], woken["done"], woken["lost"]) == (1, 1, 0)
    assert (woken["next"], woken["at"], woken["outcome"]) == ("wake", NEXT.isoformat(), "armed")
    assert tasks().RAN == [SLOT]
    assert slot_jobs(conn) == [("done", 1, "2026-12-03T03:00:00+01:00", SLOT),
                               ("queued", 0, "2026-12-04T03:00:00+01:00", NEXT)]
    assert schedule_names() == {schedule.name_for(NEXT)}

    # Delivered again once the first run is over (Scheduler delivers at least once).
    with at(SLOT + timedelta(seconds=40)):
        late = handler(event, FakeContext(60))
    assert (late["claimed"], late["done"], late["next"], late["at"], late["outcome"]) == (
        0, 0, "wake", NEXT.isoformat(), "already armed")
    assert tasks().RAN == [SLOT]
    assert len(slot_jobs(conn)) == 2 and last_slot(conn) == NEXT
    assert schedule_names() == {schedule.name_for(NEXT)}
