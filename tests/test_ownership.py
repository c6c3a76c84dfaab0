"""Hostile conditions against the ownership rules: a token (id, attempts) is never
issued twice, a paused worker starts nothing it no longer holds, one bad row never
takes its batch down, a dropped session loses no result, and whatever another
producer may write into the table's columns fails only its own job."""

import threading
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer import clock, model
from drainer.db import connect
from drainer.engine import batch
from drainer.engine import summary as summary_
from drainer.engine.core import Pace
from drainer.engine.session import Reconnecting
from drainer.run import Options, Sizer, Summary, drain
from drainer.storage import claim, roundtrip, writeback
from tests.claims import REFUSALS, claimed_spec, refuse_claims
from tests.helpers import count, run_cli

LEASE = timedelta(minutes=5)
INT_MAX = 2**31 - 1


def one(conn: psycopg.Connection, sql: str, *params):
    return conn.execute(sql, params).fetchone()


def expire_and_reap(conn: psycopg.Connection) -> None:
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second' "
                 "WHERE status = 'running'")
    drainer.reap(conn)


def balanced(s) -> bool:
    return s.claimed == s.done + s.retried + s.failed + s.lost


# -- one bad row never takes its batch down -------------------------------------------

@pytest.mark.parametrize("attempts", [9, 12, 39, 40, 1000, INT_MAX - 2])
def test_backoff_is_capped_before_it_can_overflow(conn, attempts):
    drainer.enqueue(conn, "default", {}, max_attempts=INT_MAX)
    conn.execute("UPDATE jobs SET attempts = %s", (attempts,))
    [job] = drainer.claim(conn, ["default"], 1, LEASE)
    assert drainer.fail(conn, [(job, "again")]) == {job.id: "queued"}
    wait = one(conn, "SELECT run_at - now() FROM jobs")[0]
    assert round(wait.total_seconds()) == 3600


def test_a_job_failing_its_40th_attempt_fails_alone(conn):
    bad = drainer.enqueue(conn, "default", {"fail": True}, max_attempts=60)
    conn.execute("UPDATE jobs SET attempts = 39, run_at = now() - interval '1 hour'")
    drainer.enqueue_many(conn, "default", [{}] * 20)

    def handler(job):
        if job.payload.get("fail"):
            raise RuntimeError("still broken")

    s = drain(conn, {"default": handler}, Options(queues=["default"], batch_size=21))
    assert (s.claimed, s.done, s.retried, s.lost) == (21, 20, 1, 0)
    assert one(conn, "SELECT status, attempts FROM jobs WHERE id = %s", bad) == ("queued", 40)
    assert count(conn, "status = 'done' AND attempts = 1") == 20


def test_attempts_at_the_integer_limit_fails_that_job_alone_and_clearly(conn):
    stuck = drainer.enqueue(conn, "default", {})
    conn.execute("UPDATE jobs SET attempts = %s, run_at = now() - interval '1 hour'",
                 (INT_MAX,))
    drainer.enqueue_many(conn, "default", [{}] * 5)
    ran = []
    s = drain(conn, {"default": lambda job: ran.append(job.id)}, Options(queues=["default"]))
    assert stuck not in ran and len(ran) == 5
    assert (s.claimed, s.done, s.lost) == (5, 5, 0)
    status, attempts, error = one(
        conn, "SELECT status, attempts, last_error FROM jobs WHERE id = %s", stuck)
    assert (status, attempts) == ("failed", INT_MAX) and "integer limit" in error
    assert s.next_due is None


@pytest.mark.parametrize("run_at", ["infinity", "-infinity", "10000-01-01", "4000-01-01 BC"])
def test_a_run_at_python_cannot_hold_never_stops_a_drain(conn, db_url, run_at):
    parked = drainer.enqueue(conn, "default", {})
    conn.execute("UPDATE jobs SET run_at = %s::timestamptz", (run_at,))
    drainer.enqueue(conn, "default", {})
    proc = run_cli("drain", "--database-url", db_url, "--tasks", "behave")
    assert proc.returncode == 0, proc.stderr
    s = proc.stdout.strip().splitlines()[-1]
    ready = run_at in ("-infinity", "4000-01-01 BC")
    assert one(conn, "SELECT status FROM jobs WHERE id = %s", parked) == (
        "done" if ready else "queued",)
    assert f'"done": {2 if ready else 1}' in s and '"next_due": null' in s
    for command in ("stats", "doctor"):
        proc = run_cli(command, "--database-url", db_url)
        assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("lease_end", ["infinity", "10000-01-01"])
def test_a_lease_end_python_cannot_hold_is_not_a_crash(conn, lease_end):
    drainer.enqueue(conn, "default", {})
    conn.execute("UPDATE jobs SET status = 'running', locked_until = %s::timestamptz",
                 (lease_end,))
    s = drain(conn, {"default": lambda job: None}, Options(queues=["default"]))
    assert (s.claimed, s.next_due) == (0, None)


def test_a_running_row_with_no_lease_is_reaped(conn):
    drainer.enqueue(conn, "default", {})
    conn.execute("UPDATE jobs SET status = 'running', attempts = 1, locked_until = NULL")
    s = drain(conn, {"default": lambda job: None}, Options(queues=["default"]))
    assert (s.reaped, s.done) == (1, 1)


def test_nulls_a_hand_made_table_may_allow_fail_nothing(conn):
    conn.execute("ALTER TABLE jobs ALTER attempts DROP NOT NULL, "
                 "ALTER max_attempts DROP NOT NULL")
    drainer.enqueue_many(conn, "default", [{}] * 2)
    conn.execute("UPDATE jobs SET attempts = NULL, max_attempts = NULL")
    s = drain(conn, {"default": lambda job: 1 / 0}, Options(queues=["default"]))
    assert (s.claimed, s.retried) == (2, 2)
    assert conn.execute("SELECT DISTINCT status, attempts FROM jobs").fetchall() == [
        ("queued", 1)]
    conn.execute("UPDATE jobs SET attempts = 4, run_at = now()")
    s = drain(conn, {"default": lambda job: 1 / 0}, Options(queues=["default"]))
    assert s.failed == 2  # at the column default's 5


def test_drain_refuses_a_connection_that_is_not_autocommit(db_url):
    with psycopg.connect(db_url) as conn:
        drainer.enqueue(conn, "default", {})
        conn.commit()
        with pytest.raises(drainer.ConfigError, match="autocommit"):
            drain(conn, {"default": lambda job: None}, Options(queues=["default"]))
        assert count(conn, "status = 'queued'") == 1


# -- requeue and cancel never recycle a token -----------------------------------------

def test_a_stale_worker_changes_nothing_after_reap_requeue_and_a_new_claim(conn):
    drainer.enqueue(conn, "default", {}, max_attempts=1)
    [stale] = drainer.claim(conn, ["default"], 1, LEASE)
    expire_and_reap(conn)  # at max_attempts: failed
    assert drainer.requeue(conn, ids=[stale.id]) == [stale.id]
    [current] = drainer.claim(conn, ["default"], 1, LEASE)
    assert current.attempts != stale.attempts

    assert drainer.extend(conn, [stale], timedelta(hours=1)) == set()
    assert drainer.complete(conn, [stale]) == set()
    assert drainer.fail(conn, [(stale, "stale")]) == {}
    assert drainer.release(conn, [stale]) == set()
    assert one(conn, "SELECT status, attempts, locked_until < now() + interval '10 minutes' "
                     "FROM jobs") == ("running", current.attempts, True)
    assert drainer.complete(conn, [current]) == {current.id}


def test_a_reaped_workers_result_is_not_written(conn):
    """A worker whose lease ran out writes back after its job was reaped and claimed
    again: the row is running, as when it claimed it, with the same id, and only the
    attempt number tells the two claims apart. The old claim's result, completion,
    failure, heartbeat and release change nothing; the new claim's still land."""
    drainer.enqueue(conn, "default", {})
    [stale] = drainer.claim(conn, ["default"], 1, LEASE)
    expire_and_reap(conn)  # below max_attempts: queued again
    [current] = drainer.claim(conn, ["default"], 1, LEASE)
    assert (current.id, current.attempts) == (stale.id, stale.attempts + 1)

    settled = roundtrip.settle(conn, [stale], (), (), results={stale.token: '"stale"'})
    assert (settled.done, settled.failed, settled.released) == (set(), {}, set())
    assert roundtrip.settle(conn, (), [(stale, "ValueError: stale")], ()).failed == {}
    assert roundtrip.settle(conn, (), [(stale, model.Setback("ValueError: stale", "failed"))],
                        ()).failed == {}
    assert writeback.extend_claims(conn, [stale], timedelta(hours=1)) == set()
    assert writeback.release(conn, [stale]) == set()
    assert one(conn, "SELECT status, attempts, result, last_error, "
                     "locked_until < now() + interval '10 minutes' FROM jobs") == (
        "running", current.attempts, None, "lease expired", True)

    assert writeback.extend_claims(conn, [current], LEASE) == {current.token}
    settled = roundtrip.settle(conn, [current], (), (), results={current.token: '"mine"'})
    assert settled.done == {current.token}
    assert one(conn, "SELECT status, result FROM jobs") == ("done", "mine")


def test_cancelling_a_running_job_leaves_its_worker_nothing_to_write(conn):
    drainer.enqueue(conn, "default", {})
    [stale] = drainer.claim(conn, ["default"], 1, LEASE)
    assert drainer.cancel(conn, [stale.id]) == [stale.id]
    assert one(conn, "SELECT status, last_error FROM jobs") == ("failed", "cancelled")
    assert drainer.complete(conn, [stale]) == set()
    # By id, a cancelled job may come back, once the lease its old handler ran under
    # has ended (it may run on until then).
    assert drainer.requeue(conn, ids=[stale.id]).waiting.keys() == {stale.id}
    conn.execute("UPDATE jobs SET locked_until = now(), cancelled_running_until = now()")
    assert drainer.requeue(conn, ids=[stale.id]) == [stale.id]
    [current] = drainer.claim(conn, ["default"], 1, LEASE)
    assert drainer.fail(conn, [(stale, "stale")]) == {}
    assert drainer.complete(conn, [stale]) == set()
    assert drainer.complete(conn, [current]) == {current.id}


def test_requeue_gives_a_fresh_budget_and_the_success_no_old_error(conn):
    drainer.enqueue(conn, "default", {}, max_attempts=2)
    for _ in range(2):
        conn.execute("UPDATE jobs SET run_at = now()")
        [job] = drainer.claim(conn, ["default"], 1, LEASE)
        drainer.fail(conn, [(job, "boom")])
    assert one(conn, "SELECT status, attempts, max_attempts FROM jobs") == ("failed", 2, 2)
    drainer.requeue(conn, queue="default")
    assert one(conn, "SELECT status, attempts, max_attempts, last_error FROM jobs"
               ) == ("queued", 2, 4, None)
    [job] = drainer.claim(conn, ["default"], 1, LEASE)
    assert job.attempts == 3 and job.max_attempts == 4
    drainer.complete(conn, [job])
    assert one(conn, "SELECT status, last_error FROM jobs") == ("done", None)


def test_a_queues_requeue_leaves_cancelled_jobs_alone(conn):
    cancelled = drainer.enqueue(conn, "default", {})
    failed = drainer.enqueue(conn, "default", {}, max_attempts=1)
    drainer.cancel(conn, [cancelled])
    [job] = drainer.claim(conn, ["default"], 1, LEASE)
    drainer.fail(conn, [(job, "boom")])
    assert drainer.requeue(conn, queue="default") == [failed]
    assert one(conn, "SELECT status FROM jobs WHERE id = %s", cancelled) == ("failed",)
    assert drainer.requeue(conn, ids=[cancelled]) == [cancelled]


# -- a paused worker starts nothing it no longer holds --------------------------------

class Clock:
    """The clock seam, moved by hand: a pause of the whole process in one step."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + 1e9


@pytest.mark.parametrize("clocks", ["both", "wall"])  # "wall": a machine that slept
def test_a_paused_worker_confirms_before_starting_and_counts_each_job_once(conn, monkeypatch,
                                                                           clocks):
    fake = Clock()
    monkeypatch.setattr(clock, "wall", fake.wall)
    if clocks == "both":
        monkeypatch.setattr(clock, "monotonic", fake.monotonic)
    drainer.enqueue_many(conn, "default", [{}] * 3)
    jobs = drainer.claim(conn, ["default"], 3, timedelta(seconds=10))
    ran, extends = [], []

    def handler(job):
        ran.append(job.id)
        expire_and_reap(conn)  # another drainer reaps and claims the rest ...
        drainer.claim(conn, ["default"], 3, LEASE)
        fake.now += 20  # ... while this one was paused past its lease

    def extend(js):
        extends.append([j.id for j in js])
        return writeback.extend_claims(conn, js, timedelta(seconds=10))

    outcome = batch.Batch(jobs, {"default": handler}, concurrency=1,
                          lease=timedelta(seconds=10), extend=extend,
                          may_start=lambda job: True, stop=threading.Event()).run()
    assert ran == [jobs[0].id]  # the other two were never started
    assert extends and {j.id for j in jobs[1:]} <= set(extends[0])
    assert {jobs[1].token, jobs[2].token} <= outcome.lost and not outcome.unstarted
    # Counted once: the first is lost too if the periodic heartbeat saw it first.
    assert [j.id for j in outcome.succeeded] == [jobs[0].id] or jobs[0].token in outcome.lost
    assert not {j.token for j in outcome.succeeded} & outcome.lost


def take_over(conn: psycopg.Connection, job: model.Job) -> model.Job:
    """Another drainer reaps `job` once its lease ran out, and claims it."""
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second' WHERE id = %s",
                 (job.id,))
    drainer.reap(conn)
    [theirs] = drainer.claim(conn, [job.queue], 1, LEASE)
    assert theirs.id == job.id
    return theirs


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_job_whose_lease_lapsed_before_its_turn_on_its_thread_never_starts(conn,
                                                                             monkeypatch,
                                                                             kind):
    """The process pauses past the lease after a job was handed to its thread, before
    its handler began: another drainer took the job over meanwhile. The lease is looked
    at on the handler's own thread right before it starts (sync: on the pool thread,
    after the batch took the job; async: on the loop, where another handler held the
    loop first), so the job is confirmed, found lost, and never started."""
    fake = Clock()
    monkeypatch.setattr(clock, "wall", fake.wall)
    drainer.enqueue_many(conn, "default", [{}] * (1 if kind == "sync" else 2))
    jobs = drainer.claim(conn, ["default"], 2, timedelta(seconds=10))
    late, ran, theirs, made = jobs[-1], [], [], []

    def pause() -> None:
        theirs.append(take_over(conn, late))
        fake.now += 20  # the whole process was paused past the lease

    def monotonic() -> float:
        # Sync: the handler's thread pauses as it notes when the job it took began.
        if (kind == "sync" and not theirs and made and late.token in made[0].core.running
                and threading.current_thread().name == "drainer-handler"):
            pause()
        return fake.monotonic()

    async def first(job):  # holds the event loop while the next job waits for its turn
        ran.append(job.id)
        if job is not late:
            pause()

    def handler(job):
        ran.append(job.id)

    monkeypatch.setattr(clock, "monotonic", monotonic)
    b = batch.Batch(jobs, {"default": handler if kind == "sync" else first},
                    concurrency=2, lease=timedelta(seconds=10),
                    extend=lambda js: writeback.extend_claims(conn, js, timedelta(seconds=10)),
                    may_start=lambda job: True, stop=threading.Event(), pace=Pace())
    made.append(b)
    outcome = b.run()
    assert theirs and ran == [j.id for j in jobs[:-1]]  # the late one never started
    assert late.token in outcome.lost and late.token not in {j.token for j in outcome.succeeded}
    assert one(conn, "SELECT status, attempts FROM jobs WHERE id = %s", late.id) == (
        "running", theirs[0].attempts)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_worker_stalled_between_its_lease_check_and_the_call_changes_nothing(
        conn, db_url, monkeypatch, kind):
    """What no check in the process can close: its handler's thread stalls (another
    thread holding the GIL for seconds) right after the lease was found fresh, while
    another drainer takes the job over and finishes it. The stale worker starts the
    handler, whose side effects happen, but its token makes its write-back change
    nothing: the other drainer's outcome stands, and the summary counts the job lost."""
    real_wall, stalled, ran = clock.wall, [], []
    job_id = drainer.enqueue(conn, "default", {})

    def wall() -> float:
        read = real_wall()
        on = "drainer-handler" if kind == "sync" else "drainer-async"
        if not stalled and threading.current_thread().name == on:  # the check before the call
            with connect(db_url) as other:
                theirs = take_over(other, model.Job(job_id, "default", {}, 1, 5))
                assert drainer.complete(other, [theirs]) == {job_id}
            stalled.append(theirs.attempts)
        return read  # what the check read, before the stall

    def handler(job):
        ran.append(job.id)

    async def async_handler(job):
        ran.append(job.id)

    monkeypatch.setattr(clock, "wall", wall)
    summary = drain(conn, {"default": handler if kind == "sync" else async_handler},
                    Options(queues=["default"]))
    assert stalled == [2] and ran == [job_id]  # stalled, then started late
    assert (summary.claimed, summary.done, summary.lost) == (1, 0, 1)
    assert one(conn, "SELECT status, attempts FROM jobs") == ("done", 2)


def test_a_plain_handler_returning_a_coroutine_is_called_once_across_a_pause(conn,
                                                                          monkeypatch):
    """A plain function that returns a coroutine (a decorator's wrapper around an
    `async def`) has begun once it is called: the process pausing past half the lease
    before the loop runs its coroutine must not put the job back and call it again."""
    fake = Clock()
    monkeypatch.setattr(clock, "wall", fake.wall)
    monkeypatch.setattr(clock, "monotonic", fake.monotonic)
    job_id = drainer.enqueue(conn, "default", {})
    jobs = drainer.claim(conn, ["default"], 1, timedelta(seconds=10))
    called, awaited = [], []

    async def work(job):
        awaited.append(job.id)

    def handler(job):
        called.append(job.id)
        if len(called) == 1:
            fake.now += 20  # the process pauses before the loop starts the coroutine
        return work(job)

    outcome = batch.Batch(
        jobs, {"default": handler}, concurrency=1, lease=timedelta(seconds=10),
        extend=lambda js: writeback.extend_claims(conn, js, timedelta(seconds=10)),
        may_start=lambda job: True, stop=threading.Event(), pace=Pace()).run()
    assert called == [job_id] and awaited == [job_id]
    assert [j.id for j in outcome.succeeded] == [job_id]


def test_a_fresh_batch_starts_its_jobs_without_a_heartbeat(conn):
    drainer.enqueue_many(conn, "default", [{}] * 3)
    jobs = drainer.claim(conn, ["default"], 3, LEASE)
    extends = []
    outcome = batch.Batch(jobs, {"default": lambda job: None}, concurrency=1, lease=LEASE,
                          extend=lambda js: extends.append(js) or set(),
                          may_start=lambda job: True, stop=threading.Event()).run()
    assert len(outcome.succeeded) == 3 and extends == []


def test_a_job_that_ends_while_the_heartbeat_is_out_is_counted_once(conn):
    drainer.enqueue(conn, "default", {})
    [job] = drainer.claim(conn, ["default"], 1, timedelta(seconds=1.2))
    release = threading.Event()

    def extend(js):
        conn.execute("UPDATE jobs SET attempts = attempts + 1")  # taken over, and ...
        release.set()  # ... the handler ends while the heartbeat is out
        while b.core.running:
            clock.sleep(0.01)
        return writeback.extend_claims(conn, js, timedelta(seconds=1.2))

    b = batch.Batch([job], {"default": lambda j: release.wait(10)}, concurrency=1,
                    lease=timedelta(seconds=1.2), extend=extend,
                    may_start=lambda j: True, stop=threading.Event())
    outcome = b.run()
    summary = Summary()
    summary_.record(roundtrip.settle(conn, outcome.succeeded, outcome.failed, outcome.unstarted),
                outcome, summary)
    assert (summary.claimed, summary.done, summary.lost) == (1, 0, 1)


# -- a dropped session loses no result --------------------------------------------------

def test_results_survive_a_session_idle_limit(conn, db_url):
    dbname = conn.info.dbname
    conn.execute(f'ALTER DATABASE "{dbname}" SET idle_session_timeout = \'1s\'')
    drainer.enqueue_many(conn, "default", [{"sleep": 1.5}] * 3)
    proc = run_cli("drain", "--database-url", db_url, "--tasks", "behave",
                   "--concurrency", "3")
    assert proc.returncode == 0, proc.stderr
    assert '"done": 3' in proc.stdout and '"lost": 0' in proc.stdout
    assert "connection lost" in proc.stderr
    assert conn.execute("SELECT status, attempts, count(*) FROM jobs GROUP BY 1, 2"
                        ).fetchall() == [("done", 1, 3)]


def test_a_release_whose_outcome_is_unknown_is_never_sent_again(db_url):
    with connect(db_url) as admin:
        drainer.enqueue_many(admin, "default", [{}] * 3)
        stop = threading.Event()
        drainer_conn = connect(db_url, application_name="victim")

        def handler(job):
            stop.set()  # the rest of the batch is given back ...
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'victim'")  # ... on a dead session

        s = drain(drainer_conn, {"default": handler},
                  Options(queues=["default"], batch_size=3), stop=stop,
                  reopen=lambda: connect(db_url))
        drainer_conn.close()
        assert (s.claimed, s.done) == (1, 1) and balanced(s)
        # The two unstarted jobs were not released on the new session: their lease
        # brings them back, an attempt spent.
        assert admin.execute("SELECT status, attempts, count(*) FROM jobs GROUP BY 1, 2 "
                             "ORDER BY 1").fetchall() == [("done", 1, 1), ("running", 1, 2)]


def test_without_reopen_a_dropped_session_ends_the_drain_with_its_summary(db_url):
    with connect(db_url) as admin:
        drainer.enqueue_many(admin, "default", [{}] * 2)
        victim = connect(db_url, application_name="victim")

        def handler(job):
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name = 'victim'")

        with pytest.raises(drainer.DatabaseUnavailable) as caught:
            drain(victim, {"default": handler}, Options(queues=["default"], batch_size=1))
        victim.close()
        assert caught.value.summary["claimed"] == 0  # the first batch never landed


def test_a_handler_written_off_at_a_stop_changes_nothing_after_the_batch(conn):
    drainer.enqueue_many(conn, "default", [{}] * 2)
    jobs = drainer.claim(conn, ["default"], 2, LEASE)
    stop, ended, ran = threading.Event(), threading.Event(), []

    def handler(job):
        ran.append(job.id)
        stop.set()
        ended.wait(10)  # still running at the bound (one lease after the stop)

    outcome = batch.Batch(jobs, {"default": handler}, concurrency=1,
                          lease=timedelta(seconds=1), extend=lambda js: {j.token for j in js},
                          may_start=lambda job: not stop.is_set(), stop=stop).run()
    assert outcome.abandoned == [jobs[0]] and outcome.unstarted == [jobs[1]]
    ended.set()
    clock.sleep(0.3)  # the written-off handler returns and looks for more work
    assert ran == [jobs[0].id] and outcome.succeeded == [] and outcome.failed == []


def test_a_resend_counts_what_the_lost_answer_had_written(conn):
    drainer.enqueue_many(conn, "default", [{}] * 3)
    ok, bad, taken = drainer.claim(conn, ["default"], 3, LEASE)
    roundtrip.settle(conn, [ok, taken], [(bad, "boom")], ())  # landed; its answer was lost
    conn.execute("UPDATE jobs SET status = 'running', attempts = attempts + 1 "
                 "WHERE id = %s", (taken.id,))  # and another worker has this one now
    settled = writeback.settle_again(conn, [ok, taken], [(bad, "boom")])
    assert settled.done == {ok.token} and settled.failed[bad.token].status == "queued"
    assert list(settled.failed) == [bad.token]


def test_an_error_that_leaves_the_session_alive_is_not_sent_again(conn):
    opened = []
    link = Reconnecting(conn, reopen=lambda: opened.append(1))

    def deadlock(c):
        raise drainer.DatabaseUnavailable("deadlock detected")

    with pytest.raises(drainer.DatabaseUnavailable):
        link.send(deadlock)
    assert opened == []


# -- the deadline judges from the slowest job, not the mean ---------------------------

def test_a_slow_job_does_not_start_after_fast_ones_with_too_little_time_left(conn):
    drainer.enqueue_many(conn, "fast", [{}] * 20)
    drainer.enqueue_many(conn, "slow", [{}] * 2)
    conn.execute("UPDATE jobs SET run_at = now() - interval '1 hour' WHERE queue = 'fast'")
    handlers = {"fast": lambda job: None, "slow": lambda job: clock.sleep(0.5)}
    s = drain(conn, handlers, Options(queues=["fast", "slow"], batch_size=10,
                                      deadline=clock.monotonic() + 0.8))
    assert s.stopped == "deadline"
    assert count(conn, "queue = 'slow' AND status = 'queued' AND attempts = 0") >= 1


def test_sizer_judges_a_queue_by_its_longest_job_or_its_timeout():
    sizer = Sizer()
    sizer.observe(10, 0.01, full=True)  # a mean of 1 ms per job
    assert sizer.may_start(0.13, "slow")
    sizer.took("slow", 0.6)
    sizer.took("slow", 0.1)
    assert not sizer.may_start(0.13, "slow") and sizer.may_start(0.7, "slow")
    assert sizer.may_start(0.13, "slow", timeout=0.1)  # it cannot run longer than that
    assert not sizer.may_start(0.13, "never-run", timeout=0.5)
    assert sizer.may_start(0.13, "never-run") and sizer.may_start(None, "slow")


# -- a claim that fails, or an interrupt, never loses its write-back ---------------------

LEASE = timedelta(minutes=5)


def statuses(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT status, attempts FROM jobs ORDER BY id").fetchall()


@pytest.mark.parametrize("when", REFUSALS)
@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
def test_a_claim_that_fails_never_takes_its_write_back_with_it(conn, limited, when):
    """A batch's write-back and the next claim are one round trip and one transaction:
    a claim that fails rolls the write-back back. It is sent again on its own before
    the error is raised: the jobs that ran are not run again after their lease, and
    the one never started is queued again at once. The session is left idle (a COMMIT
    that failed at the pipeline's implicit commit left psycopg stuck in pipeline mode)."""
    jobs, spec = claimed_spec(conn, limited, 4)
    refuse_claims(conn, when)
    drainer.enqueue(conn, "q", {})  # ready for the claim that fails
    with pytest.raises(drainer.DrainerError, match="claims refused"):
        roundtrip.settle(conn, jobs[:2], [(jobs[2], "ValueError: no")], jobs[3:], claim_next=spec)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert statuses(conn) == [("done", 1), ("done", 1), ("queued", 1), ("queued", 0),
                              ("queued", 0)]


@pytest.mark.parametrize("claims", ["plain", "limited", "nothing"])
def test_an_interrupt_as_the_round_trip_is_sent_never_loses_the_write_back(conn, claims):
    """A KeyboardInterrupt (or a signal handler's SystemExit) while the write-back (and
    the claim with it, if any: a drain's last write-back has none) is being sent: the
    transaction is rolled back, nothing of it landed, and the write-back is sent again,
    release included; the session is left idle."""
    jobs, spec = claimed_spec(conn, claims == "limited", 4)

    def interrupted(c: psycopg.Connection) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        roundtrip.settle(conn, jobs[:2], [(jobs[2], "ValueError: no")], jobs[3:],
                         same_transaction=interrupted,
                         claim_next=None if claims == "nothing" else spec)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert statuses(conn) == [("done", 1), ("done", 1), ("queued", 1), ("queued", 0)]


@pytest.mark.parametrize("claims", ["plain", "nothing"])
def test_a_statement_refused_before_it_is_sent_never_loses_the_write_back(conn, claims):
    """What goes with the write-back fails in psycopg before anything is sent (here a
    schedule's statement with a NUL, which the database cannot hold): the round trip is
    rolled back, and the write-back is sent again on its own, claim or none."""
    jobs, spec = claimed_spec(conn, False, 4)

    def refused(c: psycopg.Connection) -> None:
        c.execute("SELECT %s::text", ("bad\x00",))

    with pytest.raises(drainer.DrainerError):
        roundtrip.settle(conn, jobs[:2], [(jobs[2], "ValueError: no")], jobs[3:],
                         same_transaction=refused,
                         claim_next=None if claims == "nothing" else spec)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert statuses(conn) == [("done", 1), ("done", 1), ("queued", 1), ("queued", 0)]


def test_a_drain_stopped_as_its_last_write_back_is_sent_keeps_it(conn, declared, monkeypatch):
    """A signal handler's SystemExit while a drain's last write-back (no claim after
    it) is being sent: the job that ran is done, not left running to run again."""
    from drainer import schedules
    schedules.schedule("nightly", "q", "0 3 * * *")
    stop = threading.Event()

    def after_run(c: psycopg.Connection, jobs: list, now: object) -> None:
        raise SystemExit(143)

    job_id = drainer.enqueue(conn, "q", {})
    monkeypatch.setattr(schedules, "after_run", after_run)
    with pytest.raises(SystemExit):
        drain(conn, {"q": lambda job: stop.set()}, Options(queues=["q"]), stop=stop)
    assert one(conn, "SELECT status FROM jobs WHERE id = %s", job_id) == ("done",)


def test_a_write_back_on_a_connection_outside_autocommit_is_the_callers_to_commit(conn,
                                                                                  db_url):
    """complete() on a connection outside autocommit joins the transaction psycopg
    begins there: the caller's rollback undoes it, as it undoes the work the job was
    about."""
    drainer.enqueue(conn, "q", {})
    [job] = roundtrip.claim(conn, ["q"], 1, LEASE)
    with psycopg.connect(db_url) as caller:
        drainer.complete(caller, [job])
        caller.rollback()
    assert statuses(conn) == [("running", 1)]


def test_a_claim_refused_before_it_is_sent_never_releases_twice(conn, db_url, monkeypatch):
    """The claim fails in psycopg, after the write-back was queued (a NUL in a queue
    name; the same for a character the connection's encoding lacks). Had the write-back
    committed at the pipeline's sync, the release sent again would take the job from a
    worker that claimed it meanwhile: same (id, attempts) token. Nothing lands instead,
    and the release is sent once."""
    ran, unstarted = claimed_spec(conn, False, 2)[0]
    taken: list[model.Job] = []
    settle = roundtrip.settle

    def settle_with_a_worker_in_between(c, *args, **kwargs):
        if kwargs.get("claim_next") is None:  # the write-back sent again
            with connect(db_url) as other:
                taken.extend(roundtrip.claim(other, ["q"], 10, LEASE))
        return settle(c, *args, **kwargs)

    monkeypatch.setattr(roundtrip, "settle", settle_with_a_worker_in_between)
    monkeypatch.setattr(writeback, "settle", settle_with_a_worker_in_between)
    with pytest.raises(drainer.DrainerError):
        settle(conn, [ran], [], [unstarted], claim_next=claim.Claim(["q", "bad\x00"], 10, LEASE))
    assert taken == []  # nothing had landed: the job was still ours
    assert statuses(conn) == [("done", 1), ("queued", 0)]
