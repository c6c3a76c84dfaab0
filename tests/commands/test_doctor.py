"""`doctor` on a real PostgreSQL: each problem staged for real is flagged with what to
do, and a healthy database reports nothing."""

import json
import os
import threading
import time
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer.commands import doctor
from tests.helpers import run_cli

LEASE = timedelta(minutes=5)


def run_doctor(url: str, *args: str) -> tuple[int, dict]:
    proc = run_cli("doctor", "--json", "--database-url", url, *args)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def checks(report: dict) -> dict[str, dict]:
    return {f["check"]: f for f in report["findings"]}


def test_a_healthy_database_reports_nothing(db_url):
    code, report = run_doctor(db_url)
    assert (code, report) == (0, {"problems": 0, "notes": 0, "findings": []})
    text = run_cli("doctor", "--database-url", db_url)
    assert (text.returncode, text.stdout.strip()) == (0, "doctor: no problem found")


def test_an_open_transaction_and_the_dead_tuples_it_holds_back(conn, db_url):
    # Autovacuum would remove the dead tuples once the holder is gone, before the
    # second look (seen on a loaded machine): only the test's VACUUMs may.
    conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = off)")
    drainer.enqueue_many(conn, "default", ({"i": i} for i in range(3000)))
    with psycopg.connect(db_url, application_name="forgetful") as holder:
        # The seed's pitfall: a claim left uncommitted while "working".
        [held] = drainer.claim(holder, ["default"], 1, LEASE)
        conn.execute("UPDATE jobs SET status = 'done' WHERE id <> %s AND id <= 2001", [held.id])
        conn.execute("SELECT pg_stat_force_next_flush()")  # counts reach the stats before VACUUM
        conn.execute("VACUUM jobs")  # the seed: "2000 are dead but not yet removable"
        time.sleep(doctor.IDLE_IN_TRANSACTION + 0.2)
        code, report = run_doctor(db_url)
        holder_pid = holder.info.backend_pid
    found = checks(report)
    assert code == 1
    [session] = found["open_transaction"]["details"]
    assert (session["pid"], session["application_name"]) == (holder_pid, "forgetful")
    assert "vacuum cannot remove" in found["open_transaction"]["summary"]
    assert "idle_in_transaction_session_timeout" in found["open_transaction"]["advice"]
    assert found["dead_tuples"]["details"][0]["n_dead_tup"] >= 2000
    assert set(checks(run_doctor(db_url)[1])) == {"dead_tuples"}  # committed, not vacuumed
    conn.execute("VACUUM jobs")  # the seed: "2001 removed"
    conn.close()  # else this test's own recent queries are a poller's
    assert run_doctor(db_url) == (0, {"problems": 0, "notes": 0, "findings": []})


def test_a_missing_ready_index(conn, db_url):
    conn.execute("DROP INDEX jobs_ready_idx")
    code, report = run_doctor(db_url)
    assert code == 1
    finding = checks(report)["claim_plan"]
    assert "missing" in finding["summary"] and "CREATE INDEX" in finding["advice"]


def test_a_claim_plan_that_does_not_use_the_ready_index(conn, db_url):
    drainer.enqueue_many(conn, "default", ({"i": i} for i in range(5000)))
    conn.execute("ANALYZE jobs")
    assert run_doctor(db_url)[1]["findings"] == []  # the planner uses the index
    dbname = conn.info.dbname
    for setting in ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"):
        conn.execute(f'ALTER DATABASE "{dbname}" SET {setting} = off')
    finding = checks(run_doctor(db_url)[1])["claim_plan"]
    assert "Seq Scan on jobs" in finding["details"][0]["scans"]


def test_an_expired_lease_and_an_old_ready_job(conn, db_url):
    drainer.enqueue(conn, "default", {})
    drainer.claim(conn, ["default"], 1, LEASE)
    conn.execute("UPDATE jobs SET locked_until = now() - interval '10 minutes'")
    drainer.enqueue(conn, "default", {}, delay=-7200)
    code, report = run_doctor(db_url)
    found = checks(report)
    assert code == 1 and set(found) == {"expired_leases", "oldest_ready"}
    assert "drainer reap" in found["expired_leases"]["advice"]
    assert run_doctor(db_url, "--max-ready-age", "10000")[1]["findings"][0]["check"] == (
        "expired_leases")


@pytest.fixture
def poller(db_url):
    """A health check: SELECT 1 every 0.1 s on a long-lived connection."""
    done = threading.Event()

    def poll() -> None:
        with psycopg.connect(db_url, autocommit=True, application_name="health-check") as c:
            while not done.wait(0.1):
                c.execute("SELECT 1")

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(1.5)
    yield
    done.set()
    thread.join()


def test_a_polling_session_keeps_the_compute_awake(poller, db_url):
    code, report = run_doctor(db_url)
    finding = checks(report)["recurring_queries"]
    assert code == 1
    assert [d["application_name"] for d in finding["details"]] == ["health-check"]
    assert "suspend timeout" in finding["summary"]


def test_a_listen_session_is_a_note(db_url):
    with psycopg.connect(db_url, autocommit=True, application_name="listener") as listener:
        listener.execute("LISTEN jobs")
        code, report = run_doctor(db_url)
    assert code == 0  # a note alone is no problem
    [finding] = report["findings"]
    assert (finding["check"], finding["severity"]) == ("listen_sessions", "note")
    assert finding["details"][0]["application_name"] == "listener"


PASSWORD = "hunter2-secret"


def parts(secret: str, size: int = 4) -> list[str]:
    """Every piece of `secret` long enough to give it away."""
    return [secret[i:i + size] for i in range(len(secret) - size + 1)]


@pytest.mark.parametrize("query, shown", [
    ("ALTER ROLE app PASSWORD 'hunter2-secret'", "ALTER ROLE app PASSWORD '***'"),
    ("SELECT 'it''s', x FROM t WHERE y = 'z'", "SELECT '***', x FROM t WHERE y = '***'"),
    ("SELECT E'a\\'b\\\\', 'c'", "SELECT E'***', '***'"),
    ("SELECT e'\\\\' || 'x'", "SELECT e'***' || '***'"),
    ("DO $fn$ BEGIN RAISE 'x'; END $fn$; SELECT $$y$$", "DO $fn$***$fn$; SELECT $$***$$"),
    # Parameters, and an identifier's $, start no quote; the last $x$ opens one.
    ("SELECT $1, $2::text FROM t WHERE a$b$ = $x$c", "SELECT $1, $2::text FROM t WHERE "
     "a$b$ = $x$***"),
    ('SELECT "it\'s" FROM "a""b" WHERE c = \'d\'', 'SELECT "it\'s" FROM "a""b" WHERE c = \'***\''),
    ("SELECT 1 -- the password is x\nFROM t /* a /* nested */ comment */ WHERE b",
     "SELECT 1 --***\nFROM t /*****/ WHERE b"),
    ("SELECT 'cut off mid-liter", "SELECT '***"),
    ("SELECT E'cut \\' off", "SELECT E'***"),
    ("SELECT $q$cut off", "SELECT $q$***"),
    ("LISTEN jobs", "LISTEN jobs"),
    ("", ""),
])
def test_query_text_is_shown_without_its_literals_or_comments(query, shown):
    assert doctor.mask_literals(query) == shown


@pytest.mark.parametrize("query", [
    f"ALTER ROLE app PASSWORD '{PASSWORD}'",
    f"ALTER ROLE app PASSWORD E'\\'{PASSWORD}\\''",
    f"ALTER ROLE app PASSWORD $pw${PASSWORD}$pw$",
    f"ALTER ROLE app PASSWORD $${PASSWORD}$$",
    # Either reading of a backslash in a plain literal: standard_conforming_strings on
    # (the literal ends at the first quote), and off (\\' is a quote inside it).
    f"ALTER ROLE app PASSWORD 'a\\', '{PASSWORD}'",
    f"ALTER ROLE app PASSWORD 'a\\'{PASSWORD}'",
    f"SELECT 1 -- {PASSWORD}\n",
    f"SELECT /* {PASSWORD} */ 1",
])
def test_no_piece_of_a_literal_is_shown_wherever_the_text_is_cut(query):
    for end in range(len(query) + 1):  # doctor shows the first 200 characters
        masked = doctor.mask_literals(query[:end])
        assert not any(part in masked for part in parts(PASSWORD)), masked


@pytest.fixture
def role(server):
    name = f"someone_{os.getpid()}"
    with server.admin() as admin:
        admin.execute(f'CREATE ROLE "{name}"')
    yield name
    with server.admin() as admin:
        admin.execute(f'DROP ROLE "{name}"')


def test_doctor_never_shows_a_password_from_another_sessions_query(db_url, role):
    with psycopg.connect(db_url, application_name="rotating") as holder:
        holder.execute(f"ALTER ROLE \"{role}\" PASSWORD '{PASSWORD}'")  # BEGIN; left open
        time.sleep(doctor.IDLE_IN_TRANSACTION + 0.2)
        text = run_cli("doctor", "--database-url", db_url)
        as_json = run_cli("doctor", "--json", "--database-url", db_url)
        holder.rollback()
    for result in (text, as_json):
        assert result.returncode == 1, result.stderr
        shown = result.stdout + result.stderr
        assert "PASSWORD '***'" in shown and "rotating" in shown  # the session is there
        assert not any(part in shown for part in parts(PASSWORD)), shown
