"""Trigger shapes, and wake-up names and expressions checked as the service would."""

from datetime import UTC, datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import Stubber

from drainer import errors
from drainer.aws import clients, events, schedule
from drainer.aws.events import Trigger
from drainer.wake import Next
from tests.aws.helpers import FUNCTION_ARN, GROUP, REGION, ROLE_ARN


@pytest.mark.parametrize("event, trigger", [
    ({"source": "drainer.cron"}, Trigger("cron")),
    ({"source": "aws.events", "detail-type": "Scheduled Event"}, Trigger("cron")),
    ({"source": "aws.scheduler", "detail-type": "Scheduled Event"}, Trigger("cron")),
    ({"source": "drainer.enqueue", "queue": "email"}, Trigger("enqueue", queue="email")),
    (events.kick("email"), Trigger("enqueue", queue="email")),
    (events.continuation(3), Trigger("continue", depth=3)),
    (events.wake(datetime(2026, 12, 2, 12, 1, tzinfo=UTC)), Trigger("wake")),
    ({"source": "drainer.migrate"}, Trigger("migrate")),
    (events.fanout("a,b", "t1"), Trigger("fanout", fleet="a,b", ticket="t1")),
    (events.continuation(2, "a,b", "t2"), Trigger("continue", depth=2, fleet="a,b",
                                                 ticket="t2")),
])
def test_triggers_are_recognised(event, trigger):
    assert events.recognise(event) == trigger


@pytest.mark.parametrize("event", [
    {}, [], "drainer.cron", None, {"source": "aws.events", "detail-type": "EC2 State Change"},
    {"source": "drainer.continue"}, {"source": "drainer.continue", "depth": 0},
    {"source": "drainer.continue", "depth": True},
    {"source": "drainer.fanout"}, {"source": "drainer.fanout", "fleet": "q"},
    {"source": "drainer.fanout", "fleet": "q", "ticket": 1},
    {"source": "drainer.continue", "depth": 1, "ticket": "t"},
])
def test_anything_else_is_refused(event):
    with pytest.raises(errors.BadInput):
        events.recognise(event)


def test_a_wake_up_is_named_and_timed_by_its_utc_minute():
    at = datetime(2026, 12, 2, 13, 1, tzinfo=timezone(timedelta(hours=1)))  # 12:01 UTC
    assert schedule.name_for(at) == "wake-20261202T1201Z"
    assert schedule.expression_for(at) == "at(2026-12-02T12:01:00)"
    assert schedule.NAME.fullmatch(schedule.name_for(at))
    assert schedule.AT.fullmatch(schedule.expression_for(at))
    with pytest.raises(ValueError, match="time zone"):
        schedule.name_for(datetime(2026, 12, 2, 12, 1))
    assert schedule.name_for(at, lease=True) == "lease-20261202T1201Z"
    assert schedule.NAME.fullmatch(schedule.name_for(at, lease=True))


def test_only_stale_lease_wake_ups_of_ours_are_picked_for_deletion():
    names = ["lease-20261202T1201Z", "lease-20261202T1204Z", "wake-20261202T1201Z",
             "lease-mine", "lease-20261202T1201Zx", "nightly"]
    decision = Next("wake", datetime(2026, 12, 2, 12, 2, tzinfo=UTC),
                    leases_from=datetime(2026, 12, 2, 12, 4, tzinfo=UTC))
    assert schedule.stale(names, decision) == ["lease-20261202T1201Z"]
    assert schedule.stale(names, Next("none")) == ["lease-20261202T1201Z",
                                                   "lease-20261202T1204Z"]


@pytest.mark.parametrize("group, role, text", [
    ("my group", ROLE_ARN, "schedule group"),
    ("g" * 65, ROLE_ARN, "schedule group"),
    (GROUP, "arn:aws:iam::123:role/x", "scheduler role"),
    (GROUP, "drainer-scheduler", "scheduler role"),
])
def test_names_the_service_would_refuse_are_configuration_errors(group, role, text):
    with pytest.raises(errors.ConfigError, match=text):
        schedule.arm(datetime(2026, 12, 2, 12, 1, tzinfo=UTC), target_arn=FUNCTION_ARN,
                     role_arn=role, group=group)


def test_a_stale_wake_up_gone_already_is_no_error(monkeypatch):
    # Between the list and the delete it fired, or a concurrent run deleted it.
    client = boto3.client("scheduler", region_name=REGION)
    monkeypatch.setattr(clients, "get", lambda service: client)
    with Stubber(client) as stubber:
        stubber.add_response("list_schedules", {"Schedules": [
            {"Name": "lease-20261202T1201Z"}, {"Name": "wake-20261202T1202Z"}]},
            {"GroupName": GROUP, "NamePrefix": schedule.LEASE})
        stubber.add_client_error("delete_schedule", "ResourceNotFoundException",
                                 http_status_code=404,
                                 expected_params={"GroupName": GROUP,
                                                  "Name": "lease-20261202T1201Z"})
        assert schedule.prune(Next("none"), group=GROUP) == ["lease-20261202T1201Z"]
        stubber.assert_no_pending_responses()
        assert schedule.prune(Next("continue"), group=GROUP) == []  # no call at all

