"""The Lambda handler end to end: fake context, moto, a real PostgreSQL."""

import json
import threading
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from botocore.stub import Stubber

from drainer import cancel, claim, clock, complete, enqueue, enqueue_many, errors
from drainer.aws import clients, events, schedule
from drainer.storage import schema
from drainer.wake import ceil_minute
from handlers.aws_lambda import handler
from tests.aws.helpers import (
    FUNCTION_ARN,
    GROUP,
    REGION,
    ROLE_ARN,
    FakeContext,
    settled_sessions,
)
from tests.helpers import count
from tests.pgbouncer import pooled


def stdout_lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


@pytest.mark.parametrize("event", [
    {"source": "drainer.cron"},
    {"version": "0", "id": "e1", "detail-type": "Scheduled Event", "source": "aws.events",
     "time": "2026-12-02T12:00:00Z", "resources": ["arn:aws:events:::rule/backstop"]},
    {"source": "drainer.enqueue", "queue": "aws"},
])
def test_a_scheduled_or_kicked_run_drains_and_leaves_no_session(function_env, conn, capsys,
                                                               event):
    for n in range(5):
        enqueue(conn, "aws", {"n": n})
    enqueue(conn, "aws", {"fail": "boom"}, max_attempts=1)
    result = handler(event, FakeContext(120))
    assert (result["claimed"], result["done"], result["failed"]) == (6, 5, 1)
    assert (result["next"], result["next_due"]) == ("none", None)
    assert result["trigger"] == events.recognise(event).kind
    assert count(conn, "status = 'done'") == 5
    assert settled_sessions(conn) == 0
    lines = stdout_lines(capsys)  # every line of stdout is JSON
    metric = [line for line in lines if "_aws" in line]
    assert len(metric) == 1
    assert (metric[0]["done"], metric[0]["failed"], metric[0]["FunctionName"]) == (5, 1, "drainer")
    names = {m["Name"] for m in metric[0]["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert names == {"claimed", "done", "failed", "retried", "reaped", "archived", "lost",
                     "seconds"}
    assert {line["request_id"] for line in lines if "_aws" not in line} == {
        FakeContext.aws_request_id}


def test_work_due_within_the_minute_is_waited_for_with_no_session_open(function_env, conn,
                                                                       capsys, monkeypatch):
    enqueue(conn, "aws", {})
    enqueue(conn, "aws", {}, delay=2.5)
    seen = []
    original = clock.sleep

    def sleep(seconds):  # what the database sees while the function waits
        seen.append(settled_sessions(conn))
        original(seconds)

    monkeypatch.setattr(clock, "sleep", sleep)
    result = handler({"source": "drainer.cron"}, FakeContext(120))
    assert (result["done"], result["next"]) == (2, "none")
    assert seen == [0]
    assert any(line.get("event") == "wait" for line in stdout_lines(capsys))


def test_a_run_that_claimed_nothing_arms_a_wake_up_instead_of_waiting(function_env, conn,
                                                                      monkeypatch):
    # Its siblings took the ready work: waiting would have it wait with them.
    job = enqueue(conn, "aws", {}, delay=30)
    run_at = conn.execute("SELECT run_at FROM jobs WHERE id = %s", [job]).fetchone()[0]
    monkeypatch.setattr(clock, "sleep", lambda seconds: pytest.fail("it waited"))
    result = handler({"source": "drainer.cron"}, FakeContext(120))
    assert (result["claimed"], result["next"], result["outcome"]) == (0, "wake", "armed")
    assert result["at"] == ceil_minute(run_at).isoformat()


def test_a_run_cut_by_its_deadline_continues_itself_until_the_maximum_depth(
        function_env, conn, invokes, monkeypatch, capsys):
    monkeypatch.setenv("DRAINER_SAFETY_MARGIN", "0.5")
    monkeypatch.setenv("DRAINER_MAX_DEPTH", "2")
    enqueue_many(conn, "aws", [{"sleep": 0.1}] * 40)
    invokes.expect(events.continuation(1))
    invokes.expect(events.continuation(2))
    results = [handler(event, FakeContext(1.5)) for event in (
        {"source": "drainer.cron"}, events.continuation(1), events.continuation(2))]
    assert [r["stopped"] for r in results] == ["deadline"] * 3
    assert [r["next"] for r in results] == ["continue", "continue", "none"]
    assert [e["depth"] for e in invokes.events()] == [1, 2]  # none past the maximum
    assert {p["FunctionName"] for p in invokes.sent} == {FUNCTION_ARN}  # alias kept
    assert all(r["claimed"] > 0 for r in results)
    # Nothing claimed that could not finish: every claim ended done, none running.
    assert count(conn, "status = 'running'") == 0
    assert count(conn, "status = 'done'") == sum(r["done"] for r in results)
    assert count(conn, "status = 'queued'") == 40 - sum(r["done"] for r in results) > 0
    assert any(line.get("event") == "max_depth" for line in stdout_lines(capsys))


def test_a_failed_continuation_is_logged_and_the_run_still_succeeds(function_env, conn,
                                                                   invokes, monkeypatch,
                                                                   capsys):
    monkeypatch.setenv("DRAINER_SAFETY_MARGIN", "0.5")
    enqueue_many(conn, "aws", [{"sleep": 0.1}] * 20)
    invokes.fail_next()
    result = handler({"source": "drainer.cron"}, FakeContext(1))
    assert (result["next"], result["outcome"]) == ("continue", "failed")
    assert any(line.get("event") == "continue_failed" for line in stdout_lines(capsys))


def scheduler():
    return boto3.client("scheduler", region_name=REGION)


def test_a_future_next_due_arms_one_wake_up_for_its_minute(function_env, conn):
    job = enqueue(conn, "aws", {}, delay=300)
    run_at = conn.execute("SELECT run_at FROM jobs WHERE id = %s", [job]).fetchone()[0]
    at = ceil_minute(run_at)
    result = handler({"source": "drainer.cron"}, FakeContext(60))
    assert (result["claimed"], result["next"], result["outcome"]) == (0, "wake", "armed")
    assert result["at"] == at.isoformat()
    got = scheduler().get_schedule(GroupName=GROUP, Name=schedule.name_for(at))
    assert got["ScheduleExpression"] == f"at({at:%Y-%m-%dT%H:%M:00})"
    assert got["ScheduleExpressionTimezone"] == "UTC"
    assert got["ActionAfterCompletion"] == "DELETE"
    assert got["FlexibleTimeWindow"] == {"Mode": "OFF"}
    assert (got["Target"]["Arn"], got["Target"]["RoleArn"]) == (FUNCTION_ARN, ROLE_ARN)
    assert json.loads(got["Target"]["Input"]) == events.wake(at)
    assert events.recognise(json.loads(got["Target"]["Input"])).kind == "wake"
    assert settled_sessions(conn) == 0


def test_concurrent_runs_arming_the_same_minute_create_one_schedule(function_env, conn):
    enqueue(conn, "aws", {}, delay=300)
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(
        handler({"source": "drainer.cron"}, FakeContext(60))["outcome"])) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(scheduler().list_schedules(GroupName=GROUP)["Schedules"]) == 1
    assert "armed" in outcomes and set(outcomes) <= {"armed", "already armed"}
    later = handler({"source": "drainer.wake", "at": "2026-01-01T00:00:00+00:00"},
                    FakeContext(60))
    assert later["outcome"] == "already armed"  # ConflictException: nothing added
    assert len(scheduler().list_schedules(GroupName=GROUP)["Schedules"]) == 1


def schedule_names() -> set[str]:
    return {s["Name"] for s in scheduler().list_schedules(GroupName=GROUP)["Schedules"]}


def test_a_sibling_s_lease_end_gets_a_lease_wake_up_deleted_once_stale(function_env, conn):
    enqueue(conn, "aws", {})
    [held] = claim(conn, ["aws"], 1, timedelta(minutes=5))  # a sibling run holds it
    lease_end = conn.execute("SELECT locked_until FROM jobs").fetchone()[0]
    lease_wake_up = schedule.name_for(ceil_minute(lease_end), lease=True)
    first = handler({"source": "drainer.cron"}, FakeContext(60))
    assert (first["next"], first["lease"], first["outcome"]) == ("wake", True, "armed")
    assert schedule_names() == {lease_wake_up}
    # While the lease is held (its holder may die), a run keeps its wake-up.
    again = handler({"source": "drainer.cron"}, FakeContext(60))
    assert (again["outcome"], again["pruned"]) == ("already armed", [])
    assert complete(conn, [held]) == {held.id}  # the holder finishes
    job = enqueue(conn, "aws", {}, delay=600)
    run_at = conn.execute("SELECT run_at FROM jobs WHERE id = %s", [job]).fetchone()[0]
    last = handler({"source": "drainer.cron"}, FakeContext(60))
    assert (last["next"], last["lease"], last["pruned"]) == ("wake", False, [lease_wake_up])
    assert schedule_names() == {schedule.name_for(ceil_minute(run_at))}
    cancel(conn, [job])  # nothing left: a due wake-up is never deleted
    assert handler({"source": "drainer.cron"}, FakeContext(60))["next"] == "none"
    assert schedule_names() == {schedule.name_for(ceil_minute(run_at))}


def test_a_failed_deletion_of_stale_wake_ups_is_logged_and_the_run_succeeds(
        function_env, conn, monkeypatch, capsys):
    client = boto3.client("scheduler", region_name=REGION)
    stubber = Stubber(client)
    stubber.add_client_error("list_schedules", "ThrottlingException", http_status_code=400)
    real = clients.get
    monkeypatch.setattr(clients, "get", lambda s: client if s == "scheduler" else real(s))
    with stubber:
        result = handler({"source": "drainer.cron"}, FakeContext(60))
    stubber.assert_no_pending_responses()  # it did try
    assert (result["next"], result["pruned"]) == ("none", [])
    assert any(line.get("event") == "prune_failed" for line in stdout_lines(capsys))


def test_without_a_wake_up_configuration_the_backstop_is_left_to_run_it(function_env, conn,
                                                                       monkeypatch):
    monkeypatch.delenv("DRAINER_SCHEDULER_ROLE_ARN")
    enqueue(conn, "aws", {}, delay=300)
    result = handler({"source": "drainer.cron"}, FakeContext(60))
    assert (result["next"], result["outcome"]) == ("wake", "not armed")


def test_no_database_configured_is_a_clear_configuration_error(monkeypatch, capsys):
    monkeypatch.setenv("DRAINER_TASKS", "tests.aws.tasks")
    with pytest.raises(errors.ConfigError) as info:
        handler({"source": "drainer.cron"}, FakeContext(60))
    assert "DATABASE_URL" in str(info.value) and "DRAINER_DATABASE_SECRET_ARN" in str(info.value)
    assert info.value.exit_code == 2
    assert info.value.__cause__ is None and info.value.__suppress_context__
    [line] = stdout_lines(capsys)
    assert (line["level"], line["event"], line["exit_code"]) == ("ERROR", "error", 2)


def test_a_missing_secret_is_a_clear_configuration_error(monkeypatch):
    arn = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:nope-AbCdEf"
    monkeypatch.setenv("DRAINER_TASKS", "tests.aws.tasks")
    monkeypatch.setenv("DRAINER_DATABASE_SECRET_ARN", arn)
    with pytest.raises(errors.ConfigError, match="does not exist"):
        handler({"source": "drainer.cron"}, FakeContext(60))


@pytest.mark.parametrize("env, event, error, text", [
    ({}, {"key1": "value1"}, errors.BadInput, "unrecognised event"),
    ({}, {"source": "drainer.continue", "depth": "1"}, errors.BadInput, "depth"),
    ({"DRAINER_SAFETY_MARGIN": "90"}, {"source": "drainer.cron"}, errors.ConfigError,
     "DRAINER_SAFETY_MARGIN"),
    ({"DRAINER_MAX_DEPTH": "-1"}, {"source": "drainer.cron"}, errors.ConfigError,
     "DRAINER_MAX_DEPTH"),
    ({"DRAINER_LEASE": "0.001"}, {"source": "drainer.cron"}, errors.ConfigError,
     "DRAINER_LEASE=.* at least 1"),  # the command line's bound: a heartbeat would spin
    ({"DRAINER_QUEUES": "nope"}, {"source": "drainer.cron"}, errors.ConfigError,
     "no task for queue 'nope'"),
])
def test_bad_events_and_settings_are_one_line_errors(function_env, monkeypatch, env, event,
                                                     error, text):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(error, match=text) as info:
        handler(event, FakeContext(60))
    assert "\n" not in str(info.value)


def test_the_migrate_event_creates_the_schema(empty_db_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", empty_db_url)
    result = handler({"source": "drainer.migrate"}, FakeContext(60))
    assert result["version"] == schema.LATEST_VERSION and result["applied"]
    assert handler({"source": "drainer.migrate"}, FakeContext(60))["applied"] == []


def test_behind_a_transaction_pooler_the_setting_disables_prepared_statements(
        bouncer, function_env, conn, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", pooled(bouncer, function_env))
    monkeypatch.setenv("DRAINER_NO_PREPARE", "1")
    enqueue_many(conn, "aws", [{}] * 200)
    result = handler({"source": "drainer.cron"}, FakeContext(60))
    assert (result["done"], result["next"]) == (200, "none")
    assert count(conn, "status = 'done'") == 200


def test_a_run_arms_its_lease_wake_up_before_any_handler_and_deletes_it_at_a_clean_end(
        function_env, conn):
    from tests.aws import tasks

    tasks.SEEN.clear()
    enqueue(conn, "aws", {"look": GROUP})
    result = handler({"source": "drainer.enqueue", "queue": "aws"}, FakeContext(60))
    [seen] = tasks.SEEN  # what a death during the handler would have left
    [switch] = seen
    assert switch.startswith(schedule.LEASE)
    lease_end = conn.execute("SELECT now() + interval '5 minutes'").fetchone()[0]
    armed_for = datetime.strptime(switch.removeprefix(schedule.LEASE), schedule.MINUTE)
    # The minute the lease ends, give or take the test's own run.
    assert abs(armed_for.replace(tzinfo=UTC) - lease_end) <= timedelta(minutes=1, seconds=5)
    assert (result["done"], result["next"], result["pruned"]) == (1, "none", [switch])
    assert schedule_names() == set()


def test_a_run_that_dies_mid_job_leaves_its_wake_up_which_reaps_the_job(function_env, conn,
                                                                        monkeypatch):
    """The dead-man's switch, in-process: not a killed process but a function run
    whose batch raises SystemExit instead of running the job it holds (its switch
    armed by then), so the run ends without its clean end; the lease's expiry is
    then written into the table rather than waited for. Real processes killed
    mid-job are tests/test_processes.py and the soak."""
    enqueue(conn, "aws", {})

    def die(*args, **kwargs):
        raise SystemExit("killed")  # as if the function's sandbox vanished mid-job

    with monkeypatch.context() as dying, pytest.raises(SystemExit):
        dying.setattr("drainer.engine.batch.Batch.run", die)
        handler({"source": "drainer.enqueue", "queue": "aws"}, FakeContext(60))
    [switch] = schedule_names()
    assert switch.startswith(schedule.LEASE)  # the backstop is not needed to find the job
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second'")  # lease over
    woken = handler(events.wake(datetime.now(UTC)), FakeContext(60))
    assert (woken["reaped"], woken["done"], woken["next"]) == (1, 1, "none")
    assert woken["pruned"] == [switch] and schedule_names() == set()


def test_a_lease_wake_up_that_cannot_be_armed_is_logged_and_the_run_goes_on(
        function_env, conn, monkeypatch, capsys):
    client = boto3.client("scheduler", region_name=REGION)
    stubber = Stubber(client)
    stubber.add_client_error("create_schedule", "ThrottlingException", http_status_code=400)
    stubber.add_response("list_schedules", {"Schedules": []})  # the clean end's prune
    real = clients.get
    monkeypatch.setattr(clients, "get", lambda s: client if s == "scheduler" else real(s))
    enqueue(conn, "aws", {})
    with stubber:
        result = handler({"source": "drainer.enqueue", "queue": "aws"}, FakeContext(60))
    stubber.assert_no_pending_responses()  # it did try, before the handler ran
    assert (result["done"], result["next"]) == (1, "none")
    failed = [line for line in stdout_lines(capsys) if line.get("event") == "switch_failed"]
    assert len(failed) == 1 and "backstop" in failed[0]["message"]
