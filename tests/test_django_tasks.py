"""Django's Tasks framework on drainer (drainer.contrib.django): tasks enqueued in the
app's atomic() block commit and roll back with its rows, with their queue, priority and
run_after; `drainer drain --tasks drainer.contrib.django` runs them (sync, async, with
context, through Django's connection); get_result() reads back each state, return
value and error; what the backend cannot run is InvalidTask. The project is
tests/djangoproject, run in processes of its own (Django's settings are per process).
On Django 6 the framework is django.tasks; before, the django-tasks backport."""

import json
import subprocess
import sys
from datetime import UTC, datetime

import psycopg
import pytest

from tests.helpers import clean_env, require_module, run_cli

django = require_module("django", "django")
if django.VERSION < (6,):
    require_module("django_tasks", "django")  # Django 6's Tasks framework, backported

SETTINGS = "tests.djangoproject.settings"


def env(db_url: str, **settings: str) -> dict[str, str]:
    backport = {"DRAINER_DJANGO_BACKPORT": "1"} if django.VERSION < (6,) else {}
    return clean_env(DJANGO_SETTINGS_MODULE=SETTINGS, DRAINER_DJANGO_DATABASE_URL=db_url,
                     **backport, **settings)


def app(db_url: str, *args: str, **settings: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "tests.djangoproject.app", *args], text=True,
                          capture_output=True, env=env(db_url, **settings), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def project(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute("CREATE TABLE orders (note text NOT NULL)")
    return conn


def test_tasks_enqueue_with_the_apps_data_run_in_a_drain_and_report_results(project, db_url):
    ids = app(db_url, "enqueue")
    assert ids["first_status"] == "READY" and ids["first_backend"] == "default"
    # Only the committed block's row and tasks are there.
    assert [n for (n,) in project.execute("SELECT note FROM orders")] == ["kept"]
    assert project.execute("SELECT count(*) FROM jobs WHERE id = %s",
                           [int(ids["lost"])]).fetchone()[0] == 0
    jobs = {str(i): (q, p, payload, run_at) for i, q, p, payload, run_at in project.execute(
        "SELECT id, queue, priority, payload, run_at FROM jobs")}
    assert jobs[ids["send"]][:3] == ("emails", 7, {
        "task": "tests.djangoproject.tasks.send", "backend": "default",
        "args": ["ann@example.com"], "kwargs": {}})
    assert jobs[ids["add"]][:2] == ("default", 0)
    queue, priority, _, run_at = jobs[ids["deferred"]]
    assert (queue, priority) == ("default", -5)
    assert run_at == datetime.fromisoformat(ids["run_after"])

    names = ["add", "send", "explode", "later", "database", "attempt", "deferred"]
    before = app(db_url, "results", *(ids[n] for n in names))
    assert {before[ids[n]]["status"] for n in names} == {"READY"}
    assert before[ids["add"]]["args"] == [2, 3] and before[ids["add"]]["errors"] == []

    drain = run_cli("drain", "--database-url", db_url, "--tasks", "drainer.contrib.django",
                    env=env(db_url))
    assert drain.returncode == 0, drain.stderr
    assert "ValueError: no luck; failed for good" in drain.stderr  # Django tasks: 1 attempt
    after = app(db_url, "results", *(ids[n] for n in names))
    got = {n: after[ids[n]] for n in names}
    assert got["add"]["status"] == "SUCCESSFUL" and got["add"]["value"] == 5
    assert got["add"]["attempts"] == 1 and got["add"]["finished"] and got["add"]["enqueued"]
    assert got["send"]["value"] == {"sent": "ann@example.com"}
    assert got["send"]["queue"] == "emails" and got["send"]["priority"] == 7
    assert got["later"]["value"] == [21, 42]  # an async task
    assert got["database"]["value"] == psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    assert got["attempt"]["value"] == ["ctx", 1, ids["attempt"]]  # takes_context
    assert got["deferred"]["status"] == "READY"  # due in an hour
    failed = got["explode"]
    assert failed["status"] == "FAILED" and failed["finished"]
    (error,) = failed["errors"]
    assert error["path"] == "builtins.ValueError" and error["class"] == "ValueError"
    assert "Traceback" in error["traceback"] and "raise ValueError(why)" in error["traceback"]
    assert error["traceback"].rstrip().endswith("ValueError: no luck")
    assert after["via_task"] == "SUCCESSFUL"
    # Django's connections of the handler threads were closed after each job.
    assert project.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND pid <> pg_backend_pid()").fetchone()[0] == 0


def test_what_the_backend_refuses(project, db_url):
    refused = app(db_url, "invalid")
    assert refused["queue"].startswith("InvalidTask: Queue 'elsewhere'")
    assert refused["priority"].startswith("InvalidTask:")
    assert refused["naive"].startswith("InvalidTask:")
    assert refused["local"].startswith("InvalidTask:")
    assert refused["arguments"].startswith("TypeError:")  # as Django's own backends
    assert refused["nul"].startswith("InvalidTask:") and "NUL" in refused["nul"]
    assert refused["missing"] == "TaskResultDoesNotExist"
    assert project.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_without_use_tz_a_naive_run_after_is_meant_in_the_time_zone_setting(project, db_url):
    # drainer.enqueue refuses a naive run_at; Django without USE_TZ means it in TIME_ZONE.
    job = app(db_url, "naive", DRAINER_DJANGO_USE_TZ="0",
              DRAINER_DJANGO_TIME_ZONE="America/New_York")["id"]
    assert project.execute("SELECT run_at FROM jobs WHERE id = %s", [int(job)]).fetchone() == (
        datetime(2030, 1, 1, 17, tzinfo=UTC),)


def test_a_test_wrapped_in_a_transaction_drains_its_tasks_inside_it(project, db_url):
    """As in Django's TestCase: the tasks, and the rows the handlers read, are never
    committed; the handlers run in that transaction, which stays usable."""
    found = app(db_url, "in_test")
    assert (found["done"], found["failed"]) == (2, 0)
    assert found["add"] == ["SUCCESSFUL", 5]
    assert found["rows"] == ["in test"]  # the handler saw the uncommitted row
    assert found["open"] is True
    assert project.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
    assert project.execute("SELECT count(*) FROM orders").fetchone()[0] == 0
