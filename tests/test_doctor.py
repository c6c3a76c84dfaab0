"""`doctor` on a real PostgreSQL: each problem staged for real is flagged with what to
do, and a healthy database reports nothing."""

import json
import threading
import time
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer import doctor
from tests.conftest import run_cli

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
