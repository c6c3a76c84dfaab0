"""Test tasks with flow control: each records its run (job id, group, attempt, start and
end on this machine's clock, and the claim's time by the database) in `limit_runs`."""

import os
import threading
import time
from datetime import timedelta

import psycopg

from drainer import Constant, task

_local = threading.local()
RUNS = """CREATE TABLE IF NOT EXISTS limit_runs (
  queue text, job_id bigint, grp text, attempt int, started float8, ended float8,
  claimed float8, ok boolean);
CREATE TABLE IF NOT EXISTS limit_crowd (
  id bigserial PRIMARY KEY, queue text, started timestamptz DEFAULT clock_timestamp(),
  ended timestamptz)"""
CROWD_WAIT = 0.5  # seconds a `crowd` job waits at most for more company than its limit
LEASE = timedelta(seconds=float(os.environ.get("LIMITED_LEASE", "300")))


def _conn() -> psycopg.Connection:
    if getattr(_local, "conn", None) is None:
        _local.conn = psycopg.connect(os.environ["DRAINER_DATABASE_URL"], autocommit=True)
    return _local.conn


def _record(job, work) -> None:
    started = time.time()
    ok = True
    try:
        work()
    except Exception:
        ok = False
        raise
    finally:
        claimed = _conn().execute(
            "SELECT extract(epoch FROM locked_until - %s) FROM jobs WHERE id = %s",
            (LEASE, job.id)).fetchone()[0]
        _conn().execute("INSERT INTO limit_runs VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                        (job.queue, job.id, (job.meta or {}).get("group"), job.attempts,
                         started, time.time(), claimed, ok))


def _crowd(job, limit: int) -> None:
    """Run until more than `limit` handlers of the job's queue have run at once with
    this one, at most CROWD_WAIT seconds: under the limit, each runs that long; past
    it, every handler of the crowd sees the others (those started past the limit
    certainly overlap) and ends at once."""
    [(me,)] = _conn().execute("INSERT INTO limit_crowd (queue) VALUES (%s) RETURNING id",
                              (job.queue,)).fetchall()
    deadline = time.monotonic() + CROWD_WAIT
    try:
        while time.monotonic() < deadline and _conn().execute(
                "SELECT count(*) <= %s FROM limit_crowd c JOIN limit_crowd m ON m.id = %s "
                "WHERE c.queue = m.queue AND (c.ended IS NULL OR c.ended > m.started)",
                (limit, me)).fetchone()[0]:
            time.sleep(0.01)
    finally:
        _conn().execute("UPDATE limit_crowd SET ended = clock_timestamp() WHERE id = %s", (me,))


def _work(job) -> None:
    time.sleep(job.payload.get("sleep", 0))
    if "crowd" in job.payload:
        _crowd(job, job.payload["crowd"])
    deadline = time.monotonic() + 60
    while "wait_for" in job.payload and not os.path.exists(job.payload["wait_for"]):
        if time.monotonic() > deadline:
            raise TimeoutError("nobody said when to end")
        time.sleep(0.01)
    if job.payload.get("fail_first") and job.attempts == 1:
        raise RuntimeError("a planned first failure")


@task("capped", concurrency=3)
def capped(job):
    _record(job, lambda: _work(job))


@task("fifo", per_group=1, backoff=Constant(0.3))
def fifo(job):
    _record(job, lambda: _work(job))


@task("rated", rate="20/second")
def rated(job):
    _record(job, lambda: _work(job))


@task("single", concurrency=1)
def single(job):
    _record(job, lambda: _work(job))
