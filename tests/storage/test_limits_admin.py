"""Flow control against admin commands (cancel, requeue, reap, archive) racing a
limited drain, hand edits of the tables, and odd values another producer leaves."""

import asyncio
import threading
import time
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer import model, testing
from drainer.commands import doctor
from drainer.commands import stats as stats_command
from drainer.engine import drain as drain_
from drainer.engine import summary as summary_
from drainer.engine.batch import Batch
from drainer.engine.outcome import Outcome
from drainer.storage import admin, claim, roundtrip, sql, writeback
from drainer.storage.limits import Limits
from tests.claims import claim_waiting_for_the_lock, limit_held
from tests.helpers import wait_until

LEASE = timedelta(minutes=5)
FIFO = Limits("fifo", per_group=1)
SINGLE = Limits("single", concurrency=1)


def lease_ended(conn, job_id: int, at: str = "now()") -> None:
    """The claim's lease of a job cancelled while running ends: its kept places free."""
    conn.execute(f"UPDATE jobs SET locked_until = {at}, cancelled_running_until = {at} "
                 "WHERE id = %s", (job_id,))


def status(conn, job_id: int) -> tuple:
    return conn.execute("SELECT status, attempts, last_error FROM jobs WHERE id = %s",
                        (job_id,)).fetchone()


@pytest.mark.parametrize("limit", [{"per_group": 1}, {"concurrency": 1}])
def test_a_job_cancelled_while_running_holds_its_place_while_its_handler_runs_on(
        conn, db_url, declared, limit):
    """`drainer cancel` of a running job of a limited queue: the job is 'failed' at
    once, but its handler learns of it only at its drain's next heartbeat (an `async
    def` one is cancelled then), so the job keeps its place in its group (its queue)
    meanwhile: another drainer started then does not run the group's next job at the
    same time."""
    spans: dict[int, list[float]] = {}

    async def handler(job: model.Job) -> None:
        spans[job.id] = [time.monotonic()]
        try:
            await asyncio.sleep(job.payload["sleep"])
        finally:
            spans[job.id].append(time.monotonic())

    kind = "fifo" if "per_group" in limit else "single"
    task = drainer.task(kind, **limit)(handler)
    first = drainer.enqueue(conn, kind, {"sleep": 3.0}, group="g")
    second = drainer.enqueue(conn, kind, {"sleep": 0.0}, group="g")
    options = drainer.Options(queues=[kind], concurrency=2, lease=timedelta(seconds=60))
    with psycopg.connect(db_url, autocommit=True) as other:
        worker = threading.Thread(target=drainer.drain, args=(other, {kind: task}, options))
        worker.start()
        try:
            deadline = time.monotonic() + 30
            while first not in spans and time.monotonic() < deadline:
                time.sleep(0.01)
            assert drainer.cancel(conn, [first]) == [first]  # an operator, mid-run
            drainer.drain(conn, {kind: task}, options)  # another drainer starts now
        finally:
            worker.join(60)
    if second not in spans:  # held back: its place frees when the cancelled lease ends
        lease_ended(conn, first)
        drainer.drain(conn, {kind: task}, options)
    (_, a_end), (b_start, _) = spans[first], spans[second]
    assert b_start >= a_end, (f"job {second} started {a_end - b_start:.2f} s before the "
                              f"cancelled job {first}'s handler ended")


def test_a_cancelled_running_head_holds_its_place_until_its_lease_ends(conn):
    """The same at the claim: after `cancel` of a running head (its handler may run
    until its worker's next heartbeat), the group's next job waits until the cancelled
    claim's lease ends, and next_due says when that is."""
    a = drainer.enqueue(conn, "fifo", {}, group="g")
    b = drainer.enqueue(conn, "fifo", {}, group="g")
    roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    [(lease_end,)] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s", (a,))
    assert admin.cancel(conn, [a]) == [a]
    assert status(conn, a) == ("failed", 1, "cancelled")
    assert roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10) == []
    assert admin.due(conn, [], limited=[FIFO]).lease_end == lease_end
    lease_ended(conn, a)  # it ended
    assert [j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)] == [b]


def test_let_go_frees_a_cancelled_claims_place_and_touches_no_other(conn):
    """writeback.end_cancelled, which a drain sends once a cancelled claim's handler has ended:
    the place frees at once; a claim still running, a stale token, and a job requeued
    since keep what they had."""
    a, b, c = (drainer.enqueue(conn, "fifo", {}, group=g) for g in ("a", "a", "c"))
    [ja, jc] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    admin.cancel(conn, [a])
    stale = model.Job(a, "fifo", {}, ja.attempts - 1, ja.max_attempts)
    assert writeback.end_cancelled(conn, [stale, jc]) == 0  # not that claim; still running
    assert roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10) == []
    assert writeback.end_cancelled(conn, [ja]) == 1 and writeback.end_cancelled(conn, [ja]) == 0
    assert status(conn, a) == ("failed", 1, "cancelled")
    assert [j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)] == [b]
    assert status(conn, c) == ("running", 1, None)
    admin.cancel(conn, [b])
    [(lease_end,)] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s", (b,))
    requeued = admin.requeue(conn, ids=[b])  # its handler may run on: it stays failed
    assert requeued == [] and requeued.waiting == {b: lease_end}
    assert writeback.end_cancelled(conn, [model.Job(b, "fifo", {}, 1, 5)]) == 1  # the handler ended
    assert admin.requeue(conn, ids=[b]) == [b]
    # Queued again: not its own.
    assert writeback.end_cancelled(conn, [model.Job(b, "fifo", {}, 1, 5)]) == 0


def test_a_drain_frees_a_cancelled_jobs_place_once_its_async_handler_is_cancelled(
        conn, db_url, declared):
    """cancel of a running `async def` handler's job: the drain's next heartbeat finds
    it cancelled and cancels the handler, then frees its place at once, rather than at
    the claim's lease end; the group's next job runs in the next drain."""
    started = threading.Event()
    ran: list[int] = []

    async def handler(job: model.Job) -> None:
        ran.append(job.id)
        started.set()
        await asyncio.sleep(job.payload["sleep"])

    task = drainer.task("fifo", per_group=1)(handler)
    first = drainer.enqueue(conn, "fifo", {"sleep": 60}, group="g")
    second = drainer.enqueue(conn, "fifo", {"sleep": 0}, group="g")
    options = drainer.Options(queues=["fifo"], lease=timedelta(seconds=6))
    with psycopg.connect(db_url, autocommit=True) as other:
        worker = threading.Thread(target=drainer.drain, args=(other, {"fifo": task}, options))
        worker.start()
        assert started.wait(30)
        assert drainer.cancel(conn, [first]) == [first]
        worker.join(30)
    freed = conn.execute("SELECT locked_until IS NULL FROM jobs WHERE id = %s",
                         (first,)).fetchone()
    drainer.drain(conn, {"fifo": task}, options)
    assert freed == (True,) and ran == [first, second]


def test_a_handler_that_ends_after_its_job_was_cancelled_frees_its_place(conn, declared):
    """A handler that ends before any heartbeat saw its job cancelled: its write-back
    changes nothing (the job is counted lost) and its place frees as it ends."""
    def handler(job: model.Job) -> None:
        with psycopg.connect(conn.info.dsn, autocommit=True) as admin:
            drainer.cancel(admin, [job.id])

    task = drainer.task("single", concurrency=1)(handler)
    job = drainer.enqueue(conn, "single", {})
    summary = drainer.drain(conn, {"single": task}, drainer.Options(queues=["single"]))
    assert summary.lost == 1 and status(conn, job) == ("failed", 1, "cancelled")
    assert conn.execute("SELECT locked_until IS NULL FROM jobs").fetchone() == (True,)


def test_a_claimed_job_cancelled_before_it_started_is_let_go_at_the_next_heartbeat(
        conn, declared):
    """A job cancelled while it waits in its batch (claimed, not started): the heartbeat
    drops it, and lets go of the lease cancel had kept for it."""
    def handler(job: model.Job) -> None:
        if job.payload["first"]:
            with psycopg.connect(conn.info.dsn, autocommit=True) as admin:
                drainer.cancel(admin, [job.id + 1])
            time.sleep(1.5)  # a heartbeat (every second) finds the next one cancelled

    task = drainer.task("plain")(handler)
    drainer.enqueue_many(conn, "plain", [{"first": True}, {"first": False}])
    summary = drainer.drain(conn, {"plain": task}, drainer.Options(
        queues=["plain"], concurrency=1, lease=timedelta(seconds=3)))
    assert (summary.done, summary.lost) == (1, 1)
    assert conn.execute("SELECT status, locked_until IS NULL FROM jobs ORDER BY id").fetchall(
        ) == [("done", True), ("failed", True)]


@pytest.mark.parametrize("at", ["infinity", "9999-12-31 23:59:00+00"])
def test_a_start_dated_past_pythons_range_does_not_crash_every_drain_of_its_queue(
        conn, declared, at):
    """A `drainer_starts` row written by hand (or by a server whose clock was wrong)
    dated 'infinity' or in year 9999 holds its token for good (it never leaves the
    window, so it is never pruned): the drain ends with no next token, not with the
    time at + the window, which Python cannot hold (every drain of the queue failed)."""
    conn.execute("INSERT INTO drainer_starts VALUES ('rated', %s)", (at,))
    drainer.enqueue(conn, "rated", {})
    task = drainer.task("rated", rate="1/minute")(lambda job: None)
    summary = drainer.drain(conn, {"rated": task}, drainer.Options(queues=["rated"]))
    assert (summary.claimed, summary.next_due) == (0, None)  # held for good: no wake-up


@pytest.mark.parametrize("edit", ["per_seconds = NULL", "per_seconds = 'Infinity'",
                                  "per_seconds = 1e300"])
def test_stats_and_doctor_survive_a_hand_edited_limits_row(conn, edit):
    """drainer_limits is only a record for `stats` and `doctor` (the claim takes the
    limits from the code), so an operator may edit or empty it: a rate with no window
    (NULL), or with one past an interval's range, is shown as a rate of unknown
    window, and neither command fails."""
    admin.record_limits(conn, [Limits("rated", rate=10, per_seconds=60.0)], [])
    drainer.enqueue(conn, "rated", {})
    conn.execute(f"UPDATE drainer_limits SET {edit}")
    text = stats_command.format_stats(stats_command.stats(conn))
    assert "rated: rate 0/10 per ? s" in text
    doctor.diagnose(conn)


def test_requeue_of_an_older_failed_job_never_overlaps_nor_jumps_a_running_one(conn):
    """per_group=1, group g: A failed for good, B running, C queued. A requeue of A
    while B runs starts nothing; once B is done A (the oldest) goes before C; never
    two at once."""
    a = drainer.enqueue(conn, "fifo", {}, group="g", max_attempts=1)
    b = drainer.enqueue(conn, "fifo", {}, group="g")
    c = drainer.enqueue(conn, "fifo", {}, group="g")
    [ja] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    writeback.fail(conn, [(ja, "boom")])
    [jb] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    assert jb.id == b
    assert admin.requeue(conn, ids=[a]) == [a]
    assert roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10) == []
    settled = roundtrip.settle(conn, [jb], [], [],
                           claim_next=claim.Claim([], 10, LEASE, [FIFO], 10))
    assert [j.id for j in settled.claimed] == [a]
    settled = roundtrip.settle(conn, settled.claimed, [], [],
                           claim_next=claim.Claim([], 10, LEASE, [FIFO], 10))
    assert [j.id for j in settled.claimed] == [c]


def test_a_requeue_that_commits_while_a_claim_waits_for_the_lock_is_seen_by_it(conn, db_url):
    """The claim's snapshot is taken after the limits lock: a requeue of the group's
    older failed job that commits while the claim waits makes the claim take that job,
    not the newer one queued behind it."""
    a = drainer.enqueue(conn, "fifo", {}, group="g", max_attempts=1)
    drainer.enqueue(conn, "fifo", {}, group="g")
    [ja] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    writeback.fail(conn, [(ja, "boom")])
    with (limit_held(db_url, "fifo") as holder,
          psycopg.connect(db_url, autocommit=True) as claimer):
        claiming = claim_waiting_for_the_lock(conn, claimer, FIFO)
        assert admin.requeue(conn, ids=[a]) == [a]
        holder.commit()
        assert [j.id for j in claiming.result(timeout=30)] == [a]


def test_a_reap_that_commits_while_a_claim_waits_gives_the_group_its_head_back_once(
        conn, db_url):
    """A dead worker's head of group g, lease expired: `drainer reap` commits while a
    claim waits for the lock. The claim takes the head again (attempt 2), not the job
    behind it; the stale worker's writes change nothing; the place stays counted."""
    a = drainer.enqueue(conn, "fifo", {}, group="g")
    drainer.enqueue(conn, "fifo", {}, group="g")
    [stale] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second' WHERE id = %s",
                 (a,))
    with (limit_held(db_url, "fifo") as holder,
          psycopg.connect(db_url, autocommit=True) as claimer):
        claiming = claim_waiting_for_the_lock(conn, claimer, FIFO)
        assert admin.reap(conn) == 1
        holder.commit()
        [again] = claiming.result(timeout=30)
    assert (again.id, again.attempts) == (a, 2)
    assert writeback.complete(conn, [stale]) == set()
    assert writeback.release(conn, [stale]) == set()
    assert roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10) == []


def test_a_stale_write_back_after_cancel_requeue_and_a_new_claim_frees_no_place(conn):
    """cancel of a running head, requeue by id, a new claim (attempt 2): the first
    worker's completion, failure, release and heartbeat change nothing, and the group's
    next job still waits for the new claim."""
    a = drainer.enqueue(conn, "fifo", {}, group="g")
    drainer.enqueue(conn, "fifo", {}, group="g")
    [stale] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    assert admin.cancel(conn, [a]) == [a]
    lease_ended(conn, a)  # lease ended
    assert admin.requeue(conn, ids=[a]) == [a]
    [current] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    assert current.token == (a, 2)
    assert writeback.extend(conn, [stale], LEASE) == set()
    for write in (lambda: writeback.complete(conn, [stale]),
                  lambda: writeback.fail(conn, [(stale, "stale")]),
                  lambda: writeback.release(conn, [stale])):
        assert not write()
    assert status(conn, a) == ("running", 2, None)
    assert roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10) == []


def test_archiving_with_no_retention_mid_drain_leaves_every_counted_row(conn):
    """`drainer archive --archive-after 0 --archive-failed-after 0` while a limited
    queue runs: running and queued rows (what the limits count) stay, and so does a
    head cancelled while running until its lease ends (its handler may run on): its
    group waits, the other's order goes on."""
    heads = [drainer.enqueue(conn, "fifo", {}, group=g) for g in ("g1", "g2")]
    behind = [drainer.enqueue(conn, "fifo", {}, group=g) for g in ("g1", "g2")]
    claimed = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    assert sorted(j.id for j in claimed) == heads
    admin.cancel(conn, [heads[1]])
    writeback.complete(conn, [j for j in claimed if j.id == heads[0]])

    def archive() -> int:
        return admin.archive(conn, timedelta(0), failed_older_than=timedelta(0),
                             now=conn.execute("SELECT now() + interval '1 second'"
                                              ).fetchone()[0])

    assert archive() == 1  # the done head
    assert [j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
            ] == [behind[0]]
    lease_ended(conn, heads[1], "now() - interval '1 second'")
    assert archive() == 1
    assert [j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
            ] == [behind[1]]


def test_a_waiting_job_moved_to_another_group_by_hand_takes_its_place_there_by_id(conn):
    """UPDATE jobs SET meta = ... of a queued job: it joins the other group in id
    order (ahead of that group's newer jobs), and leaves its old group's order."""
    old = drainer.enqueue(conn, "fifo", {}, group="a")
    drainer.enqueue(conn, "fifo", {}, group="b")  # b's head, newer than old
    behind = drainer.enqueue(conn, "fifo", {}, group="a")
    conn.execute("""UPDATE jobs SET meta = '{"group": "b"}' WHERE id = %s""", (old,))
    assert sorted(j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
                  ) == [old, behind]


def test_a_running_job_moved_to_another_queue_by_hand_is_still_written_back(conn):
    """UPDATE jobs SET queue = ... of a running job: its place moves with it (the
    limits count the table), and its worker's result still lands: nothing lost."""
    a = drainer.enqueue(conn, "single", {})
    b = drainer.enqueue(conn, "single", {})
    [job] = roundtrip.claim(conn, [], 10, LEASE, limited=[SINGLE], take=10)
    conn.execute("UPDATE jobs SET queue = 'elsewhere' WHERE id = %s", (a,))
    assert [j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[SINGLE], take=10)] == [b]
    assert writeback.complete(conn, [job]) == {a}


def test_an_empty_group_is_a_group_and_a_missing_one_is_none(conn):
    """group='' is a group of its own (one at a time), unlike group=None."""
    first = drainer.enqueue(conn, "fifo", {}, group="")
    drainer.enqueue(conn, "fifo", {}, group="")
    free = drainer.enqueue(conn, "fifo", {})
    assert sorted(j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
                  ) == [first, free]


def test_deleting_the_starts_by_hand_gives_the_rate_its_tokens_back(conn):
    """An operator's reset of a rate: what the window counts is the table."""
    rated = Limits("rated", rate=2, per_seconds=3600.0)
    drainer.enqueue_many(conn, "rated", [{}] * 4)
    assert len(roundtrip.claim(conn, [], 10, LEASE, limited=[rated], take=10)) == 2
    assert roundtrip.claim(conn, [], 10, LEASE, limited=[rated], take=10) == []
    conn.execute("DELETE FROM drainer_starts")
    assert len(roundtrip.claim(conn, [], 10, LEASE, limited=[rated], take=10)) == 2


def held(conn, job_id: int) -> tuple:
    """(status, attempts, whether it holds its place: cancelled with its lease kept)."""
    return conn.execute("SELECT status, attempts, coalesce(locked_until > now(), false) "
                        "FROM jobs WHERE id = %s", (job_id,)).fetchone()


def claimed(conn, lim: Limits) -> list[int]:
    return [j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[lim], take=10)]


def test_a_release_whose_answer_was_lost_never_lets_go_a_claim_taken_since(conn, db_url):
    """Drain A gives back an unstarted job J (its release lowers attempts, so the next
    claim of J gets A's token (J, 1) again); the session drops with the answer, after
    the commit. Meanwhile drain B claims J, token (J, 1), its handler starts, and an
    operator cancels J. A sends again (settle_again: without the release, whose outcome
    it does not know): A's end_cancelled must not free B's place while B's handler runs."""
    j = drainer.enqueue(conn, "fifo", {}, group="g")
    drainer.enqueue(conn, "fifo", {}, group="g")
    [ja] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)  # drain A
    outcome = Outcome(unstarted=[ja])  # A stops before starting it (deadline, signal)

    with psycopg.connect(db_url, autocommit=True) as b:
        class AnswerLost:  # engine.session.Reconnecting, its session dropped after the commit
            def send(self, first, again=None):
                first(conn)  # landed: J queued again, attempts 0
                [jb] = roundtrip.claim(b, [], 10, LEASE, limited=[FIFO], take=10)  # drain B
                assert jb.token == ja.token  # the same token: the release gave it back
                assert drainer.cancel(b, [j]) == [j]  # B's handler is running
                return (again or first)(conn)  # A, on its new session

        settled = drain_.settle(AnswerLost(), outcome, None, None)
        ended = summary_.ended_lost(settled, outcome)  # what write_back sends
        if ended:
            writeback.end_cancelled(conn, ended)
    assert held(conn, j) == ("failed", 1, True), "B's place was let go"
    assert claimed(conn, FIFO) == []


def test_a_requeue_of_a_job_cancelled_while_running_keeps_its_place(conn):
    """`cancel` then `requeue ID` of a running job of a queue with concurrency=1: a
    queued job holds no place, so the requeue leaves it failed while its handler may
    run on, and says until when; no other job starts beside that handler."""
    a = drainer.enqueue(conn, "single", {})
    m = drainer.enqueue(conn, "single", {})
    assert claimed(conn, SINGLE) == [a]
    drainer.cancel(conn, [a])
    [(lease_end,)] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s", (a,))
    requeued = drainer.requeue(conn, ids=[a])
    assert (requeued, requeued.waiting) == ([], {a: lease_end})
    assert claimed(conn, SINGLE) == [], f"job {m} started beside job {a}'s handler"


@pytest.mark.parametrize("failed", [
    # an older release's cancel of a delayed job left its run_at to come
    "status = 'failed', last_error = 'cancelled', run_at = now() + interval '7 days'",
    # another producer withdrawing a job by hand, or parking it
    "status = 'failed', last_error = 'obsolete', run_at = now() + interval '30 days'",
    "status = 'failed', last_error = 'parked', run_at = 'infinity'",
])
def test_a_failed_row_due_later_that_no_handler_runs_holds_no_place(conn, failed):
    """Only a job cancelled while running (its lease kept) has a handler that may run
    on; a failed job dated later for another reason holds no place."""
    old = drainer.enqueue(conn, "single", {}, delay=timedelta(days=7))
    conn.execute(f"UPDATE jobs SET {failed} WHERE id = %s", (old,))
    m = drainer.enqueue(conn, "single", {})
    assert claimed(conn, SINGLE) == [m]


def test_an_in_transaction_drain_frees_the_place_of_a_job_cancelled_under_it(conn, declared):
    """drainer.testing's drain_now(in_transaction=True), whose clock stands still: a
    handler cancels its own job on a concurrency=1 queue; the drain lets its place go,
    so the second job runs in the same drain."""
    ran: list[int] = []

    def handler(job: model.Job) -> None:
        ran.append(job.id)
        if job.payload["cancel"]:
            drainer.cancel(conn, [job.id])

    task = drainer.task("single", concurrency=1)(handler)
    conn.autocommit = False
    try:
        first = drainer.enqueue(conn, "single", {"cancel": True})
        second = drainer.enqueue(conn, "single", {"cancel": False})
        summary = testing.drain_now(conn, handlers={"single": task}, in_transaction=True)
    finally:
        conn.rollback()
        conn.autocommit = True
    assert summary.lost == 1 and ran == [first, second]


def test_let_go_of_an_old_claim_never_touches_the_claim_after_cancel_requeue(conn):
    """cancel, requeue by id once the lease ended, a claim by another drainer, cancel
    again: the first drain's heartbeat of its cancelled claim (hold) and its end_cancelled
    (its token (J, 1)) change nothing."""
    j = drainer.enqueue(conn, "fifo", {}, group="g")
    drainer.enqueue(conn, "fifo", {}, group="g")
    [ja] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    drainer.cancel(conn, [j])
    lease_ended(conn, j)  # it ended
    assert drainer.requeue(conn, ids=[j]) == [j]
    [jb] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    assert jb.token == (j, 2)
    drainer.cancel(conn, [j])
    [(held_until,)] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s", (j,))
    assert writeback.extend_cancelled(conn, [ja], timedelta(hours=1)) == 0
    assert writeback.end_cancelled(conn, [ja]) == 0
    assert conn.execute("SELECT locked_until FROM jobs WHERE id = %s", (j,)).fetchone() == (
        held_until,)
    assert claimed(conn, FIFO) == []


@pytest.mark.parametrize("lease", ["NULL", "'infinity'", "'-infinity'",
                                   "now() - interval '1 minute'"])
def test_cancel_and_requeue_of_a_running_row_with_an_odd_lease(conn, lease):
    """A running row whose lease is NULL, infinite or over (a dead worker's, not yet
    reaped): cancel keeps no lease, so neither the limit nor the requeue waits for
    ever; the requeued job is ready at once."""
    a = drainer.enqueue(conn, "single", {})
    assert claimed(conn, SINGLE) == [a]
    conn.execute(f"UPDATE jobs SET locked_until = {lease} WHERE id = %s", (a,))
    drainer.cancel(conn, [a])
    assert held(conn, a) == ("failed", 1, False)
    assert drainer.requeue(conn, ids=[a]) == [a]
    assert claimed(conn, SINGLE) == [a]


def test_archiving_keeps_a_job_cancelled_while_running_until_its_lease_ends(conn):
    """Zero retention archives a job cancelled while queued at once, but not one
    cancelled while running: its handler may run on, and its place is held."""
    a = drainer.enqueue(conn, "single", {}, delay=timedelta(hours=1))
    b = drainer.enqueue(conn, "single", {})
    assert claimed(conn, SINGLE) == [b]
    drainer.cancel(conn, [a, b])
    assert (held(conn, a), held(conn, b)) == (("failed", 0, False), ("failed", 1, True))
    later = conn.execute("SELECT now() + interval '1 second'").fetchone()[0]
    assert admin.archive(conn, timedelta(days=7), failed_older_than=timedelta(0),
                         now=later) == 1
    assert conn.execute("SELECT id FROM jobs").fetchall() == [(b,)]


def test_before_migration_10_a_cancel_frees_the_place_at_once(conn):
    """Without migration 10's index the limits count no job cancelled while running
    (counting them would read every failed job at each claim): the claim, next_due and
    stats still work, and the cancelled job's place is free at once."""
    a = drainer.enqueue(conn, "fifo", {}, group="g")
    b = drainer.enqueue(conn, "fifo", {}, group="g")
    assert claimed(conn, FIFO) == [a]
    conn.execute("DROP INDEX jobs_held_idx")
    sql.forget(conn)
    drainer.cancel(conn, [a])
    admin.record_limits(conn, [FIFO], [])
    assert admin.due(conn, [], limited=[FIFO]).next_due is not None
    text = stats_command.format_stats(stats_command.stats(conn))
    assert "fifo: 1 per group; 1 ready, 0 held back" in text
    assert claimed(conn, FIFO) == [b]


@pytest.mark.parametrize("limit", [{"concurrency": 1}, {"per_group": 1}])
def test_a_cancelled_handler_that_outlives_its_lease_in_a_live_drain_keeps_its_place(
        conn, db_url, declared, limit):
    """A sync handler that never looks at job.cancelled runs past the lease cancel kept,
    in a drain that is alive: its heartbeats go on extending that lease, so neither the
    next job nor a requeue of the cancelled one starts beside the handler."""
    started, finish = threading.Event(), threading.Event()

    def handler(job: model.Job) -> None:
        if job.payload["long"]:
            started.set()
            finish.wait(30)  # a long export that never looks at job.cancelled

    kind, lim = ("single", SINGLE) if "concurrency" in limit else ("fifo", FIFO)
    task = drainer.task(kind, **limit)(handler)
    first = drainer.enqueue(conn, kind, {"long": True}, group="g")
    drainer.enqueue(conn, kind, {"long": False}, group="g")
    options = drainer.Options(queues=[kind], concurrency=2, lease=timedelta(seconds=3))
    with psycopg.connect(db_url, autocommit=True) as other:
        worker = threading.Thread(target=drainer.drain, args=(other, {kind: task}, options))
        worker.start()
        try:
            assert started.wait(30)
            assert drainer.cancel(conn, [first]) == [first]
            time.sleep(4.5)  # past the 3 s lease cancel kept; the handler still runs
            assert worker.is_alive()
            took = claimed(conn, lim)
            requeued = drainer.requeue(conn, ids=[first])
        finally:
            finish.set()
            worker.join(60)
    assert (took, requeued) == ([], [])
    assert held(conn, first) == ("failed", 1, False)  # let go once the handler ended


@pytest.mark.parametrize("lease", ["'infinity'", "'9999-06-01'"])
def test_a_failed_row_with_a_lease_no_time_ends_holds_no_place(conn, lease):
    """Another producer's failed row that kept a lease no time ends (cancel keeps none
    such) holds no place, can be requeued, and is archived."""
    old = drainer.enqueue(conn, "single", {})
    conn.execute(f"UPDATE jobs SET status = 'failed', last_error = 'gave up', "
                 f"locked_until = {lease} WHERE id = %s", (old,))
    m = drainer.enqueue(conn, "single", {})
    assert claimed(conn, SINGLE) == [m]
    assert admin.archive(conn, timedelta(days=7), failed_older_than=timedelta(0),
                         now=conn.execute("SELECT now() + interval '1 s'").fetchone()[0]) == 1
    again = drainer.enqueue(conn, "plain", {})
    conn.execute(f"UPDATE jobs SET status = 'failed', locked_until = {lease} WHERE id = %s",
                 (again,))
    assert drainer.requeue(conn, ids=[again]) == [again]


def test_a_job_cancelled_while_waiting_in_its_batch_is_let_go_when_given_back(conn):
    """A claimed job cancelled before it started, given back by the batch's write-back
    (whose release then changes nothing, and lowered no attempts): its place is let go
    then, not at its lease's end, as no handler ever ran it."""
    a = drainer.enqueue(conn, "fifo", {}, group="g")
    b = drainer.enqueue(conn, "fifo", {}, group="g")
    [ja] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    assert drainer.cancel(conn, [a]) == [a]
    outcome = Outcome(unstarted=[ja])

    class Live:  # engine.session.Reconnecting when the session lives
        def send(self, first, again=None):
            return first(conn)

    settled = drain_.settle(Live(), outcome, None, None)
    assert writeback.end_cancelled(conn, summary_.ended_lost(settled, outcome)) == 1
    assert held(conn, a) == ("failed", 1, False)
    assert claimed(conn, FIFO) == [b]


def test_a_cancelled_job_whose_handler_ended_is_not_held_while_its_write_back_waits(
        conn, db_url, declared):
    """A job cancelled while running whose handler ends before a heartbeat saw the
    cancel waits in its batch for a write-back (a limited batch writes back once a
    quarter of its slots are free): the heartbeats of the batch's slow handlers must
    not keep its lease, and its group, held meanwhile."""
    finish, a_ended = threading.Event(), threading.Event()
    started: set[int] = set()

    def handler(job: model.Job) -> None:
        started.add(job.id)
        if job.payload["cancel_self"]:
            with psycopg.connect(db_url, autocommit=True) as admin:
                drainer.cancel(admin, [job.id])
            a_ended.set()
            return  # ended: nothing of it runs any more
        finish.wait(60)

    task = drainer.task("fifo", per_group=1)(handler)
    a = drainer.enqueue(conn, "fifo", {"cancel_self": True}, group="g")
    for n in range(7):
        drainer.enqueue(conn, "fifo", {"cancel_self": False}, group=f"long{n}")
    c = drainer.enqueue(conn, "fifo", {"cancel_self": False}, group="g")
    # concurrency 8: a refill waits for 2 free slots, and only a's is
    options = drainer.Options(queues=["fifo"], concurrency=8, lease=timedelta(seconds=3))
    with psycopg.connect(db_url, autocommit=True) as other:
        worker = threading.Thread(target=drainer.drain, args=(other, {"fifo": task}, options))
        worker.start()
        try:
            wait_until(lambda: len(started) == 8 and a_ended.is_set())
            # By the database clock: a's lease, as it was when its handler ended, has
            # run out, and a heartbeat came since (it pushed the running jobs' leases
            # past that end).
            [kept] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s", [a]).fetchone()
            wait_until(lambda: conn.execute(
                "SELECT now() > %s AND min(locked_until) > %s FROM jobs "
                "WHERE status = 'running' AND id <> %s", [kept, kept, a]).fetchone()[0])
            a_held, took = held(conn, a), claimed(conn, FIFO)
        finally:
            finish.set()
            worker.join(60)
    assert (a_held, took) == (("failed", 1, False), [c])


def test_the_heartbeat_holds_no_claim_cancelled_before_its_handler_began(conn, db_url):
    """A claimed job cancelled while it waits unstarted in its batch: the heartbeat that
    drops it does not push forward the lease cancel kept (no handler will run it)."""
    first = drainer.enqueue(conn, "fifo", {}, group="g1")
    waiting = drainer.enqueue(conn, "fifo", {}, group="g2")
    release, lease = threading.Event(), timedelta(seconds=3)
    with psycopg.connect(db_url, autocommit=True) as worker_conn:
        jobs = roundtrip.claim(worker_conn, [], 10, lease, limited=[FIFO], take=10)
        assert [j.id for j in jobs] == [first, waiting]
        assert drainer.cancel(conn, [waiting]) == [waiting]
        [(kept,)] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s", (waiting,))
        batch = Batch(jobs, {"fifo": lambda job: release.wait(30)}, concurrency=1,
                      lease=lease,
                      extend=lambda js: writeback.extend_claims(worker_conn, js, lease),
                      extend_cancelled=lambda js: writeback.extend_cancelled(
                          worker_conn, js, lease),
                      may_start=lambda job: True, stop=threading.Event())
        done: list[Outcome] = []
        runner = threading.Thread(target=lambda: done.append(batch.run()))
        runner.start()
        try:
            time.sleep(1.6)  # a heartbeat (every second) dropped it
            [(after,)] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s",
                                      (waiting,))
        finally:
            release.set()
            runner.join(30)
    assert [j.id for j in done[0].ended_lost] == [waiting] and after == kept
