"""`drain --processes N` and `work --processes N`: N member processes, one summary
added up from theirs; members that end with the process that started them, on its
signals and after its kill -9."""

import json
import os
import signal
import subprocess
import sys

import pytest

import drainer
from drainer.commands.members import added_up, member_argv
from drainer.db import connect
from tests.helpers import limited_login, run_cli, summary_of, wait_until, with_modules

PIDS = """
import os, time
import psycopg
from drainer import task

@task("default")
def record(job):
    with psycopg.connect(os.environ["PIDS_URL"], autocommit=True) as conn:
        conn.execute("INSERT INTO pids VALUES (%s, %s)", [os.getpid(), job.id])
    time.sleep(float(job.payload.get("sleep", 0)))
"""


@pytest.fixture
def pids_env(tmp_path, db_url):
    with connect(db_url) as conn:
        conn.execute("CREATE TABLE pids (pid int, job bigint)")
    return {**with_modules(tmp_path, pids=PIDS), "PIDS_URL": db_url}


def members_of(db_url: str) -> set[int]:
    with connect(db_url) as conn:
        return {pid for (pid,) in conn.execute("SELECT DISTINCT pid FROM pids")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_members_share_the_work_and_report_once(db_url, pids_env):
    with connect(db_url) as conn:
        drainer.enqueue_many(conn, "default", [{"sleep": 0.02}] * 200)
    done = run_cli("drain", "--database-url", db_url, "--tasks", "pids", "--processes", "4",
                   env=pids_env)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.strip().splitlines()  # one summary, the members' added up
    summary = json.loads(line)
    assert (summary["claimed"], summary["done"], summary["stopped"]) == (200, 200, "empty")
    assert "drain with 4 processes" in done.stderr
    assert len(members_of(db_url)) == 4
    with connect(db_url) as conn:
        assert conn.execute("SELECT status, count(*), max(attempts) FROM jobs GROUP BY 1"
                            ).fetchall() == [("done", 200, 1)]
        assert conn.execute("SELECT count(*), count(DISTINCT job) FROM pids").fetchone() == (
            200, 200)


def test_members_end_with_their_parent_even_after_kill_9(db_url, pids_env):
    with connect(db_url) as conn:
        drainer.enqueue_many(conn, "default", [{"sleep": 1}] * 40)
    parent = subprocess.Popen(
        [sys.executable, "-m", "drainer", "drain", "--database-url", db_url, "--tasks",
         "pids", "--processes", "2", "--concurrency", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=pids_env)
    members = wait_until(lambda: len(members_of(db_url)) == 2 and members_of(db_url))
    parent.kill()  # SIGKILL: no word to the members
    parent.communicate(timeout=30)
    wait_until(lambda: not any(alive(pid) for pid in members), timeout=60)
    with connect(db_url) as conn:  # each finished what it ran and gave the rest back
        assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'"
                            ).fetchone()[0] == 0
        done = conn.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone()[0]
    assert 0 < done < 40


def test_sigterm_reaches_every_member_and_the_summary_adds_them_up(db_url, pids_env):
    with connect(db_url) as conn:
        drainer.enqueue_many(conn, "default", [{"sleep": 1}] * 40)
    parent = subprocess.Popen(
        [sys.executable, "-m", "drainer", "drain", "--database-url", db_url, "--tasks",
         "pids", "--processes", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=pids_env)
    wait_until(lambda: len(members_of(db_url)) == 2)
    parent.send_signal(signal.SIGTERM)
    out, err = parent.communicate(timeout=60)
    assert parent.returncode == 0, err
    summary = summary_of(out)
    assert summary["stopped"] == "signal"
    with connect(db_url) as conn:
        done = conn.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'"
                            ).fetchone()[0] == 0
    assert summary["done"] == done and 2 <= done < 40


def test_work_runs_as_members_too(db_url, pids_env):
    worker = subprocess.Popen(
        [sys.executable, "-m", "drainer", "work", "--database-url", db_url, "--tasks",
         "pids", "--processes", "2", "--poll-interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=pids_env)
    try:
        with connect(db_url) as conn:
            drainer.enqueue_many(conn, "default", [{"sleep": 0.2}] * 20)
        wait_until(lambda: len(members_of(db_url)) == 2, timeout=60)
        with connect(db_url) as conn:
            wait_until(lambda: conn.execute(
                "SELECT count(*) FROM jobs WHERE status = 'done'").fetchone()[0] == 20)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert summary_of(out)["done"] == 20


def test_a_bad_count_is_a_usage_error_and_auto_is_the_cpus(db_url):
    bad = run_cli("drain", "--database-url", db_url, "--tasks", "noop", "--processes", "0")
    assert bad.returncode == 2 and "--processes" in bad.stderr
    from drainer import settings

    assert settings.processes("auto") == len(os.sched_getaffinity(0))


def test_members_run_the_command_line_without_its_processes():
    assert member_argv(["drain", "--processes", "4", "--lease", "30"]) == [
        "drain", "--lease", "30"]
    assert member_argv(["work", "--processes=auto", "--tasks", "t"]) == [
        "work", "--tasks", "t"]


def test_the_summaries_add_up_with_the_strongest_stop_and_the_earliest_due():
    total = added_up([
        {"claimed": 3, "done": 2, "retried": 1, "stopped": "empty", "no_task": ["b"],
         "next_due": "2030-01-01T00:00:10+00:00"},
        {"claimed": 4, "done": 4, "stopped": "deadline", "no_task": ["a"],
         "next_due": "2030-01-01T00:00:05+00:00"},
        {"claimed": 1, "failed": 1, "stopped": "signal", "next_due": None},
    ])
    assert (total.claimed, total.done, total.retried, total.failed) == (8, 6, 1, 1)
    assert total.stopped == "deadline" and total.no_task == ["a", "b"]
    assert total.next_due.isoformat() == "2030-01-01T00:00:05+00:00"
    assert added_up([{"stopped": "signal"}, {"stopped": "empty"}]).stopped == "signal"
    assert added_up([]).stopped == "empty"


def test_members_stay_within_the_databases_session_budget(server, db_url, pids_env):
    """A role that takes 4 sessions, half of them drainer's (--budget-share 0.5): 2
    members, not the 8 asked, and no connection refused."""
    with connect(db_url) as conn:
        drainer.enqueue_many(conn, "default", [{"sleep": 0.01}] * 100)
        conn.execute("GRANT ALL ON ALL TABLES IN SCHEMA public TO PUBLIC")
        conn.execute("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO PUBLIC")
    with limited_login(server, db_url, "drainer_members", 4) as url:
        done = run_cli("drain", "--database-url", url, "--tasks", "pids", "--processes",
                       "8", "--budget-share", "0.5", env=pids_env)
    assert done.returncode == 0, done.stderr
    assert "2 processes instead of 8" in done.stderr
    assert "waiting for the database" not in done.stderr
    assert summary_of(done.stdout)["done"] == 100 and len(members_of(db_url)) == 2
