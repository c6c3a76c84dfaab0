"""The drain loop in-process on a real PostgreSQL: outcomes, concurrency, leases,
takeovers, the deadline (driven by freezegun) and stop signals."""

import threading
import time
from datetime import timedelta

import freezegun
import psycopg
import pytest
from freezegun import freeze_time

import drainer
from drainer import clock
from drainer.db import connect
from drainer.run import Options, Sizer, drain
from tests.helpers import count


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


def lease_of(conn: psycopg.Connection, job_id: int):
    return conn.execute("SELECT locked_until FROM jobs WHERE id = %s", (job_id,)).fetchone()[0]


def wait_for_leases(conn: psycopg.Connection, job_id: int, moves: int) -> None:
    """Until the job's lease end has moved forward `moves` times: each move is a
    heartbeat statement that committed (10 s is many heartbeats of a 1.5 s lease)."""
    seen, deadline = lease_of(conn, job_id), time.monotonic() + 10
    while moves:
        assert time.monotonic() < deadline, f"the lease of job {job_id} stopped moving"
        time.sleep(0.02)
        if (now := lease_of(conn, job_id)) != seen:
            assert now > seen
            seen, moves = now, moves - 1


def test_the_heartbeat_extends_a_running_job_and_notices_a_takeover(conn, db_url):
    """The periodic heartbeat, while a handler runs and nothing else starts: the
    running job's lease end moves forward again and again, and a takeover of the
    batch's next job, seen by that heartbeat, keeps the job from ever starting here.

    Job A's handler is held until the test lets it go; job B waits behind it
    (concurrency 1). Only the periodic heartbeat sends statements in that time: no
    job starts, so nothing else can move A's lease or learn that B is gone."""
    first = drainer.enqueue(conn, "default", {"n": "A"})
    second = drainer.enqueue(conn, "default", {"n": "B"})
    started, release, ran, result = threading.Event(), threading.Event(), [], {}

    def handler(job):
        ran.append(job.id)
        started.set()
        assert release.wait(30)

    worker = threading.Thread(target=lambda: result.update(summary=drain(
        connect(db_url), {"default": handler},
        Options(queues=["default"], batch_size=2, lease=timedelta(seconds=1.5)))))
    worker.start()
    try:
        assert started.wait(10) and ran == [first]
        wait_for_leases(conn, first, moves=2)  # heartbeats while A's handler runs
        # B's lease ends and another drainer takes it: a reap, then its own claim.
        with conn.transaction():
            conn.execute("UPDATE jobs SET status = 'queued', locked_until = NULL "
                         "WHERE id = %s AND status = 'running'", (second,))
            [taken] = drainer.claim(conn, ["default"], 1, timedelta(minutes=5))
        assert (taken.id, taken.attempts) == (second, 2)
        # Two more heartbeats: the first found B gone, and had dropped it before the
        # second was sent.
        wait_for_leases(conn, first, moves=2)
    finally:
        release.set()
        worker.join(30)
    assert not worker.is_alive()
    s = result["summary"]
    assert ran == [first]  # B never started here
    assert (s.done, s.lost, s.claimed) == (1, 1, 2)
    assert conn.execute("SELECT id, status, attempts FROM jobs ORDER BY id").fetchall() == [
        (first, "done", 1), (second, "running", 2)]


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


def test_jobs_claimed_but_not_started_at_the_deadline_are_given_back(conn, monkeypatch):
    # Frozen in every thread: freezegun gives the real time to a call made near a
    # thread's start, so a handler's duration would depend on the batch's call depth.
    monkeypatch.setattr(freezegun.api, "call_stack_inspection_limit", 0)
    seconds = iter([1] + [3] * 30)  # handlers slow down after the first estimate
    drainer.enqueue_many(conn, "default", [{}] * 30)
    with freeze_time("2026-12-02 12:00:00") as frozen:
        s = drain(conn, {"default": lambda job: frozen.tick(next(seconds))},
                  Options(queues=["default"], batch_size=20, deadline=clock.monotonic() + 10))
    assert s.stopped == "deadline"
    # 1 job alone (nothing observed yet), then 9 claimed: 2 start (at 1 s and 4 s); at
    # 7 s the 3 s a job of the queue took no longer fits before the deadline
    assert (s.done, s.claimed) == (3, 3)
    assert states(conn) == {"done": 3, "queued": 27}
    assert count(conn, "status = 'queued' AND attempts = 0") == 27


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


def test_a_finished_job_keeps_its_lease_until_its_batch_writes_it_back(conn, db_url):
    """Two jobs of a batch end at once, the third runs 2.5 s with a 1 s lease: the first
    two wait for the batch's write-back with their leases still extended, so another
    drainer's reap at 1.5 s takes none of them back (it would run them again, and this
    drain would count them lost)."""
    drainer.enqueue_many(conn, "default", [{"t": 0}, {"t": 1}, {"t": 0}])
    reaped: list[int] = []

    def handler(job: drainer.Job) -> None:
        if job.payload["t"]:
            time.sleep(1.5)
            with psycopg.connect(db_url, autocommit=True) as other:
                reaped.append(drainer.reap(other))
            time.sleep(1)

    s = drain(conn, {"default": handler}, Options(queues=["default"], batch_size=3,
                                                  concurrency=2, lease=timedelta(seconds=1)))
    assert (reaped, s.done, s.lost) == ([0], 3, 0)


def test_slow_batches_never_shrink_below_two_rounds_of_handlers():
    """Below one round slots stay idle (0.6 s jobs at --concurrency 8 ran one at a
    time), and a batch of one round is not refilled: one straggler would hold up
    every later batch."""
    slow = Sizer(concurrency=8)
    for _ in range(5):
        slow.observe(slow.size, 0.6, full=True)
    assert slow.size == 16
    straggled = Sizer(concurrency=200)
    straggled.observe(200, 0.1, full=True)
    straggled.observe(400, 0.6, full=True)
    assert straggled.size == 400
    alone = Sizer(concurrency=1)
    alone.observe(alone.size, 5.0, full=True)
    assert alone.size == 5  # one slot: halved as before, to share slow jobs


def test_sizer_starts_at_one_round_of_handlers_and_holds_two_at_most():
    """A first claim smaller than --concurrency leaves slots idle; a batch capped
    below two rounds of handlers could never be refilled while it runs."""
    assert Sizer(concurrency=4).size == Sizer.START  # 10 at least
    assert Sizer(concurrency=100).size == 100
    wide = Sizer(concurrency=800)
    assert wide.size == 800
    for _ in range(5):
        wide.observe(wide.size, 0.001, full=True)
    assert wide.size == 1600  # two rounds, past the usual 500
    assert Sizer(pinned=7, concurrency=800).size == 7
    widest = Sizer(concurrency=2**63 - 1)  # --concurrency's most: a claim's LIMIT is a bigint
    widest.observe(widest.size, 0.001, full=True)
    assert widest.size == widest.least == widest.most == 2**63 - 1


@pytest.mark.parametrize(("trip", "per_job", "concurrency", "size", "lead"), [
    (None, 1e-5, 1, 500, 0),  # no round trip seen yet: at the last rounds, as before
    (0.02, None, 1, 500, 0),  # no batch timed yet
    (0.02, 4e-5, 1, 500, 500),  # no-op handlers, bound by the database: a whole claim
    (0.02, 4e-5, 1, 40, 40),  # never more than a claim holds
    (0.02, 0.001, 1, 500, 40),  # 1 ms a job: two round trips' worth, 40 jobs
    (0.02, 0.001, 8, 500, 40),  # the same with 8 slots: 40 jobs are more than 2 rounds
    (0.02, 0.008, 4, 500, 0),  # 5 jobs are no more than two rounds of 4: as before
    (0.02, 10.0, 1, 500, 0),  # slow handlers: at the last round, as before
])
def test_the_refill_lead_is_a_round_trip_of_jobs(trip, per_job, concurrency, size, lead):
    sizer = Sizer(pinned=size, concurrency=concurrency)
    if trip is not None:
        sizer.tripped(trip)
    if per_job is not None:
        sizer.observe(100, 100 * per_job, full=True)
    assert sizer.lead() == lead


def test_the_lead_shrinks_as_soon_as_a_batch_of_slow_jobs_is_seen():
    """Learnt on no-op jobs (a whole claim ahead), the lead follows the batches' own
    time per job: one refill's worth of 2 ms jobs brings it under a tenth of a claim,
    so a drain whose jobs turn slow stops claiming far ahead of them."""
    sizer = Sizer(pinned=500)
    sizer.tripped(0.02)
    sizer.observe(500, 0.02, full=True)  # bound by the database: 40 us a job
    assert sizer.lead() == 500
    sizer.observe(500, 1.0, full=True)  # 2 ms a job
    assert 2 < sizer.lead() <= 100


def test_a_refill_leaves_time_for_the_jobs_still_held_before_the_deadline():
    """A refill's claim is sized by the time left once the jobs its batch still holds
    have run: with 1 s left at 10 ms a job, 40 jobs held leave room for 60, not 100."""
    sizer = Sizer(pinned=500)
    sizer.observe(100, 1.0, full=True)
    assert sizer.fits(1.0) == 100
    assert sizer.fits(1.0, ahead=40) == 60
    assert sizer.fits(1.0, ahead=100) == 0
