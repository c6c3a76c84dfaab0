"""drainer.testing: the reset of drainer's per-process state between tests, a task
registry of a test's own, and the helpers for users' tests (drain_now, enqueued,
assert_enqueued). The AWS parts: tests/aws/test_reset.py; the pytest plugin:
tests/test_testing_plugin.py."""

import subprocess
import sys
import threading
from unittest import mock

import psycopg
import pytest

import drainer
from drainer import tasks, testing
from tests.helpers import clean_env, require_module, wait_until


def handler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "drainer-handler"]


def test_importing_drainer_leaves_it_out_and_reset_imports_nothing_more():
    check = ("import sys, drainer; assert 'drainer.testing' not in sys.modules; "
             "import drainer.testing; drainer.testing.reset(); "
             "print(sorted(m for m in sys.modules if m.startswith(('drainer.aws', 'boto'))))")
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          env=clean_env())
    assert (proc.returncode, proc.stdout) == (0, "[]\n"), proc.stderr


def test_reset_ends_the_handler_threads_kept_for_the_next_batch(conn):
    earlier = set(handler_threads())  # an earlier test's, still in a written-off handler
    drainer.enqueue_many(conn, "default", [{}] * 8)
    summary = drainer.drain(conn, {"default": lambda job: None},
                            drainer.Options(queues=["default"], concurrency=4))
    assert summary.done == 8 and set(handler_threads()) - earlier  # idle, kept
    testing.reset()
    wait_until(lambda: not set(handler_threads()) - earlier)
    drainer.enqueue(conn, "default", {})
    assert drainer.drain(conn, {"default": lambda job: None},
                         drainer.Options(queues=["default"])).done == 1  # new threads


def test_separate_tasks_hides_the_registry_and_forgets_what_the_block_registered():
    before = tasks.registered()
    with testing.separate_tasks():
        assert tasks.registered() == {}
        drainer.task("separate")(lambda job: None)
        assert list(tasks.registered()) == ["separate"]
    assert tasks.registered() == before


# drain_now, enqueued, assert_enqueued: the helpers for users' tests.

def test_drain_now_runs_the_registered_tasks_and_refuses_a_connection_in_a_transaction(
        drainer_conn, db_url):
    sent = []
    with testing.separate_tasks():
        drainer.task("email")(lambda job: sent.append(job.payload["to"]))
        drainer.enqueue(drainer_conn, "email", {"to": "ada@example.com"})
        summary = testing.drain_now(drainer_conn)
        assert (summary.done, summary.stopped, sent) == (1, "empty", ["ada@example.com"])
        with psycopg.connect(db_url) as in_transaction:  # not autocommit
            drainer.enqueue(in_transaction, "email", {"to": "bob@example.com"})
            with pytest.raises(drainer.ConfigError, match="in_transaction=True"):
                testing.drain_now(in_transaction)


def test_drain_now_in_transaction_runs_uncommitted_jobs_with_every_outcome_in_it(
        drainer_conn, db_url):
    threads = []

    def flaky(job):
        threads.append(threading.current_thread())
        if job.payload["fail"]:
            raise ValueError("no such address")

    with psycopg.connect(db_url) as app:  # the app's transaction, never committed
        drainer.enqueue(app, "email", {"fail": False})
        drainer.enqueue(app, "email", {"fail": True})  # retried with backoff
        drainer.enqueue(app, "email", {"fail": True}, max_attempts=1)  # failed for good
        summary = testing.drain_now(app, handlers={"email": flaky}, in_transaction=True)
        assert (summary.claimed, summary.done, summary.retried, summary.failed) == (3, 1, 1, 1)
        assert threads == [threading.current_thread()] * 3  # on the caller's thread
        rows = app.execute("SELECT status, attempts, run_at > now(), last_error FROM jobs "
                           "ORDER BY id").fetchall()
        assert rows == [("done", 1, False, None),
                        ("queued", 1, True, "ValueError: no such address"),
                        ("failed", 1, False, "ValueError: no such address")]
        assert summary.next_due == app.execute("SELECT run_at FROM jobs WHERE id = 2").fetchone()[0]
        [retry] = testing.assert_enqueued(app, "email", payload={"fail": True})
        assert retry.attempts == 1
        assert testing.enqueued(drainer_conn) == []  # nothing committed
        app.rollback()
    assert drainer_conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0


def test_drain_now_in_transaction_needs_an_open_transaction_on_an_autocommit_connection(
        drainer_conn):
    with pytest.raises(drainer.ConfigError, match="has none"):
        testing.drain_now(drainer_conn, handlers={"email": print}, in_transaction=True)
    with drainer_conn.transaction():
        drainer.enqueue(drainer_conn, "email", {})
        assert testing.drain_now(drainer_conn, handlers={"email": lambda job: None},
                                 in_transaction=True).done == 1
    assert drainer_conn.execute("SELECT status FROM jobs").fetchall() == [("done",)]


def test_assert_enqueued_matches_what_is_given_and_says_what_is_queued_when_it_fails(
        drainer_conn):
    drainer.enqueue(drainer_conn, "email", {"to": "ada@example.com"})
    drainer.enqueue(drainer_conn, "email", {"to": "ada@example.com"}, key="welcome",
                    priority=5, group="ada")
    drainer.enqueue(drainer_conn, "report", {"month": 3})
    assert len(testing.assert_enqueued(drainer_conn, "email", count=2)) == 2
    [keyed] = testing.assert_enqueued(drainer_conn, "email", key="welcome", priority=5,
                                      group="ada", payload={"to": mock.ANY})
    assert (keyed.queue, keyed.payload, keyed.attempts) == ("email", {"to": "ada@example.com"}, 0)
    assert [job.queue for job in testing.enqueued(drainer_conn)] == ["email", "email", "report"]

    with pytest.raises(AssertionError) as failed:
        testing.assert_enqueued(drainer_conn, "email", payload={"to": "bob@example.com"})
    assert str(failed.value) == (
        "expected a job queued in 'email' with payload={'to': 'bob@example.com'}, found 0\n"
        "queued in 'email' (2):\n"
        "  id 1: payload={'to': 'ada@example.com'}\n"
        "  id 2: payload={'to': 'ada@example.com'}  key='welcome'  priority=5  group='ada'")
    with pytest.raises(AssertionError, match="expected 1 job queued in 'email', found 2"):
        testing.assert_enqueued(drainer_conn, "email", count=1)
    with pytest.raises(AssertionError, match=r"nothing is queued in 'emails'; queued elsewhere: "
                                             r"'email' \(2\), 'report' \(1\)"):
        testing.assert_enqueued(drainer_conn, "emails")


def test_drain_now_in_transaction_claims_a_limited_queue_within_its_limits(
        drainer_conn, db_url, declared):
    """A limited claim inside the test's transaction is a savepoint: it takes the
    limits' locks there and cannot set its own isolation level (read committed
    elsewhere), which would fail in a repeatable read transaction."""
    ran = []

    @drainer.task("capped", concurrency=1, per_group=1)
    def capped(job):
        ran.append(job.id)

    with psycopg.connect(db_url) as app:
        app.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        for group in ("a", "a", "b"):
            drainer.enqueue(app, "capped", {}, group=group)
        summary = testing.drain_now(app, in_transaction=True)
        assert (summary.claimed, summary.done) == (3, 3)
        assert ran == sorted(ran)  # one at a time, in enqueue order
        app.rollback()


@pytest.mark.parametrize("through", ["connection", "session"])
def test_the_helpers_on_sqlalchemy_on_psycopg_3(db_url, through):
    """enqueued, assert_enqueued and drain_now(in_transaction=True) on a SQLAlchemy
    Connection or Session, as on psycopg's: a handler whose statement fails is a
    failed attempt, and the transaction goes on."""
    sqlalchemy = require_module("sqlalchemy", "drivers")
    from sqlalchemy.orm import Session

    from tests.storage.test_drivers import sqlalchemy_url

    engine = sqlalchemy.create_engine(sqlalchemy_url(db_url, "psycopg"))
    try:
        with engine.connect() as connection:
            app = connection if through == "connection" else Session(bind=connection)
            app.execute(sqlalchemy.text("CREATE TEMP TABLE notes (note text UNIQUE)"))
            drainer.enqueue(app, "notes", "taken", key="k", max_attempts=1)
            drainer.enqueue(app, "notes", "taken", max_attempts=1)
            [job] = testing.assert_enqueued(app, "notes", key="k", count=1)
            assert job.payload == "taken" and len(testing.enqueued(app)) == 2

            def insert(job):
                app.execute(sqlalchemy.text("INSERT INTO notes VALUES (:n)"), {"n": job.payload})

            summary = testing.drain_now(app, handlers={"notes": insert}, in_transaction=True)
            assert (summary.done, summary.failed) == (1, 1)
            assert app.execute(sqlalchemy.text("SELECT count(*) FROM notes")).scalar() == 1
            connection.rollback()
    finally:
        engine.dispose()


def test_the_helpers_refuse_psycopg_2_saying_so(db_url):
    psycopg2 = require_module("psycopg2", "drivers")
    pg2 = psycopg2.connect(db_url)
    try:
        with pytest.raises(drainer.ConfigError, match="not one of psycopg 2"):
            testing.enqueued(pg2)
    finally:
        pg2.close()


def test_the_helpers_read_a_connection_whose_rows_are_dicts(db_url):
    """enqueued and assert_enqueued on a connection with a row factory of the app's
    (dict_row): their rows are drainer's, whatever the connection gives."""
    from psycopg.rows import dict_row

    with psycopg.connect(db_url, row_factory=dict_row) as app:
        drainer.enqueue(app, "email", {"to": "ada@example.com"}, priority=2)
        [job] = testing.assert_enqueued(app, "email", payload={"to": "ada@example.com"})
        assert (job.queue, job.priority, job.attempts) == ("email", 2, 0)
        app.rollback()


class NoteAsync:
    """An async handler that is no `async def` (a callable object): its work, awaited
    after the call returns, is in the call's savepoint too."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, job):
        self.app.execute("INSERT INTO notes VALUES (%s)", [job.payload])


def test_drain_now_in_transaction_keeps_an_awaited_handlers_work_in_its_savepoint(db_url):
    with psycopg.connect(db_url) as app:
        app.execute("CREATE TEMP TABLE notes (note text UNIQUE)")
        for note in ("taken", "taken", "new"):
            drainer.enqueue(app, "notes", note, max_attempts=1)
        summary = testing.drain_now(app, handlers={"notes": NoteAsync(app)},
                                    in_transaction=True)
        assert (summary.done, summary.failed) == (2, 1)
        assert app.execute("SELECT count(*) FROM notes").fetchone()[0] == 2
        app.rollback()



def test_drain_now_in_transaction_goes_on_after_a_handler_that_commits(db_url):
    """A handler that commits the connection's transaction ends its savepoint with it:
    the drain goes on in the next transaction, as it did before savepoints."""
    with psycopg.connect(db_url) as app:
        for n in range(2):
            drainer.enqueue(app, "email", {"n": n})
        summary = testing.drain_now(app, handlers={"email": lambda job: app.commit()},
                                    in_transaction=True)
        assert (summary.done, summary.failed) == (2, 0)
        app.commit()
        assert app.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone()[0] == 2
