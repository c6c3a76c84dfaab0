"""What a drain leaves on the database: no open transaction while a handler works,
no session after exit, at most 4 statements for an empty queue, and a session that
lives no longer than its handlers and its SQL take."""

import time

import psycopg
import pytest

import drainer
from drainer.db import APPLICATION_NAME, connect
from tests.conftest import run_cli
from tests.test_processes import drainer_process, summary_of, wait_for


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
    wait_for(touch)
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


def test_an_empty_queue_run_sends_at_most_4_statements(server, db_url):
    with server.admin() as admin:
        try:
            admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            admin.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error:
            pytest.skip("pg_stat_statements is not preloaded on this server")
    result = run_cli("drain", "--database-url", db_url, "--tasks", "noop")
    assert result.returncode == 0, result.stderr
    assert summary_of(result.stdout)["stopped"] == "empty"
    with server.admin() as admin:
        calls = admin.execute(
            "SELECT s.query, s.calls FROM pg_stat_statements s JOIN pg_database d "
            "ON d.oid = s.dbid WHERE d.datname = %s", (dbname_of(db_url),)).fetchall()
    assert sum(n for _, n in calls) <= 4, calls
    assert any("FOR UPDATE SKIP LOCKED" in q for q, _ in calls)  # it did look for work


def database_times(server, dbname: str, sessions: int) -> tuple[float, float]:
    """(session_time, active_time) in ms of `dbname`'s ended sessions, once `sessions`
    of them have ended and none is connected (statistics arrive as backends exit)."""
    with server.admin() as admin:
        for _ in range(200):
            admin.execute("SELECT pg_stat_clear_snapshot()")
            connected, ended, session_ms, active_ms = admin.execute(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = d.datname),"
                " sessions, session_time, active_time FROM pg_stat_database d"
                " WHERE datname = %s", (dbname,)).fetchone()
            if not connected and ended >= sessions:
                return session_ms, active_ms
            time.sleep(0.05)
    raise AssertionError(f"{dbname}: {connected} sessions connected, {ended} ended")


def test_the_run_is_active_only_while_its_handlers_and_its_sql_run(server, db_url):
    """The activity window a scale-to-zero compute sees (the session's life, from
    connecting to its last state change) is the handlers' time plus the SQL's, within
    50 ms: the drainer itself never keeps the compute awake."""
    jobs, sleep = 3, 0.2
    with connect(db_url) as conn:
        for _ in range(jobs):
            drainer.enqueue(conn, "default", {"sleep": sleep})
    name = dbname_of(db_url)
    window_before, sql_before = database_times(server, name, sessions=1)
    result = run_cli("drain", "--database-url", db_url, "--tasks", "behave")
    assert result.returncode == 0, result.stderr
    assert summary_of(result.stdout)["done"] == jobs
    window_after, sql_after = database_times(server, name, sessions=2)
    window = (window_after - window_before) / 1000
    sql = (sql_after - sql_before) / 1000
    handlers = jobs * sleep
    assert window >= handlers  # it is the drain's session we measured
    assert window - handlers - sql < 0.050, (window, handlers, sql)
