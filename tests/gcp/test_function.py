"""The Cloud Run function end to end: the Functions Framework's app, the official
Cloud Tasks client against a fake service, a real PostgreSQL."""

import base64
import json
from datetime import timedelta

import grpc
import pytest

from drainer import claim, complete, enqueue, enqueue_many
from drainer.wake import ceil_minute, name_for
from tests.aws.helpers import settled_sessions
from tests.gcp.conftest import ACCOUNT, QUEUE, URL
from tests.helpers import count

CRON = json.dumps({"source": "drainer.cron"})


def lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]


@pytest.mark.parametrize("body", ["", CRON, json.dumps({"source": "drainer.enqueue",
                                                         "queue": "gcp"})])
def test_a_scheduled_or_kicked_request_drains_and_answers_with_the_summary(
        function_env, conn, http, capsys, body):
    enqueue_many(conn, "gcp", [{"n": n} for n in range(5)])
    enqueue(conn, "gcp", {"fail": "boom"}, max_attempts=1)
    response = http.post("/", data=body, headers={"Function-Execution-Id": "exec-1"})
    assert response.status_code == 200
    result = response.get_json()
    assert (result["claimed"], result["done"], result["failed"]) == (6, 5, 1)
    assert (result["next"], result["next_due"], result["outcome"]) == ("none", None, "none")
    assert count(conn, "status = 'done'") == 5
    assert settled_sessions(conn) == 0
    logged = lines(capsys)  # every line of stdout is JSON, as Cloud Logging reads it
    assert {line["severity"] for line in logged} >= {"INFO"}
    assert {line["execution_id"] for line in logged} == {"exec-1"}


def pubsub_event(message: dict | bytes) -> dict:
    """A Pub/Sub push as a CloudEvent in binary mode: the ce- headers and the data."""
    data = message if isinstance(message, bytes) else json.dumps(message).encode()
    return {"headers": {"ce-id": "m-1", "ce-specversion": "1.0",
                        "ce-type": "google.cloud.pubsub.topic.v1.messagePublished",
                        "ce-source": "//pubsub.googleapis.com/projects/proj/topics/drainer",
                        "Content-Type": "application/json"},
            "data": json.dumps({"message": {"data": base64.b64encode(data).decode()}})}


def test_a_pub_sub_message_drains(function_env, conn, pubsub, capsys):
    enqueue_many(conn, "gcp", [{}] * 3)
    response = pubsub.post("/", **pubsub_event({"source": "drainer.enqueue", "queue": "gcp"}))
    assert response.status_code == 200
    assert count(conn, "status = 'done'") == 3
    assert settled_sessions(conn) == 0
    ended = [line for line in lines(capsys) if line.get("event") == "end"]
    assert [line["done"] for line in ended] == [3]


def test_a_pub_sub_message_that_is_not_a_trigger_is_dropped_and_claims_nothing(
        function_env, conn, pubsub, capsys):
    enqueue(conn, "gcp", {})
    response = pubsub.post("/", **pubsub_event(b"not json"))
    assert response.status_code == 200  # no redelivery: it would be refused again
    assert count(conn, "status = 'queued'") == 1
    assert [line["exit_code"] for line in lines(capsys) if line.get("event") == "error"] == [2]


def test_a_future_next_due_arms_one_task_for_its_minute(function_env, conn, http, cloud):
    job = enqueue(conn, "gcp", {}, delay=300)
    run_at = conn.execute("SELECT run_at FROM jobs WHERE id = %s", [job]).fetchone()[0]
    at = ceil_minute(run_at)
    result = http.post("/", data=CRON).get_json()
    assert (result["claimed"], result["next"], result["outcome"]) == (0, "wake", "armed")
    assert result["at"] == at.isoformat()
    [task] = cloud.tasks.tasks.values()
    assert task.name == f"{QUEUE}/tasks/{name_for(at)}"
    assert task.schedule_time == at
    request = task.http_request
    assert (request.url, request.http_method.name) == (URL, "POST")
    assert (request.oidc_token.service_account_email, request.oidc_token.audience) == (
        ACCOUNT, URL)
    assert json.loads(request.body) == {"source": "drainer.wake", "at": at.isoformat()}
    assert settled_sessions(conn) == 0


def test_concurrent_runs_arming_the_same_minute_create_one_task(function_env, conn, http,
                                                                cloud):
    enqueue(conn, "gcp", {}, delay=300)
    outcomes = [http.post("/", data=CRON).get_json()["outcome"] for _ in range(2)]
    assert outcomes == ["armed", "already armed"]  # AlreadyExists is no error
    assert len(cloud.tasks.tasks) == 1
    assert [method for method, _ in cloud.tasks.calls].count("CreateTask") == 2


def test_the_wake_up_s_request_is_a_trigger_the_function_runs(function_env, conn, http,
                                                              cloud):
    enqueue(conn, "gcp", {}, delay=300)
    http.post("/", data=CRON)
    [task] = cloud.tasks.tasks.values()
    conn.execute("UPDATE jobs SET run_at = now()")  # as when the task fires
    result = http.post("/", data=task.http_request.body).get_json()
    assert (result["trigger"], result["done"]) == ("wake", 1)


def test_a_job_due_beyond_the_tasks_horizon_is_woken_for_at_the_horizon(function_env,
                                                                        conn, http, cloud):
    enqueue(conn, "gcp", {}, delay=timedelta(days=90).total_seconds())
    result = http.post("/", data=CRON).get_json()
    [task] = cloud.tasks.tasks.values()
    assert result["outcome"] == "armed"
    ahead = task.schedule_time - conn.execute("SELECT now()").fetchone()[0]
    assert timedelta(days=28) < ahead <= timedelta(days=29)  # Cloud Tasks refuses > 30


def test_a_run_cut_by_its_deadline_continues_itself_through_a_task(function_env, conn,
                                                                   http, cloud, monkeypatch):
    monkeypatch.setenv("DRAINER_FUNCTION_TIMEOUT", "1.5")
    monkeypatch.setenv("DRAINER_SAFETY_MARGIN", "0.5")
    monkeypatch.setenv("DRAINER_MAX_DEPTH", "1")
    enqueue_many(conn, "gcp", [{"sleep": 0.1}] * 40)
    first = http.post("/", data=CRON).get_json()
    assert (first["stopped"], first["next"], first["outcome"]) == (
        "deadline", "continue", "continued")
    [task] = [t for t in cloud.tasks.tasks.values() if "lease-" not in t.name]
    assert json.loads(task.http_request.body) == {"source": "drainer.continue", "depth": 1}
    assert not task.schedule_time  # now
    second = http.post("/", data=task.http_request.body).get_json()
    assert (second["depth"], second["next"]) == (1, "none")  # the maximum depth
    assert count(conn, "status = 'running'") == 0
    assert count(conn, "status = 'queued'") == 40 - first["done"] - second["done"] > 0


def test_a_failed_task_call_is_logged_and_the_request_still_succeeds(function_env, conn,
                                                                     http, cloud, capsys):
    enqueue(conn, "gcp", {}, delay=300)
    cloud.tasks.refuse["CreateTask"] = grpc.StatusCode.PERMISSION_DENIED
    response = http.post("/", data=CRON)
    assert response.status_code == 200
    assert (response.get_json()["next"], response.get_json()["outcome"]) == ("wake", "failed")
    assert cloud.tasks.tasks == {}
    assert any(line.get("event") == "wake_failed" for line in lines(capsys))


def test_a_run_arms_its_lease_wake_up_before_any_handler_and_deletes_it_at_a_clean_end(
        function_env, conn, http, cloud):
    enqueue(conn, "gcp", {})
    result = http.post("/", data=CRON).get_json()
    created = [r.task.name for m, r in cloud.tasks.calls if m == "CreateTask"]
    assert len(created) == 1 and "/tasks/lease-" in created[0]
    assert result["pruned"] == [created[0].rpartition("/")[2]]
    assert cloud.tasks.tasks == {}


def test_a_sibling_s_lease_end_gets_a_lease_wake_up_deleted_once_stale(function_env, conn,
                                                                      http, cloud):
    enqueue(conn, "gcp", {})
    [held] = claim(conn, ["gcp"], 1, timedelta(minutes=5))  # a sibling run holds it
    lease_end = conn.execute("SELECT locked_until FROM jobs").fetchone()[0]
    lease_wake_up = name_for(ceil_minute(lease_end), lease=True)
    first = http.post("/", data=CRON).get_json()
    assert (first["next"], first["lease"], first["outcome"]) == ("wake", True, "armed")
    assert names(cloud) == {lease_wake_up}
    again = http.post("/", data=CRON).get_json()  # held still: its holder may die
    assert (again["outcome"], again["pruned"]) == ("already armed", [])
    assert complete(conn, [held]) == {held.id}  # the holder finishes
    job = enqueue(conn, "gcp", {}, delay=600)
    run_at = conn.execute("SELECT run_at FROM jobs WHERE id = %s", [job]).fetchone()[0]
    last = http.post("/", data=CRON).get_json()
    assert (last["next"], last["lease"], last["pruned"]) == ("wake", False, [lease_wake_up])
    assert names(cloud) == {name_for(ceil_minute(run_at))}


def test_a_failed_deletion_of_stale_wake_ups_is_logged_and_the_request_succeeds(
        function_env, conn, http, cloud, capsys):
    enqueue(conn, "gcp", {})
    cloud.tasks.refuse["ListTasks"] = grpc.StatusCode.PERMISSION_DENIED
    response = http.post("/", data=CRON)
    assert (response.status_code, response.get_json()["pruned"]) == (200, [])
    assert len(cloud.tasks.named("lease-")) == 1  # left to fire once, for nothing
    assert any(line.get("event") == "prune_failed" for line in lines(capsys))


def names(cloud) -> set[str]:
    return {name.rpartition("/")[2] for name in cloud.tasks.tasks}


def test_without_wake_ups_configured_the_backstop_is_left_to_run_it(function_env, conn,
                                                                   http, monkeypatch, cloud):
    for name in ("DRAINER_TASKS_QUEUE", "DRAINER_WAKE_URL", "DRAINER_TASKS_SERVICE_ACCOUNT"):
        monkeypatch.delenv(name)
    enqueue(conn, "gcp", {}, delay=300)
    result = http.post("/", data=CRON).get_json()
    assert (result["next"], result["outcome"]) == ("wake", "not armed")
    assert cloud.tasks.calls == []


@pytest.mark.parametrize(("env", "body", "status", "words"), [
    ({}, "{", 400, "not JSON"),
    ({}, json.dumps({"source": "elsewhere"}), 400, "unrecognised source"),
    ({}, json.dumps({"source": "drainer.continue", "depth": 0}), 400, "depth"),
    ({"DRAINER_WAKE_URL": ""}, CRON, 500, "DRAINER_WAKE_URL missing"),
    ({"DRAINER_TASKS_QUEUE": "drainer"}, CRON, 500, "DRAINER_TASKS_QUEUE"),
    ({"DRAINER_FUNCTION_TIMEOUT": "20"}, CRON, 500, "DRAINER_FUNCTION_TIMEOUT"),
    ({"DATABASE_URL": ""}, CRON, 500, "no database configured"),
])
def test_bad_requests_and_settings_are_refused_with_nothing_claimed(
        function_env, conn, http, monkeypatch, env, body, status, words):
    enqueue(conn, "gcp", {})
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    response = http.post("/", data=body)
    assert response.status_code == status
    assert words in response.get_json()["error"]
    assert count(conn, "status = 'queued'") == 1


def test_the_migrate_request_creates_the_schema(empty_db_url, monkeypatch, http):
    monkeypatch.setenv("DATABASE_URL", empty_db_url)
    result = http.post("/", data=json.dumps({"source": "drainer.migrate"})).get_json()
    assert result["version"] >= 1 and result["applied"]

