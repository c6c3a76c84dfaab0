"""Jobs nobody will run: a drain names the ready queues that no task of the run handles
(a misspelled queue, a task module not loaded), in its summary's `no_task` and on
stderr, read by the statement that finds next_due; `doctor --tasks` reports them."""

import json
from datetime import timedelta

import psycopg

import drainer
from drainer import run, testing
from drainer.storage.admin import MAX_NO_TASK
from tests.helpers import count, run_cli, summary_of

LINE = ("drainer: ready jobs in queues no task drains: emial, sms-typo (check the queue "
        "name, or --tasks)")


def enqueue_strays(conn: psycopg.Connection) -> None:
    """Ready jobs in two queues no task handles, one that is not ready yet, and one in a
    queue whose task this run has (`asyncy`'s) but does not drain (--queue)."""
    drainer.enqueue(conn, "emial", {})
    drainer.enqueue(conn, "emial", {})
    drainer.enqueue(conn, "sms-typo", {})
    drainer.enqueue(conn, "tomorrow", {}, delay=timedelta(days=1))
    drainer.enqueue(conn, "async", {})


def test_a_drain_names_ready_queues_no_task_drains(conn, db_url):
    enqueue_strays(conn)
    result = run_cli("drain", "--database-url", db_url, "--tasks", "asyncy", "--queue", "sync")
    assert result.returncode == 0, result.stderr
    summary = summary_of(result.stdout)
    assert summary["no_task"] == ["emial", "sms-typo"]
    assert summary["claimed"] == 0 and summary["stopped"] == "empty"
    assert summary["next_due"] is None  # of the drained queue: nothing
    assert LINE in result.stderr.splitlines()
    assert count(conn, "status = 'queued'") == 5  # nothing taken, nothing changed


def test_a_drain_with_every_ready_queue_handled_has_an_empty_list_and_no_line(conn, db_url):
    drainer.enqueue(conn, "tomorrow", {}, delay=timedelta(days=1))  # not ready: not named
    result = run_cli("drain", "--database-url", db_url, "--tasks", "asyncy")
    assert result.returncode == 0, result.stderr
    assert summary_of(result.stdout)["no_task"] == []
    assert "no task drains" not in result.stderr


def test_the_list_is_bounded_and_sorted_and_runs_add_theirs_up(conn):
    names = [f"stray-{n:02}" for n in range(MAX_NO_TASK + 5)]
    for name in reversed(names):
        drainer.enqueue(conn, name, {})
    summary = drainer.drain(conn, {"a": lambda job: None}, drainer.Options(["a"]))
    assert summary.no_task == names[:MAX_NO_TASK]
    assert summary.as_json()["no_task"] == names[:MAX_NO_TASK]
    later = run.Summary(no_task=["another", "stray-00"])
    assert summary.plus(later).no_task == ["another", *names[:MAX_NO_TASK]]


def test_drain_now_names_them_too(drainer_conn):
    drainer.enqueue(drainer_conn, "emial", {})
    with testing.separate_tasks():
        drainer.task("email")(lambda job: None)
        assert testing.drain_now(drainer_conn).no_task == ["emial"]
        with drainer_conn.transaction():
            summary = testing.drain_now(drainer_conn, in_transaction=True)
        assert summary.no_task == ["emial"]


def test_doctor_with_task_modules_reports_them_as_a_problem(conn, db_url):
    enqueue_strays(conn)
    healthy = run_cli("doctor", "--database-url", db_url)  # no tasks named: not checked
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    found = run_cli("doctor", "--database-url", db_url, "--tasks", "asyncy", "--json")
    assert found.returncode == 1, found.stdout + found.stderr
    [finding] = [f for f in json.loads(found.stdout)["findings"] if f["check"] == "no_task"]
    assert finding["severity"] == "problem"
    assert "emial, sms-typo" in finding["summary"] and "async," not in finding["summary"]
    text = run_cli("doctor", "--database-url", db_url, "--tasks", "asyncy")
    assert "problem: no_task: ready jobs in queues no task drains: emial, sms-typo" in text.stdout
