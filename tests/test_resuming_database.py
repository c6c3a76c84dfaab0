"""A database resuming from a pause: `drainer drain` through a proxy that refuses,
holds silent or drops its connections for a while. The drain waits within
--connect-timeout, then connects, drains and reports; past the budget, or past a
shorter --max-runtime, it exits 3 with one line. Real processes, as users run it;
each attempt is given 2 s (libpq's connect_timeout in the URL)."""

import subprocess
import sys

import psycopg
import pytest

import drainer
from tests.helpers import clean_env, count, read_until, run_cli, summary_of, wait_until

JOBS = 5
SECRET = "s3cret-while-resuming"
WAITING = "waiting for the database"


def through(proxy, db_url: str) -> str:
    """The URL of `db_url` through the proxy, each attempt given 2 s; with a password,
    which no line may show (the server does not ask for it)."""
    return proxy.url(db_url) + f" connect_timeout=2 password={SECRET}"


@pytest.fixture
def queued(conn) -> int:
    drainer.enqueue_many(conn, "default", [{}] * JOBS)
    return JOBS


@pytest.mark.parametrize("mode", ["refuse", "silent", "drop"])
def test_the_drain_waits_for_the_database_then_drains(proxy, db_url, conn, queued, mode):
    proxy.set(mode)
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainer", "drain", "--database-url", through(proxy, db_url),
         "--tasks", "noop", "--connect-timeout", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    seen = read_until(proc, WAITING.encode())  # an attempt failed, and it waits
    if mode != "refuse":  # it tried again after that (refused ones never reach the proxy)
        wait_until(lambda: proxy.accepted[mode] >= 2, timeout=60)
    proxy.set("forward")  # the database is up
    out, err = proc.communicate(timeout=120)
    err = seen.decode() + err.decode()
    assert proc.returncode == 0, err
    assert summary_of(out.decode())["done"] == queued == count(conn, "status = 'done'")
    assert err.count(WAITING) == 1 and "Traceback" not in err and SECRET not in err


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    """Stderr's lines after the one saying it waits, which comes first."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert WAITING in lines[0], result.stderr
    return lines[1:]


@pytest.mark.parametrize("mode", ["refuse", "silent", "drop"])
def test_past_the_budget_the_drain_exits_3_with_one_line(proxy, db_url, conn, queued, mode):
    proxy.set(mode)
    result = run_cli("drain", "--database-url", through(proxy, db_url), "--tasks", "noop",
                     "--connect-timeout", "3")
    assert result.returncode == 3, result.stderr
    [line] = error_lines(result)
    assert line.startswith("drainer: error: database unavailable")
    assert line.endswith("it was tried for 3 s (the connect timeout)")
    if mode != "refuse":
        assert proxy.accepted[mode] >= 2  # tried again within the budget
    assert result.stdout == "" and count(conn, "status = 'queued'") == queued
    assert SECRET not in result.stderr


def test_a_deadline_shorter_than_the_budget_wins(proxy, db_url, conn, queued):
    proxy.set("refuse")
    # By --connect-timeout it would wait 10 minutes; run_cli gives up after 2.
    result = run_cli("drain", "--database-url", through(proxy, db_url), "--tasks", "noop",
                     "--connect-timeout", "600", "--max-runtime", "3")
    assert result.returncode == 3, result.stderr
    [line] = error_lines(result)
    assert line.endswith("it was tried until the run's deadline")
    assert count(conn, "status = 'queued'") == queued


def test_with_no_budget_one_attempt_fails_at_once(proxy, db_url):
    proxy.set("refuse")
    result = run_cli("drain", "--database-url", through(proxy, db_url), "--tasks", "noop",
                     env=clean_env(DRAINER_CONNECT_TIMEOUT="0"))
    assert result.returncode == 3
    assert result.stderr.startswith("drainer: error: database unavailable")
    assert WAITING not in result.stderr and "tried" not in result.stderr


def test_a_database_that_does_not_exist_is_not_waited_for(proxy, db_url):
    missing = psycopg.conninfo.make_conninfo(through(proxy, db_url), dbname="no_such_db")
    result = run_cli("drain", "--database-url", missing, "--tasks", "noop",
                     "--connect-timeout", "600")
    assert result.returncode == 3 and WAITING not in result.stderr
    assert "does not exist" in result.stderr
