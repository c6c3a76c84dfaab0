"""The soak's task (tests/soak.py): records each execution in `soak_executions` (job
id, attempt, worker pid, outcome), works SOAK_JOB_SECONDS, then fails SOAK_FAIL_RATE
of the time; some first attempts fail at once, snooze or ask for a retry (PLANNED),
and a success keeps its attempt number as the job's result.

The record is the handler's side effect, committed before the handler returns, so
the soak can tell what ran from what the queue says."""

import os
import random
import threading
import time

import psycopg

from drainer import Retry, Snooze, task

FAIL_RATE = float(os.environ.get("SOAK_FAIL_RATE", "0.05"))
JOB_SECONDS = float(os.environ.get("SOAK_JOB_SECONDS", "0"))
_local = threading.local()


def _conn() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(os.environ["DRAINER_DATABASE_URL"],
                                             autocommit=True, application_name="soak")
    return conn


def _insert(*row: object) -> None:
    """Record an execution; once more on a new session if the role's idle limit
    dropped this thread's (the statement never ran on a dropped session)."""
    sql = "INSERT INTO soak_executions (job_id, attempts, worker, ok) VALUES (%s, %s, %s, %s)"
    try:
        _conn().execute(sql, row)
    except psycopg.OperationalError:
        _local.conn.close()
        _conn().execute(sql, row)


# Jobs whose first attempt goes another way, by id: failed at once (an exception the
# task does not retry), snoozed, or retried on request.
PLANNED = {7: "fatal", 11: "snooze", 13: "retry"}  # job id % 50
FATAL = "soak: a planned fatal error"


LIMITED = (3, 1)  # soak_limited's concurrency and per-group limits


def record(job):
    plan = PLANNED.get(job.id % 50) if job.attempts == 1 else None
    ok = plan is None and not job.payload.get("always_fail") and random.random() >= FAIL_RATE
    _insert(job.id, job.attempts, os.getpid(), ok)
    time.sleep(JOB_SECONDS)
    if plan == "fatal":
        raise ValueError(FATAL)
    if plan == "snooze":
        raise Snooze("soak: a planned snooze", delay=1)
    if plan == "retry":
        raise Retry("soak: a planned retry", delay=0)
    if not ok:
        raise RuntimeError("soak: a planned failure")
    return {"attempt": job.attempts}  # kept: the soak checks it is the last attempt's


# Worth retrying: the planned failures, a timeout, and the database going away under
# the record (the soak restarts it); anything else fails at once.
TRANSIENT = (RuntimeError, TimeoutError, psycopg.OperationalError)
soak = task("soak", retry_on=TRANSIENT, keep_result=True)(record)
# The same work on a queue with limits: at most 3 running, one per group, in order.
limited = task("soak_limited", concurrency=LIMITED[0], per_group=LIMITED[1],
               retry_on=TRANSIENT, keep_result=True)(record)
