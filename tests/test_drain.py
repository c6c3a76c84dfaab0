"""The drain loop in-process on a real PostgreSQL: outcomes, concurrency, leases,
takeovers, the deadline (driven by freezegun) and stop signals."""

import threading
import time
from datetime import timedelta

import psycopg
from freezegun import freeze_time

import drainer
from drainer import clock
from drainer.db import connect
from drainer.run import Options, Sizer, drain
from tests.conftest import count


def noop(job):
    pass


def states(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall())


def test_outcomes_are_recorded_and_summed(conn):
    def handler(job):
        if job.payload.get("fail"):
            raise RuntimeError("boom")

    drainer.enqueue_many(conn, "default", [{}] * 7)
    drainer.enqueue(conn, "default", {"fail": True})
    drainer.enqueue(conn, "default", {"fail": True}, max_attempts=1)
    drainer.enqueue(conn, "no-task", {})

    s = drain(conn, {"default": handler}, Options(queues=["default"]))

    assert (s.claimed, s.done, s.retried, s.failed, s.lost) == (9, 7, 1, 1, 0)
    assert s.stopped == "empty"
    assert states(conn) == {"done": 7, "queued": 2, "failed": 1}
    errors = {r[0] for r in conn.execute(
        "SELECT last_error FROM jobs WHERE last_error IS NOT NULL")}
    assert errors == {"RuntimeError: boom"}
    # the retry is 20 s away, and the other queue is not ours: next_due is the retry
    retry_at = conn.execute("SELECT run_at FROM jobs WHERE status = 'queued' AND attempts = 1"
                            ).fetchone()[0]
    assert s.next_due == retry_at


def test_archives_old_done_rows_at_the_end(conn):
    conn.execute("INSERT INTO jobs (payload, status, created_at) "
                 "VALUES ('{}', 'done', now() - interval '9 days')")
    s = drain(conn, {"default": noop}, Options(queues=["default"], archive_after=timedelta(days=7)))
    assert s.archived == 1 and s.next_due is None


def test_concurrency_runs_handlers_at_once(conn):
    lock, active, peak = threading.Lock(), [0], [0]

    def handler(job):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1

    drainer.enqueue_many(conn, "default", [{}] * 16)
    s = drain(conn, {"default": handler}, Options(queues=["default"], concurrency=4,
                                                  batch_size=8))
    assert s.done == 16 and peak[0] == 4


def test_a_handler_outliving_a_third_of_the_lease_keeps_its_job(conn, db_url):
    lease = timedelta(seconds=1.5)
    drainer.enqueue(conn, "default", {})
    result = {}
    worker = threading.Thread(target=lambda: result.update(summary=drain(
        connect(db_url), {"default": lambda job: time.sleep(2.5)},
        Options(queues=["default"], lease=lease))))
    worker.start()
    time.sleep(2.0)  # past the original lease: only the heartbeat keeps the job
    assert drainer.reap(conn) == 0
    worker.join()
    assert result["summary"].done == 1 and result["summary"].lost == 0
    assert conn.execute("SELECT status, attempts FROM jobs").fetchone() == ("done", 1)


def take_over(conn: psycopg.Connection) -> drainer.Job:
    """What a reaper and a second drainer do to a job whose lease expired."""
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second'")
    assert drainer.reap(conn) == 1
    [job] = drainer.claim(conn, ["default"], 1, timedelta(minutes=5))
    return job


def test_a_taken_over_job_is_lost_and_its_completion_changes_nothing(conn, db_url):
    drainer.enqueue(conn, "default", {})
    started = threading.Event()
    release = threading.Event()

    def handler(job):
        started.set()
        release.wait(10)

    result = {}
    worker = threading.Thread(target=lambda: result.update(summary=drain(
        connect(db_url), {"default": handler}, Options(queues=["default"]))))
    worker.start()
    assert started.wait(10)
    current = take_over(conn)
    release.set()
    worker.join()
    s = result["summary"]
    assert (s.done, s.lost, s.claimed) == (0, 1, 1)
    assert conn.execute("SELECT status, attempts FROM jobs").fetchone() == ("running", 2)
    assert drainer.complete(conn, [current]) == {current.id}  # the new owner still can


def test_the_heartbeat_notices_a_takeover(conn, db_url):
    drainer.enqueue(conn, "default", {})
    started = threading.Event()
    result = {}

    def handler(job):
        started.set()
        time.sleep(1.5)  # several heartbeats (lease 1.2 s: every 0.4 s)

    worker = threading.Thread(target=lambda: result.update(summary=drain(
        connect(db_url), {"default": handler},
        Options(queues=["default"], lease=timedelta(seconds=1.2)))))
    worker.start()
    assert started.wait(10)
    take_over(conn)
    worker.join()
    assert result["summary"].lost == 1 and result["summary"].done == 0
    assert conn.execute("SELECT attempts FROM jobs").fetchone() == (2,)


def test_a_stop_lets_running_handlers_finish_and_gives_back_the_rest(conn):
    stop = threading.Event()

    def handler(job):
        stop.set()  # SIGTERM arrives while the first job runs
        time.sleep(0.05)

    drainer.enqueue_many(conn, "default", [{}] * 5)
    s = drain(conn, {"default": handler}, Options(queues=["default"], batch_size=5), stop=stop)
    assert (s.stopped, s.done, s.claimed) == ("signal", 1, 1)
    assert states(conn) == {"done": 1, "queued": 4}
    assert count(conn, "status = 'queued' AND attempts = 0 AND locked_until IS NULL") == 4


def test_the_deadline_stops_claiming_what_cannot_finish(conn):
    drainer.enqueue_many(conn, "default", [{}] * 30)
    with freeze_time("2026-12-02 12:00:00") as frozen:
        s = drain(conn, {"default": lambda job: frozen.tick(1)},  # a simulated second each
                  Options(queues=["default"], deadline=clock.monotonic() + 10.5))
    assert s.stopped == "deadline"
    assert s.done == 10 and s.claimed == 10
    assert states(conn) == {"done": 10, "queued": 20}
    assert s.next_due is not None  # ready work remains


def test_jobs_claimed_but_not_started_at_the_deadline_are_given_back(conn):
    seconds = iter([1] + [3] * 30)  # handlers slow down after the first estimate
    drainer.enqueue_many(conn, "default", [{}] * 30)
    with freeze_time("2026-12-02 12:00:00") as frozen:
        s = drain(conn, {"default": lambda job: frozen.tick(next(seconds))},
                  Options(queues=["default"], batch_size=20, deadline=clock.monotonic() + 10))
    assert s.stopped == "deadline"
    # 1 job alone (nothing observed yet), then 9 claimed: 3 start before 10 s are up
    assert (s.done, s.claimed) == (4, 4)
    assert states(conn) == {"done": 4, "queued": 26}
    assert count(conn, "status = 'queued' AND attempts = 0") == 26


def test_sizer_adapts_within_bounds():
    sizer = Sizer()
    for _ in range(20):
        sizer.observe(sizer.size, 0.001, full=True)  # fast handlers, deep queue
    assert sizer.size == Sizer.MAX
    for _ in range(20):
        sizer.observe(sizer.size, 5.0, full=True)  # slow handlers
    assert sizer.size == Sizer.MIN
    pinned = Sizer(pinned=10)
    pinned.observe(10, 0.001, full=True)
    assert pinned.fits(None) == 10 and pinned.fits(0.5) == 10  # estimate: 0.1 ms/job
    assert pinned.fits(0.0) == 0
