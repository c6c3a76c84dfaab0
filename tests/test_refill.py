"""A batch refilled while it runs: once its last rounds have started, what finished is
written back and more is claimed, so handler slots never wait for a write-back and a
claim between batches. Every job still runs once and is written back once."""

import itertools
import threading
import time
from datetime import timedelta

import psycopg

import drainer
from drainer.batch import Batch, Outcome
from drainer.queue import Job
from drainer.run import Options, drain
from tests.helpers import wait_until


def test_a_refilled_batch_writes_each_job_back_once_and_runs_the_refills(conn):
    """Without a database: a refill hands out 10 more jobs at a time until 60 ran."""
    ran: list[int] = []
    parts: list[tuple[list[int], int]] = []
    lock = threading.Lock()
    made = iter(range(11, 61))

    def handler(job: Job) -> None:
        with lock:
            ran.append(job.id)

    def refill(part: Outcome, free: int) -> tuple[list[Job], bool]:
        parts.append(([j.id for j in part.succeeded], free))
        more = [Job(i, "default", None, 1, 5) for i in itertools.islice(made, 10)]
        return more, len(more) == 10

    outcome = Batch([Job(i, "default", None, 1, 5) for i in range(1, 11)],
                    {"default": handler}, concurrency=4, lease=timedelta(minutes=5),
                    extend=lambda js: {j.id for j in js}, may_start=lambda j: True,
                    stop=threading.Event(), refill=refill).run()
    assert sorted(ran) == list(range(1, 61))
    written = [i for ids, _ in parts for i in ids] + [j.id for j in outcome.succeeded]
    assert sorted(written) == list(range(1, 61))  # each once, in a part or at the end
    assert len(parts) >= 5 and all(0 <= free <= 4 for _, free in parts)
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
