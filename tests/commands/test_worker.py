"""`work`, the always-on worker: LISTEN wakes it at the producer's commit, the
fallback poll covers a dropped LISTEN connection, dropped connections come back,
SIGTERM stops it cleanly. Real processes on a real PostgreSQL."""

import contextlib
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

import drainer
from drainer import clock
from drainer.commands.work import work
from drainer.db import connect
from drainer.storage import roundtrip
from tests.helpers import clean_env, count, listeners, read_until, run_cli, wait_until

LISTEN_ROLE = "drainer_listener"  # not a superuser, so a connection limit applies to it


@contextlib.contextmanager
def worker(url: str, *args: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-m", "drainer", "work", "--tasks", "behave",
                             "--queue", "default", "--database-url", url, *args],
                            env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def stop(proc: subprocess.Popen) -> tuple[dict, str]:
    """SIGTERM; the exit must be clean: code 0, the totals as the last stdout line."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def idle_worker(conn: psycopg.Connection, tmp_path: Path) -> None:
    """Wait until the worker has drained a first job and listens: it is now waiting."""
    drainer.enqueue(conn, "default", {"touch": str(tmp_path / "warm-up")})
    wait_until(lambda: count(conn, "status = 'done'") == 1 and listeners(conn))


def test_a_notification_wakes_an_idle_worker_at_the_commit_not_before(conn, db_url, tmp_path):
    woken = tmp_path / "woken"
    with worker(db_url, "--poll-interval", "3600") as proc:  # only a notification can wake it
        idle_worker(conn, tmp_path)
        with psycopg.connect(db_url) as producer:  # one transaction, committed on exit
            drainer.enqueue(producer, "default", {"touch": str(woken)})
            time.sleep(1.5)  # time enough for a worker to react, were anything delivered
            assert not woken.exists()
        wait_until(woken.exists)
        wait_until(lambda: count(conn, "status = 'done'") == 2)
        totals, _ = stop(proc)
    assert (totals["done"], totals["stopped"]) == (2, "signal")


def test_sigterm_stops_an_idle_worker_and_leaves_no_session(conn, db_url, tmp_path):
    with worker(db_url, "--poll-interval", "3600") as proc:
        idle_worker(conn, tmp_path)
        totals, _ = stop(proc)
    assert totals["stopped"] == "signal" and totals["claimed"] == totals["done"] == 1
    sessions = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND pid <> pg_backend_pid()").fetchone()[0]
    assert sessions == 0


@pytest.fixture
def listen_role(server):
    with server.admin() as admin:
        admin.execute(f"DO $$ BEGIN CREATE ROLE {LISTEN_ROLE} LOGIN; "
                      "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        try:
            yield admin
        finally:
            admin.execute(f"ALTER ROLE {LISTEN_ROLE} CONNECTION LIMIT -1")


def test_a_dropped_listen_connection_reconnects_and_the_poll_covers_the_gap(
        server, listen_role, conn, db_url, tmp_path):
    dbname = conn.info.dbname
    admin = listen_role
    found = tmp_path / "found-by-the-poll"
    with worker(db_url, "--poll-interval", "1",
                "--listen-url", server.url(dbname, user=LISTEN_ROLE)) as proc:
        idle_worker(conn, tmp_path)
        [first] = listeners(conn)
        # Keep the listener out while it is gone, so only the poll can find new work.
        admin.execute(f"ALTER ROLE {LISTEN_ROLE} CONNECTION LIMIT 0")
        admin.execute("SELECT pg_terminate_backend(%s)", [first])
        wait_until(lambda: not listeners(conn))
        drainer.enqueue(conn, "default", {"touch": str(found)})
        wait_until(found.exists)
        assert not listeners(conn)  # the poll, not a notification, found it
        admin.execute(f"ALTER ROLE {LISTEN_ROLE} CONNECTION LIMIT -1")
        [again] = wait_until(lambda: listeners(conn))
        assert again != first and proc.poll() is None
        wait_until(lambda: count(conn, "status = 'done'") == 2)
        totals, err = stop(proc)
    assert totals["done"] == 2
    assert "LISTEN connection lost" in err and "LISTEN connection back" in err


def test_a_dropped_claim_connection_reconnects(conn, db_url, tmp_path):
    woken = tmp_path / "woken"
    with worker(db_url, "--poll-interval", "3600") as proc:
        idle_worker(conn, tmp_path)
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                     "current_database() AND application_name = 'drainer'")
        drainer.enqueue(conn, "default", {"touch": str(woken)})  # the notification wakes it
        wait_until(woken.exists)
        wait_until(lambda: count(conn, "status = 'done'") == 2)
        totals, err = stop(proc)
    assert totals["done"] == 2 and "database connection lost" in err


def test_a_delayed_job_wakes_the_worker_when_due_and_max_runtime_ends_it(conn, db_url):
    drainer.enqueue(conn, "default", {}, delay=1.5)  # before the worker listens: no hint
    with worker(db_url, "--poll-interval", "3600", "--max-runtime", "5") as proc:
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    totals = json.loads(out.strip().splitlines()[-1])
    assert (totals["done"], totals["stopped"]) == (1, "deadline")


def test_notifications_carry_the_queue_arrive_at_commit_and_merge(conn, db_url):
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN jobs")
        with conn.transaction():
            drainer.enqueue(conn, "mail", {})
            drainer.enqueue(conn, "mail", {})
            drainer.enqueue(conn, "sms", {})
            assert list(listener.notifies(timeout=0.5)) == []  # nothing before the commit
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=2)]
    assert got == ["mail", "sms"]  # identical notifications of one transaction merge


def test_an_always_on_worker_keeps_draining_plain_queues_near_its_deadline(conn, db_url):
    """`work` with --max-runtime and a limited queue whose task's timeout (60 s) is
    longer than the time left: its first drain said 'deadline' (the queue left out of
    the claim) though nothing was ready, work() returned at once, and a plain job
    enqueued a moment later waited for the next process."""
    task = drainer.Task(lambda job: None, "lim", concurrency=2, timeout=60)
    done, stop = threading.Event(), threading.Event()

    def opener() -> psycopg.Connection:
        return psycopg.connect(db_url, autocommit=True)

    thread = threading.Thread(target=lambda: work(
        opener, opener, {"lim": task, "plain": lambda job: done.set()},
        drainer.Options(queues=["plain", "lim"], concurrency=2,
                        deadline=clock.monotonic() + 20),
        poll_interval=1, stop=stop))
    thread.start()
    try:
        time.sleep(1.5)
        drainer.enqueue(conn, "plain", {})
        ran = done.wait(5)
    finally:
        stop.set()
        thread.join(30)
    assert ran


def test_an_always_on_worker_near_its_deadline_reaps_a_lease_that_expired_mid_drain(
        conn, db_url):
    """`work` near its deadline (a limited queue whose task's timeout, 60 s, is longer
    than the time left, is left out of every claim; it has no job at all). A dead
    drainer's plain job's lease expires while the worker's drain runs another job: the
    drain's end saw next_due = now (that expired lease, a plain queue's) and said
    'deadline', as if the left-out queue had a ready job, and work() returned at once:
    the reapable job waits for the next process. 'empty' would drain again, reap it
    and run it."""
    ran: list[str] = []
    drainer.enqueue(conn, "plain", {"who": "orphan"})
    with psycopg.connect(db_url, autocommit=True) as dead:  # claims, then dies
        [orphan] = roundtrip.claim(dead, ["plain"], 1, timedelta(seconds=1))
    drainer.enqueue(conn, "plain", {"who": "slow"})

    def plain(job):
        ran.append(job.payload["who"])
        if job.payload["who"] == "slow":
            time.sleep(1.5)  # the orphan's lease ends meanwhile

    task = drainer.Task(lambda job: None, "lim", concurrency=2, timeout=60)
    stop = threading.Event()

    def opener() -> psycopg.Connection:
        return psycopg.connect(db_url, autocommit=True)

    out: list = []
    thread = threading.Thread(target=lambda: out.append(work(
        opener, opener, {"lim": task, "plain": plain},
        drainer.Options(queues=["plain", "lim"], concurrency=2, deadline=clock.monotonic() + 25),
        poll_interval=1, stop=stop)))
    thread.start()
    try:
        deadline = time.monotonic() + 8
        while "orphan" not in ran and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
    assert "orphan" in ran, (ran, out, conn.execute(
        "SELECT status, attempts, locked_until < now() FROM jobs WHERE id = %s",
        (orphan.id,)).fetchone())


def test_an_always_on_worker_counts_what_a_drain_did_before_a_conflict(conn, db_url):
    """A drain that ended in a conflict (a deadlock at its archive step) had already
    written back a done and a failed job: `work` drains again, and its totals still
    count them, as the CLI reports a failed drain's work."""
    conn.execute("CREATE SEQUENCE conflicts")
    conn.execute("""
        CREATE FUNCTION conflict_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF nextval('conflicts') = 1 THEN
            RAISE EXCEPTION USING ERRCODE = 'deadlock_detected', MESSAGE = 'deadlock';
          END IF;
          RETURN OLD;
        END $$""")
    conn.execute("CREATE TRIGGER conflict_once BEFORE DELETE ON jobs "
                 "FOR EACH ROW EXECUTE FUNCTION conflict_once()")
    drainer.enqueue(conn, "default", {"fail": True}, max_attempts=1)
    drainer.enqueue(conn, "default", {})
    conn.execute("UPDATE jobs SET created_at = now() - interval '30 days'")  # to archive
    stop = threading.Event()

    class StopOnRetry(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "draining again" in record.getMessage():
                stop.set()

    def handler(job):
        if job.payload.get("fail"):
            raise RuntimeError("broken")

    def opener() -> psycopg.Connection:
        return psycopg.connect(db_url, autocommit=True)

    watcher = StopOnRetry()
    logging.getLogger("drainer.commands.work").addHandler(watcher)
    try:
        total = work(opener, opener, {"default": handler},
                     drainer.Options(queues=["default"]), poll_interval=1, stop=stop)
    finally:
        logging.getLogger("drainer.commands.work").removeHandler(watcher)
    assert stop.is_set()  # it did meet the conflict
    assert (total.claimed, total.done, total.failed) == (2, 1, 1)



def test_an_always_on_worker_counts_what_a_drain_did_before_its_database_went_away(
        conn, db_url):
    """A drain whose session dropped, and could not be opened again within its own
    retries, had already written back a job: `work` reconnects, and its totals still
    count that job, as they count a drain's work before a conflict."""
    first, second = (drainer.enqueue(conn, "default", {"n": n}) for n in (1, 2))
    opened: list[psycopg.Connection] = []
    refusals = [0]
    stop = threading.Event()

    def opener() -> psycopg.Connection:
        if refusals[0]:  # the drain's own retries, then work's first: the server is away
            refusals[0] -= 1
            raise drainer.DatabaseUnavailable("the database went away")
        opened.append(connect(db_url))
        return opened[-1]

    def handler(job):
        if job.id == second:  # the first is written back: drop the drain's session
            refusals[0] = 4
            with connect(db_url) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [opened[0].info.backend_pid])

    class StopOnReconnect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "database connection back" in record.getMessage():
                stop.set()

    watched = logging.getLogger("drainer.commands.work")
    watcher, level = StopOnReconnect(), watched.level
    watched.addHandler(watcher)
    watched.setLevel(logging.INFO)  # "database connection back" is an INFO line
    try:
        total = work(opener, lambda: connect(db_url), {"default": handler},
                     drainer.Options(queues=["default"], batch_size=1,
                                     deadline=clock.monotonic() + 60), poll_interval=1,
                     stop=stop)
    finally:
        watched.removeHandler(watcher)
        watched.setLevel(level)
    assert stop.is_set() and refusals[0] == 0  # it did lose the database, and came back
    assert count(conn, f"id = {first} AND status = 'done'") == 1
    # The second job's batch was never written back: in neither count, as in a drain's.
    assert (total.claimed, total.done) == (1, 1)

# --- drain and work totals --------------------------------------------------------------

def totals_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.match(r"drainer: (drained: )?done ", line)]


def shape(line: str) -> str:
    """The line's words: numbers and the stop reason left out."""
    return re.sub(r"stopped: \w+", "stopped: R", re.sub(r"\d[\d.,]*", "N", line))


def test_drain_and_work_log_their_totals_in_the_same_words(db_url):
    with connect(db_url) as conn:
        conn.execute("INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, 3)")
    drained = run_cli("drain", "--database-url", db_url, "--tasks", "noop")
    assert drained.returncode == 0, drained.stderr
    [drain_end] = totals_lines(drained.stderr)

    with connect(db_url) as conn:
        conn.execute("INSERT INTO jobs (payload) SELECT '{}' FROM generate_series(1, 3)")
    proc = subprocess.Popen([sys.executable, "-m", "drainer", "work", "--database-url", db_url,
                             "--tasks", "noop"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=clean_env())
    try:
        seen = read_until(proc, b"drained: ")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (seen + err).decode()
    each, work_end = totals_lines((seen + err).decode())

    assert drain_end.startswith("drainer: done 3  retried 0  failed 0  lost 0  ")
    assert drain_end.endswith(", stopped: empty")
    assert work_end.startswith("drainer: done 3  retried 0  failed 0  lost 0  ")
    assert work_end.endswith(", stopped: signal")
    assert shape(work_end) == shape(drain_end)
    assert shape(each) == shape(drain_end).replace("drainer: ", "drainer: drained: ").replace(
        ", stopped: R", "")
    assert json.loads(out.decode().splitlines()[-1])["done"] == 3
