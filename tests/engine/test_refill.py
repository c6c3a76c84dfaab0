"""A batch refilled while it runs: once its last rounds have started, what finished is
written back and more is claimed, so handler slots never wait for a write-back and a
claim between batches. Every job still runs once and is written back once."""

import itertools
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer import clock
from drainer.engine.batch import Batch
from drainer.engine.core import Core
from drainer.engine.outcome import Land, Outcome
from drainer.engine.sizer import Sizer
from drainer.model import Job
from drainer.run import Options, Summary, drain
from tests.helpers import wait_until


def balanced(s: Summary | dict) -> bool:
    s = s if isinstance(s, dict) else s.as_json()
    return s["claimed"] == s["done"] + s["retried"] + s["failed"] + s["lost"]


def test_a_refilled_batch_writes_each_job_back_once_and_runs_the_refills(conn):
    """Without a database: a refill hands out 10 more jobs at a time until 60 ran."""
    ran: list[int] = []
    parts: list[list[int]] = []
    lock = threading.Lock()
    made = iter(range(11, 61))

    def handler(job: Job) -> None:
        with lock:
            ran.append(job.id)

    def refill(part: Outcome, land: Land, free: int) -> bool:
        parts.append([j.id for j in part.succeeded])
        more = [Job(i, "default", None, 1, 5) for i in itertools.islice(made, 10)]
        land(more)
        return len(more) == 10

    outcome = Batch([Job(i, "default", None, 1, 5) for i in range(1, 11)],
                    {"default": handler}, concurrency=4, lease=timedelta(minutes=5),
                    extend=lambda js: {j.token for j in js}, may_start=lambda j: True,
                    stop=threading.Event(), refill=refill).run()
    assert sorted(ran) == list(range(1, 61))
    written = [i for ids in parts for i in ids] + [j.id for j in outcome.succeeded]
    assert sorted(written) == list(range(1, 61))  # each once, in a part or at the end
    assert len(parts) >= 5
    assert not outcome.unstarted and not outcome.lost


def test_a_drain_writes_back_finished_jobs_while_its_batch_still_runs(conn, db_url):
    """The last job of the first claim waits (10 s at most) for jobs of its own batch
    to be done in the table: written back batch by batch, none would be before it
    returned."""
    drainer.enqueue_many(conn, "default", [{}] * 300)
    [(last,)] = conn.execute("SELECT max(id) FROM (SELECT id FROM jobs ORDER BY id LIMIT 100)"
                             " AS first").fetchall()
    seen: list[bool] = []

    def handler(job: Job) -> None:
        time.sleep(0.002)
        if job.id == last:
            with psycopg.connect(db_url, autocommit=True) as other:
                def done() -> bool:
                    return bool(other.execute("SELECT count(*) FROM jobs WHERE status = 'done'"
                                              ).fetchone()[0])
                try:
                    seen.append(wait_until(done, timeout=10))
                except AssertionError:
                    seen.append(False)

    summary = drain(conn, {"default": handler},
                    Options(queues=["default"], batch_size=100, concurrency=4))
    assert seen == [True]
    assert (summary.claimed, summary.done) == (300, 300)
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'done' AND attempts = 1"
                        ).fetchone() == (300,)


def test_a_job_claimed_again_by_its_own_refilled_batch_runs_and_counts_each_time(conn):
    """A retry with no backoff is ready again while its batch still runs, and a refill
    claims it again: each claim is its own (id, attempts). The first job asks for a
    retry once; the second outlives its timeout once, and its second run must count
    (keyed by id, its success was dropped as the timed-out run's late answer)."""
    drainer.enqueue_many(conn, "default", [{}] * 400)
    ids = [i for (i,) in conn.execute("SELECT id FROM jobs ORDER BY id")]
    first, slow = ids[0], ids[1]
    runs: list[tuple[int, int]] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        with lock:
            runs.append((job.id, job.attempts))
        if job.attempts == 1 and job.id == first:
            raise drainer.Retry(delay=0)
        time.sleep(1.0 if job.attempts == 1 and job.id == slow else 0.002)

    task = drainer.Task(handler, "default", timeout=0.3, backoff=drainer.Constant(0))
    summary = drain(conn, {"default": task},
                    Options(queues=["default"], batch_size=100, concurrency=4))
    assert sorted(runs) == sorted([(i, 1) for i in ids] + [(first, 2), (slow, 2)])
    assert (summary.claimed, summary.done, summary.retried, summary.lost) == (402, 400, 2, 0)
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'done'").fetchone() == (400,)
    assert conn.execute("SELECT id, attempts FROM jobs WHERE attempts > 1 ORDER BY id"
                        ).fetchall() == [(first, 2), (slow, 2)]


def test_an_earlier_claim_of_a_job_its_own_refill_claimed_again_is_found_lost(conn, db_url):
    """The first claim of a job lapses while its handler runs and another drain's reaper
    puts it back; the batch's own refill claims it again. The heartbeat compares claims,
    not ids: the first claim is lost (its handler told to stop), and each claim is
    counted once."""
    drainer.enqueue_many(conn, "default", [{}] * 60)
    [(first,)] = conn.execute("SELECT min(id) FROM jobs").fetchall()
    second_started = threading.Event()
    both = threading.Barrier(2)
    seen: dict[str, bool] = {}

    def handler(job: Job) -> None:
        if job.id == first and job.attempts == 1:
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute("UPDATE jobs SET locked_until = now() - interval '1 second' "
                              "WHERE id = %s", (first,))
                drainer.reap(other)
            seen["reclaimed"] = second_started.wait(10)
            seen["cancelled"] = job.cancelled.wait(3)  # heartbeats come every second
            both.wait(15)
        elif job.id == first:
            second_started.set()
            both.wait(15)
        else:
            time.sleep(0.01)

    s = drain(conn, {"default": handler}, Options(queues=["default"], batch_size=8,
                                                  concurrency=2, lease=timedelta(seconds=3)))
    assert seen == {"reclaimed": True, "cancelled": True}
    assert balanced(s) and (s.done, s.lost) == (60, 1)


def test_a_limited_queue_is_not_starved_by_a_plain_queue_that_keeps_batches_full(conn):
    """A drain with a limited queue claims between batches (a refill, made while every
    slot is taken, could claim none of the limited jobs): jobs of a queue limited to 1
    that become ready early run early, not once 2,000 plain jobs are done."""
    drainer.enqueue_many(conn, "default", [{}] * 2000)
    drainer.enqueue_many(conn, "lim", [{}] * 3, delay=0.3)
    order: list[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> None:
        time.sleep(0.002)
        with lock:
            order.append(job.queue)

    lim = drainer.Task(handler, "lim", concurrency=1)
    s = drain(conn, {"default": handler, "lim": lim},
              Options(queues=["default", "lim"], batch_size=20, concurrency=4))
    positions = [i for i, q in enumerate(order) if q == "lim"]
    assert s.done == 2003 and len(positions) == 3 and max(positions) < 1000, positions


def test_a_refill_whose_write_back_fails_ends_the_batch_and_gives_back_what_never_ran(conn):
    """A write-back error that leaves the session alive (a trigger here; a full disk or
    a statement timeout in life) in a refill: nothing more starts, what finished since
    is written back, what never started is given back, and the error carries a
    summary that balances."""
    drainer.enqueue_many(conn, "default", [{}] * 200)
    [(bad,)] = conn.execute("SELECT id FROM jobs ORDER BY id OFFSET 30 LIMIT 1").fetchall()
    conn.execute(f"""
        CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.status = 'done' AND NEW.id = {bad} THEN RAISE EXCEPTION 'disk full'; END IF;
          RETURN NEW;
        END $$;
        CREATE TRIGGER boom BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION boom();""")
    ran: set[int] = set()

    def handler(job: Job) -> None:
        time.sleep(0.002)
        ran.add(job.id)

    with pytest.raises(drainer.DrainerError, match="disk full") as raised:
        drain(conn, {"default": handler},
              Options(queues=["default"], batch_size=20, concurrency=2))
    summary = raised.value.summary
    assert balanced(summary) and summary["done"] > 0
    held = {i for (i,) in conn.execute("SELECT id FROM jobs WHERE status = 'running'")}
    assert held and held <= ran  # only the failed write-back's, until their lease ends
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'queued' AND attempts > 0"
                        ).fetchone() == (0,)  # a job given back has its attempt back


def test_a_refills_hooks_do_not_hold_back_a_timeout(conn):
    """A refill's write-back, and its slow failure hook, run off the batch's thread: a
    handler past its 0.5 s timeout meanwhile is failed on time."""
    drainer.enqueue_many(conn, "default", [{}] * 60)
    first, stuck = [i for (i,) in conn.execute("SELECT id FROM jobs ORDER BY id LIMIT 2")]
    waited: list[float] = []

    def slow_hook(job: Job, error: str) -> None:
        time.sleep(3)

    def handler(job: Job) -> None:
        if job.id == first and job.attempts == 1:
            raise RuntimeError("fails once")
        if job.id == stuck and job.attempts == 1:
            began = time.monotonic()
            job.cancelled.wait(10)
            waited.append(time.monotonic() - began)
        time.sleep(0.002)

    task = drainer.Task(handler, "default", timeout=0.5, on_failure=slow_hook)
    s = drain(conn, {"default": task}, Options(queues=["default"], batch_size=8, concurrency=2))
    assert len(waited) == 1 and waited[0] < 1.5 and balanced(s)


def test_a_refills_hooks_do_not_hold_back_the_heartbeat(conn, db_url):
    """A 4 s failure hook in a refill, with a 3 s lease: a long job's lease is still
    extended meanwhile (heartbeats come from the batch's thread), so no reaper may take
    it while its handler runs."""
    drainer.enqueue_many(conn, "default", [{}] * 60)
    first, long = [i for (i,) in conn.execute("SELECT id FROM jobs ORDER BY id LIMIT 2")]
    lapsed: list[bool] = []

    def slow_hook(job: Job, error: str) -> None:
        time.sleep(4)
        with psycopg.connect(db_url, autocommit=True) as other:
            lapsed.append(other.execute("SELECT locked_until < now() FROM jobs WHERE id = %s",
                                        (long,)).fetchone()[0])

    def handler(job: Job) -> None:
        if job.id == first and job.attempts == 1:
            raise RuntimeError("fails once")
        time.sleep(6 if job.id == long else 0.002)

    task = drainer.Task(handler, "default", on_failure=slow_hook)
    s = drain(conn, {"default": task}, Options(queues=["default"], batch_size=8, concurrency=2,
                                               lease=timedelta(seconds=3)))
    assert lapsed == [False] and (s.done, s.retried) == (59, 1) and balanced(s)


def test_a_refill_landing_as_the_last_slot_leaves_still_runs(conn, monkeypatch):
    """A slot finds nothing to take, then leaves, under two holds of the lock; a refill
    landing in between must still have its jobs run (the batch's thread opens slots
    for them), not end the batch with them unstarted. The sleep widens the window a
    thread switch can open."""
    leave = Core.leave

    def slow_leave(self: Core) -> None:
        time.sleep(0.05)
        leave(self)

    monkeypatch.setattr(Core, "leave", slow_leave)
    drainer.enqueue_many(conn, "default", [{}] * 200)
    s = drain(conn, {"default": lambda job: None},
              Options(queues=["default"], batch_size=10, concurrency=1))
    assert (s.done, s.stopped) == (200, "empty")


def test_a_refills_jobs_never_start_on_a_lapsed_lease(conn, db_url):
    """A refill's slow failure hook (3.5 s, with a 3 s lease) runs after its claim, while
    the batch's thread heartbeats: the jobs it claimed are confirmed before they start
    (heartbeats that did not carry them do not count for them)."""
    drainer.enqueue_many(conn, "default", [{}] * 40)
    [(first,)] = conn.execute("SELECT min(id) FROM jobs").fetchall()
    lapsed: list[tuple[int, float | None]] = []
    lock = threading.Lock()

    def slow_hook(job: Job, error: str) -> None:
        time.sleep(3.5)

    with psycopg.connect(db_url, autocommit=True) as check:
        def handler(job: Job) -> None:
            if job.id == first and job.attempts == 1:
                raise RuntimeError("fails once")
            with lock:
                left = check.execute(
                    "SELECT extract(epoch FROM locked_until - now()) FROM jobs "
                    "WHERE id = %s AND attempts = %s AND status = 'running'",
                    (job.id, job.attempts)).fetchone()
            if left is None or left[0] <= 0:
                lapsed.append((job.id, None if left is None else left[0]))
            time.sleep(0.002)

        task = drainer.Task(handler, "default", on_failure=slow_hook)
        s = drain(conn, {"default": task}, Options(queues=["default"], batch_size=8,
                                                   concurrency=2, lease=timedelta(seconds=3)))
    assert lapsed == [] and balanced(s) and (s.done, s.retried) == (39, 1)


def test_a_refill_failing_after_its_claim_gives_back_what_it_claimed(conn):
    """A refill whose claim landed, then failed (a progress callback that raises): the
    jobs it claimed are given back with the others that never started, not left
    running until their lease ends."""
    drainer.enqueue_many(conn, "default", [{}] * 200)
    ran: set[int] = set()
    calls = {"n": 0}

    def on_batch(summary: Summary) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise drainer.DrainerError("progress sink broke")

    def handler(job: Job) -> None:
        ran.add(job.id)
        time.sleep(0.002)

    with pytest.raises(drainer.DrainerError, match="progress sink"):
        drain(conn, {"default": handler}, Options(queues=["default"], batch_size=20,
                                                  concurrency=2), on_batch=on_batch)
    held = {i for (i,) in conn.execute("SELECT id FROM jobs WHERE status = 'running'")}
    assert not held - ran
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'queued' AND attempts > 0"
                        ).fetchone() == (0,)


def slow_among_fast() -> tuple[Callable[[Job], None], list[int]]:
    """A handler that sleeps 0.1 s for a job whose payload says slow and returns at once
    for the others, and the list it fills: for each slow job, the jobs that started
    while it ran."""
    started = [0]
    lock = threading.Lock()
    during: list[int] = []

    def handler(job: Job) -> None:
        with lock:
            started[0] += 1
            before = started[0]
        if job.payload.get("slow"):
            time.sleep(0.1)
            with lock:
                during.append(started[0] - before)

    return handler, during


def test_a_limited_queue_of_mostly_fast_jobs_keeps_its_slots_busy_past_a_slow_one(conn):
    """A queue limited to 4 running, drained at --concurrency 4: its first job is slow
    (it waits, 5 s at most, until the 60 fast jobs behind it have run), the rest end
    within microseconds. The batch is refilled as slots free up, so every fast job
    runs while the slow one does, even once the quick refills of fast jobs make the
    time per job look small (run after other tests, three slots used to wait)."""
    fast_done = threading.Event()
    left = [60]
    lock = threading.Lock()
    seen: list[tuple[bool, int]] = []

    def handler(job: Job) -> None:
        if job.payload.get("slow"):
            seen.append((fast_done.wait(5), 60 - left[0]))
            return
        with lock:
            left[0] -= 1
            if not left[0]:
                fast_done.set()

    lim = drainer.Task(handler, "lim4", concurrency=4)
    drainer.enqueue(conn, "lim4", {"slow": True})
    drainer.enqueue_many(conn, "lim4", [{}] * 60)
    summary = drain(conn, {"lim4": lim}, Options(queues=["lim4"], concurrency=4))
    assert summary.done == 61
    assert seen == [(True, 60)]  # (every fast job ran while it waited, how many did)


def test_a_plain_queue_with_a_slow_job_in_every_claim_is_still_refilled(conn):
    """Claims of 20 at --concurrency 4; one job in 20 sleeps 0.1 s, the others end
    within microseconds. The batches' time per job, which holds the slow jobs, keeps
    them refilled, so jobs of the next claim start while a slow one runs, not only the
    19 others of its claim. Counted: for each slow job, the jobs that started while it
    ran."""
    handler, during = slow_among_fast()
    drainer.enqueue_many(conn, "mixed", [{"slow": i % 20 == 0} for i in range(200)])
    summary = drain(conn, {"mixed": handler},
                    Options(queues=["mixed"], batch_size=20, concurrency=4))
    assert summary.done == 200
    assert len(during) == 10
    refilled = [n for n in during[2:] if n > 19]  # past the first batches: pace known
    assert len(refilled) >= 4, during


@pytest.mark.parametrize("limit", [{"concurrency": 4}, {"per_group": 1},
                                   {"rate": "10000/second"}],
                         ids=["concurrency", "per_group", "rate"])
def test_a_limited_queue_with_slow_jobs_among_fast_ones_is_still_refilled(conn, limit):
    """A limited queue drained at --concurrency 4 (its claims take no more than the 4
    slots): one job in 20 sleeps 0.1 s, the others end within microseconds. Its
    batches are refilled, so dozens of jobs start while a slow one runs, not only the
    3 others of its claim. Counted: for each slow job, the jobs that started while it
    ran."""
    handler, during = slow_among_fast()
    for i in range(200):
        drainer.enqueue(conn, "lim4", {"slow": i % 20 == 0}, group=f"g{i}")
    summary = drain(conn, {"lim4": drainer.Task(handler, "lim4", **limit)},
                    Options(queues=["lim4"], concurrency=4))
    assert summary.done == 200 and len(during) == 10
    assert len([n for n in during[2:] if n > 3]) >= 4, during


def test_a_plain_queue_drained_with_a_slow_limited_one_does_not_wait_for_its_jobs(conn):
    """One drain, --concurrency 4, of a plain queue of 300 no-op jobs and a queue limited
    to 1 running whose 5 jobs are slow: the first waits (5 s at most) until every plain
    job has started. While it runs, plain jobs go on being claimed and run on the other
    slots (its batch is refilled), so it never waits its 5 s. Events, not timings: a
    loaded machine only makes it slower."""
    plain_left, lock = [300], threading.Lock()
    every_plain_started = threading.Event()
    slow: list[tuple[int, bool]] = []  # per slow job: plain jobs left at its start, waited

    def handler(job: Job) -> None:
        if job.payload.get("slow"):
            with lock:
                left = plain_left[0]
            slow.append((left, every_plain_started.wait(5)))
            return
        with lock:
            plain_left[0] -= 1
            if plain_left[0] == 0:
                every_plain_started.set()

    drainer.enqueue_many(conn, "slowlim", [{"slow": True}] * 5)
    drainer.enqueue_many(conn, "plainq", [{}] * 300)
    summary = drain(conn, {"plainq": handler,
                           "slowlim": drainer.Task(handler, "slowlim", concurrency=1)},
                    Options(queues=["plainq", "slowlim"], concurrency=4))
    assert summary.done == 305 and len(slow) == 5
    left_at_start, waited = slow[0]
    assert left_at_start >= 100, slow  # the first slow job began among the plain ones
    assert waited, slow  # and the rest of them ran while it did


def test_a_refill_near_the_deadline_never_holds_limited_jobs_it_cannot_start(conn, db_url):
    """A queue limited to 3 running, --concurrency 3, --max-runtime: one long job (4 s)
    and short ones (0.4 s). Near the deadline a refill's claim is sized by the mean time
    per job (fits) while a job starts only if the queue's longest run fits (may_start):
    a limited job claimed then is never started, yet stays 'running' until the long
    handler ends, holding one of the queue's 3 places that no drainer may use."""
    long_id = drainer.enqueue(conn, "capped3", {"sleep": 4.0})
    drainer.enqueue_many(conn, "capped3", [{"sleep": 0.4}] * 40)
    started: set[int] = set()  # jobs whose handler began
    lock = threading.Lock()
    held: list[tuple[float, list[int]]] = []

    def handler(job: Job) -> None:
        with lock:
            started.add(job.id)
        time.sleep(job.payload["sleep"])

    stop_watch = threading.Event()

    def watch() -> None:
        with psycopg.connect(db_url, autocommit=True) as other:
            while not stop_watch.is_set():
                ids = [i for (i,) in other.execute(
                    "SELECT id FROM jobs WHERE queue = 'capped3' AND status = 'running'")]
                with lock:
                    never = [i for i in ids if i not in started]
                # A claim just landed has a moment before its handler starts.
                if never:
                    held.append((time.monotonic(), never))
                time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    task = drainer.Task(handler, "capped3", concurrency=3)
    watcher.start()
    try:
        summary = drain(conn, {"capped3": task},
                        Options(queues=["capped3"], concurrency=3,
                                deadline=clock.monotonic() + 2.0))
    finally:
        stop_watch.set()
        watcher.join()
    assert summary.stopped == "deadline"
    assert conn.execute("SELECT status FROM jobs WHERE id = %s", (long_id,)).fetchone() == (
        "done",)
    # Jobs 'running' in the table whose handler never began, seen for more than 0.5 s:
    # claimed, held back, holding the limit.
    by_job: dict[int, list[float]] = {}
    for at, ids in held:
        for i in ids:
            by_job.setdefault(i, []).append(at)
    stuck = {i: round(max(ats) - min(ats), 2) for i, ats in by_job.items()
             if max(ats) - min(ats) > 0.5}
    assert stuck == {}


def test_a_groups_next_job_does_not_wait_for_another_groups_slow_job(conn):
    """per_group=1, --concurrency 4. Group g1's only job runs 4 s; g2's one job ends at
    once; g3's first job X runs 0.3 s, then Y. The refill after g2's job claims nothing
    (g1 and g3 are held by their running heads), and the batch was never refilled
    again: X, finished, stayed 'running' in the table until g1's slow job ended, and
    its group (Y, here or in any other drainer) waited for a job of another group."""
    starts: dict[str, float] = {}
    ends: dict[str, float] = {}

    def handler(job: Job) -> None:
        starts[job.payload["name"]] = time.monotonic()
        time.sleep(job.payload["sleep"])
        ends[job.payload["name"]] = time.monotonic()

    drainer.enqueue(conn, "fifo1", {"name": "slow", "sleep": 4.0}, group="g1")
    drainer.enqueue(conn, "fifo1", {"name": "quick", "sleep": 0.0}, group="g2")
    drainer.enqueue(conn, "fifo1", {"name": "X", "sleep": 0.3}, group="g3")
    drainer.enqueue(conn, "fifo1", {"name": "Y", "sleep": 0.0}, group="g3")
    task = drainer.Task(handler, "fifo1", per_group=1)
    summary = drain(conn, {"fifo1": task}, Options(queues=["fifo1"], concurrency=4))
    assert summary.done == 4
    assert starts["Y"] - ends["X"] < 1.0, starts["Y"] - ends["X"]


def test_a_drain_with_nothing_ready_near_its_deadline_says_empty(conn):
    """A limited queue whose task's timeout is longer than the time left is left out of
    the claim; the drain said 'deadline' whether or not that queue held a ready job
    (here none exists at all), and an always-on worker stops at anything but 'empty'."""
    task = drainer.Task(lambda job: None, "lim", concurrency=2, timeout=60)
    summary = drain(conn, {"lim": task, "plain": lambda job: None},
                    Options(queues=["plain", "lim"], concurrency=2,
                            deadline=clock.monotonic() + 30))
    assert summary.stopped == "empty", summary
    drainer.enqueue(conn, "lim", {})
    summary = drain(conn, {"lim": task, "plain": lambda job: None},
                    Options(queues=["plain", "lim"], concurrency=2,
                            deadline=clock.monotonic() + 30))
    assert (summary.stopped, summary.claimed) == ("deadline", 0), summary



def test_fast_handlers_refill_a_round_trip_ahead_of_running_out():
    """With a lead of 40 jobs, the refill goes out while the 11th of 50 jobs runs (39
    wait), not as the last ones start: the database works on the next claim while the
    handlers run. The 11th waits (5 s at most) for the refill to be sent."""
    sent = threading.Event()
    ran: list[int] = []
    parts: list[list[int]] = []

    def handler(job: Job) -> None:
        ran.append(job.id)
        if job.id == 11:
            sent.wait(5)

    def refill(part: Outcome, land: Land, free: int) -> bool:
        parts.append([j.id for j in part.succeeded])
        sent.set()
        land([])
        return False

    outcome = Batch([Job(i, "default", None, 1, 5) for i in range(1, 51)],
                    {"default": handler}, concurrency=1, lease=timedelta(minutes=5),
                    extend=lambda js: {j.token for j in js}, may_start=lambda j: True,
                    stop=threading.Event(), refill=refill, refill_lead=lambda: 40).run()
    assert parts and len(parts[0]) <= 10  # sent with the first ten's results at most
    assert ran == list(range(1, 51)) and len(outcome.succeeded) + len(parts[0]) == 50


def test_slow_handlers_refill_as_their_last_job_starts_as_before():
    """Slow handlers get no lead (Sizer.lead: a round trip runs fewer jobs than two
    rounds): the refill goes as the batch's last job starts, never while one waits.
    Job 3 waits (3 s at most) for a refill sent too early."""
    sent = threading.Event()
    waiting: list[int] = []
    pending = {1, 2, 3, 4}
    sizer = Sizer(pinned=4, concurrency=1)
    sizer.tripped(0.02)
    sizer.observe(4, 40.0, full=True)  # 10 s a job

    def handler(job: Job) -> None:
        pending.discard(job.id)
        if job.id == 3:
            sent.wait(3)

    def refill(part: Outcome, land: Land, free: int) -> bool:
        waiting.append(len(pending))
        sent.set()
        land([])
        return False

    Batch([Job(i, "default", None, 1, 5) for i in range(1, 5)], {"default": handler},
          concurrency=1, lease=timedelta(minutes=5), extend=lambda js: {j.token for j in js},
          may_start=lambda j: True, stop=threading.Event(), refill=refill,
          refill_lead=sizer.lead).run()
    assert waiting == [0]
