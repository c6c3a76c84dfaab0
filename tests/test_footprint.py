"""What a drain leaves on the database: no open transaction while a handler works,
no session after exit, at most 4 statements for an empty queue, and one session that
sends nothing while a handler runs and only its own statements in between."""

import time

import psycopg
import pytest

import drainer
from drainer.db import APPLICATION_NAME, connect
from tests.helpers import drainer_process, run_cli, summary_of, unavailable, wait_until


def sessions(server, dbname: str) -> list[str]:
    with server.admin() as admin:
        return [r[0] for r in admin.execute(
            "SELECT state FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (dbname, APPLICATION_NAME))]


def dbname_of(url: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(url)["dbname"]


def test_no_transaction_is_open_while_a_handler_works_and_none_remains(server, db_url,
                                                                        tmp_path):
    touch = tmp_path / "started"
    with connect(db_url) as conn:
        drainer.enqueue(conn, "default", {"touch": str(touch), "sleep": 1})
    proc = drainer_process(db_url, "--tasks", "behave")
    wait_until(touch.exists)
    assert sessions(server, dbname_of(db_url)) == ["idle"]  # not "idle in transaction"
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert summary_of(out)["done"] == 1
    # The backend of a closed connection leaves pg_stat_activity a moment after the
    # client exits; one left open would stay.
    settled = time.monotonic() + 1
    while sessions(server, dbname_of(db_url)) and time.monotonic() < settled:
        time.sleep(0.01)
    assert sessions(server, dbname_of(db_url)) == []


def reset_statement_counts(server) -> None:
    """Start pg_stat_statements' counts afresh; skip where it is not preloaded."""
    with server.admin() as admin:
        try:
            admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            admin.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error:
            unavailable("pg_stat_statements",
                        "pg_stat_statements is not preloaded on this server")


@pytest.mark.parametrize("stray", [[], ["emial"]])
def test_an_empty_queue_run_sends_at_most_4_statements(server, db_url, stray):
    # Ready jobs of a queue no task drains are named by a statement the run sends anyway.
    with connect(db_url) as conn:
        for queue in stray:
            drainer.enqueue(conn, queue, {})
    reset_statement_counts(server)
    result = run_cli("drain", "--database-url", db_url, "--tasks", "noop")
    assert result.returncode == 0, result.stderr
    assert summary_of(result.stdout)["stopped"] == "empty"
    assert summary_of(result.stdout)["no_task"] == stray
    with server.admin() as admin:
        calls = admin.execute(
            "SELECT s.query, s.calls FROM pg_stat_statements s JOIN pg_database d "
            "ON d.oid = s.dbid WHERE d.datname = %s", (dbname_of(db_url),)).fetchall()
    assert sum(n for _, n in calls) <= 4, calls
    assert any("FOR UPDATE SKIP LOCKED" in q for q, _ in calls)  # it did look for work


def statements(server, dbname: str) -> int:
    """Statements `dbname` has run since pg_stat_statements was reset (the admin
    session that asks is in another database, so it never counts itself), but for
    BEGIN and COMMIT, which it counts only when they are not prepared."""
    with server.admin() as admin:
        return admin.execute(
            "SELECT coalesce(sum(s.calls), 0)::bigint FROM pg_stat_statements s JOIN pg_database d "
            "ON d.oid = s.dbid WHERE d.datname = %s AND s.query !~ '^(BEGIN|COMMIT)'",
            (dbname,)).fetchone()[0]


def drain_session(server, dbname: str) -> tuple:
    """(state, in a transaction, last state change) of the drain's one session."""
    with server.admin() as admin:
        rows = admin.execute(
            "SELECT state, xact_start IS NOT NULL, state_change FROM pg_stat_activity "
            "WHERE datname = %s AND application_name = %s", (dbname, APPLICATION_NAME)
        ).fetchall()
    assert len(rows) == 1, rows
    return rows[0]


def idle_for(server, dbname: str, seconds: float) -> bool:
    """Whether the drain's one session has sent nothing for `seconds` by the database
    clock (since its last state change)."""
    with server.admin() as admin:
        return admin.execute(
            "SELECT clock_timestamp() - state_change >= make_interval(secs => %s) "
            "FROM pg_stat_activity WHERE datname = %s AND application_name = %s",
            (seconds, dbname, APPLICATION_NAME)).fetchone()[0]


def ended_sessions(server, dbname: str, at_least: int) -> int:
    """Sessions of `dbname` that have ended, once `at_least` have and none is connected
    (a backend's statistics arrive as it exits)."""
    with server.admin() as admin:
        for _ in range(400):
            admin.execute("SELECT pg_stat_clear_snapshot()")
            connected, ended = admin.execute(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = d.datname),"
                " sessions FROM pg_stat_database d WHERE datname = %s", (dbname,)).fetchone()
            if not connected and ended >= at_least:
                return ended
            time.sleep(0.05)
    raise AssertionError(f"{dbname}: {connected} sessions connected, {ended} ended")


def test_the_run_is_active_only_while_its_handlers_and_its_sql_run(server, db_url, tmp_path):
    """What a scale-to-zero compute sees of a drain, counted rather than timed: one
    session; while each handler runs it is idle, outside any transaction, and sends
    nothing (no statement, no state change); between two handlers it sends only the
    write-back and the next claim (one transaction), and after the last only the
    write-back, the empty claim, the archive and next_due, then closes."""
    jobs = 3
    started = [tmp_path / f"started-{i}" for i in range(jobs)]
    finish = [tmp_path / f"finish-{i}" for i in range(jobs)]
    with connect(db_url) as conn:
        for go, end in zip(started, finish, strict=True):
            drainer.enqueue(conn, "default", {"touch": str(go), "wait_for": str(end)})
    name = dbname_of(db_url)
    before = ended_sessions(server, name, at_least=1)  # the enqueueing session
    reset_statement_counts(server)
    # One job per batch: each handler follows a claim of its own.
    proc = drainer_process(db_url, "--tasks", "behave", "--batch-size", "1")
    try:
        for i in range(jobs):
            wait_until(started[i].exists)
            # start + claim, then per finished job: complete + the next claim
            assert statements(server, name) == 2 + 2 * i
            first = drain_session(server, name)
            assert first[:2] == ("idle", False)  # not "idle in transaction"
            # A while for anything the drain might send meanwhile: were it sent, the
            # counts and the state change below would differ.
            wait_until(lambda: idle_for(server, name, 0.2))
            assert statements(server, name) == 2 + 2 * i
            assert drain_session(server, name) == first  # not even a state change
            finish[i].touch()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failed assertion: no drainer left behind
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert summary_of(out)["done"] == jobs
    # complete + the empty claim, archive, next_due
    assert statements(server, name) == 2 + 2 * jobs + 2
    assert ended_sessions(server, name, at_least=before + 1) == before + 1  # one session
