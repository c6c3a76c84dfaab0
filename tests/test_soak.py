"""The soak at its small size (4 drainers x 5,000 jobs) under kill -9, SIGTERM and a
PostgreSQL restart; `python -m tests.soak` runs it at full size (see tests/soak.py).
Marked `soak`: the default test run skips it, CI runs it as a step of its own."""

import os

import pytest

import drainer
from tests import soak


@pytest.mark.soak
@pytest.mark.timeout(1200)  # past the soak's own bound, so its verdict says what stalled
def test_nothing_is_lost_or_done_twice_under_faults():
    # About 2.5 minutes on 2 cores; calling it stalled at 15 keeps a stall's CI short.
    result = soak.run(soak.Config(drainers=4, jobs=5_000, timeout=900,
                                  pg_bin=os.environ.get("DRAINER_TEST_PG_BIN") or None))
    print(result.verdict)
    assert result.ok, "\n".join([result.verdict, *result.problems])


def test_each_soak_check_catches_what_it_looks_for(conn):
    """The final checks on crafted rows: one violation of each, and a clean job."""
    conn.execute(soak.SIDE_TABLE)
    conn.execute(soak.TOKEN_LOG)
    conn.execute(soak.ENQUEUED)
    conn.execute("INSERT INTO soak_enqueued VALUES (1), (999999)")  # the second never was
    rows = {  # check broken: (status, attempts, max_attempts, executions as (attempt, ok))
        "clean": ("done", 2, 5, [(1, False), (2, True)]),
        "unfinished": ("queued", 1, 5, [(1, False)]),
        "running": ("running", 1, 5, []),
        "duplicate executions": ("failed", 5, 5, [(4, False), (4, False), (5, False)]),
        "done twice by one attempt": ("done", 1, 5, [(1, True), (1, True)]),
        "executions beyond attempts": ("failed", 5, 5, [(5, False), (6, False)]),
        "done without a successful last attempt": ("done", 2, 5, [(1, True)]),
        "failed before max_attempts": ("failed", 3, 5, [(3, False)]),
        "cancelled": ("failed", 1, 5, [(1, False)]),  # before max_attempts, on purpose
        "failed at once": ("failed", 2, 5, [(2, False)]),  # retry_on: before max_attempts too
        "done without the last attempt's result": ("done", 2, 5, [(1, False), (2, True)]),
    }
    for status, attempts, max_attempts, executions in rows.values():
        job = conn.execute("INSERT INTO jobs (payload, status, attempts, max_attempts) "
                           "VALUES ('{}', %s, %s, %s) RETURNING id",
                           (status, attempts, max_attempts)).fetchone()[0]
        for attempt, ok in executions:
            conn.execute("INSERT INTO soak_executions VALUES (%s, %s, 1, %s)", (job, attempt, ok))
    conn.execute("UPDATE jobs SET last_error = 'cancelled' WHERE attempts = 1 AND "
                 "status = 'failed'")
    conn.execute("UPDATE jobs SET last_error = %s WHERE attempts = 2 AND status = 'failed'",
                 (f"ValueError: {soak.FATAL}",))
    # Through the trigger: a token given back and issued again is fine (the owner
    # released it); one issued twice without that is what a recycled token looks like.
    released, recycled = [drainer.enqueue(conn, "default", {}) for _ in range(2)]
    given_back = {released: ["status = 'queued', attempts = attempts - 1"],
                  recycled: ["status = 'failed'", "status = 'queued', attempts = 0"]}
    claim = "status = 'running', attempts = attempts + 1"
    for job, steps in given_back.items():
        for step in [claim, *steps, claim, "status = 'done'"]:
            conn.execute(f"UPDATE jobs SET {step} WHERE id = %s", (job,))
        conn.execute("INSERT INTO soak_executions VALUES (%s, 1, 1, true)", (job,))
    conn.execute("UPDATE jobs SET result = jsonb_build_object('attempt', attempts) "
                 "WHERE status = 'done'")
    stale = conn.execute("SELECT max(id) FROM jobs WHERE status = 'done' AND attempts = 2"
                         ).fetchone()[0]  # the last row of `rows`
    conn.execute("UPDATE jobs SET result = '{\"attempt\": 1}' WHERE id = %s", (stale,))
    # A claim of the limited queue that found 4 running (a limit of 3), and a fine one.
    conn.execute("INSERT INTO soak_limited_claims VALUES (1, 4, 1), (2, 3, 1)")
    broken = {name: conn.execute(sql).fetchone()[0] for name, sql in soak.CHECKS.items()}
    # "unfinished" also counts the running row; a job done twice is a duplicate too
    assert broken == {"unfinished": 2, "running": 1, "duplicate executions": 2,
                      "done twice by one attempt": 1, "executions beyond attempts": 1,
                      "done without a successful last attempt": 1,
                      "failed before max_attempts": 1, "enqueued but missing": 1,
                      "token issued twice": 1, "done without the last attempt's result": 1,
                      "limited claims beyond a limit": 1}
