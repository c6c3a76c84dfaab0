"""Writing back what a batch's handlers did, and the heartbeat: `complete`, `fail`
and `release` (each the guarded batch write, `roundtrip.settle`), `settle_again` after
a lost answer, `extend` and `extend_cancelled` (leases), `end_cancelled` (places
under limits). Every write is guarded by the claim's token (id and attempts): a
worker changes only a job it still owns.
"""

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

import psycopg

from ..db import storable
from ..model import Failure, Failures, Job, Settled, Token, as_setback
from . import sql
from .claim import Claim
from .limits import cancelled_run
from .roundtrip import literal, pairs, settle


def complete(conn: psycopg.Connection, jobs: Sequence[Job]) -> set[int]:
    """Mark jobs done; returns the ids that were still ours (the others are lost)."""
    return {job_id for job_id, _ in settle(conn, jobs, (), ()).done}


def fail(
    conn: psycopg.Connection,
    failures: Failures,
    *,
    now: datetime | None = None,
) -> dict[int, str]:
    """Record failures: each an error (retried with the default backoff, or failed at
    max_attempts), or a Setback saying where the job goes.

    Returns {id: new status} for the jobs that were still ours.
    """
    failed = settle(conn, (), failures, (), now=now).failed
    return {job_id: failure.status for (job_id, _), failure in failed.items()}


def release(conn: psycopg.Connection, jobs: Sequence[Job]) -> set[int]:
    """Give back claimed jobs that never started, attempt included; returns the ids
    that were still ours."""
    return {job_id for job_id, _ in settle(conn, (), (), jobs).released}


def end_cancelled(conn: psycopg.Connection, jobs: Sequence[Job], *,
           now: datetime | None = None) -> int:
    """Free the places under their limits of claims cancelled while running, once their
    handler is known to have ended (or never began): `cancel` keeps them until the
    claim's lease ends, since the handler may run on. How many it freed. Guarded by
    the claims' tokens: safe to send again, and no later claim of a job is touched."""
    return cancelled_run(conn, "end_cancelled", {**pairs(jobs), "now": now}).rowcount


def extend(
    conn: psycopg.Connection,
    jobs: Sequence[Job],
    lease: timedelta,
    *,
    now: datetime | None = None,
) -> set[int]:
    """Push the leases of running jobs forward; returns the ids still ours."""
    return {job_id for job_id, _ in extend_claims(conn, jobs, lease, now=now)}


def extend_claims(conn: psycopg.Connection, jobs: Sequence[Job], lease: timedelta, *,
                  now: datetime | None = None) -> set[Token]:
    """`extend`, returning the claims (id, attempts) still ours: a batch may hold two
    claims of one job, the older taken over."""
    if not jobs:
        return set()
    params = {**pairs(jobs), "lease": lease, "now": now}
    return {(row[0], row[1]) for row in sql.rows(conn, "extend", params)}


def extend_cancelled(conn: psycopg.Connection, jobs: Sequence[Job], lease: timedelta, *,
                     now: datetime | None = None) -> int:
    """The heartbeat of claims cancelled while running whose handler still runs here:
    the end of their places under their limits is pushed on, as a running job's lease
    is. How many were."""
    params = {**pairs(jobs), "lease": lease, "now": now}
    return cancelled_run(conn, "extend_cancelled", params).rowcount


def settle_again(
    conn: psycopg.Connection,
    succeeded: Sequence[Job],
    failures: Failures,
    *,
    results: Mapping[Token, str] | None = None,
    claim_next: Claim | None = None,
    same_transaction: Callable[[psycopg.Connection], None] | None = None,
    now: datetime | None = None,
) -> Settled:
    """`settle` on a new session after the first one's answer was lost with its
    session: without the release (whose outcome is unknown), and counting as ours the
    completions and failures of the first send that had landed (else reported lost)."""
    settled = settle(conn, succeeded, failures, (), results=results, claim_next=claim_next,
                     same_transaction=same_transaction, now=now)
    settled.resent = True
    done = [job for job in succeeded if job.token not in settled.done]
    failed = [(job, as_setback(f)) for job, f in failures if job.token not in settled.failed]
    if done or failed:
        jobs = [*done, *(job for job, _ in failed)]
        params = {**pairs(jobs),
                  "targets": literal(["done"] * len(done) + [s.then for _, s in failed]),
                  "errors": [None] * len(done) + [storable(s.error, conn) for _, s in failed],
                  "budgets": [job.max_attempts for job in jobs]}
        for job_id, attempts, status, run_at in sql.rows(conn, "landed", params):
            if status == "done":
                settled.done.add((job_id, attempts))
            else:
                settled.failed[job_id, attempts] = Failure(status, run_at)
    return settled
