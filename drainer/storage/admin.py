"""The queue's upkeep and inspection: `start` (reap and learn the schema), `archive`,
`due`/`next_due` (when work is ready next), `result`, `requeue`, `cancel`, the
limits in force (`record_limits`), and what the schema has (`has_*`).

Single statements that commit at once on drainer's autocommit connections. `now`
lets tests pretend the database clock says another time; production passes None and
`now()` decides.
"""

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from .. import defaults
from ..errors import BadInput, ConfigError, DrainerError, NoResult
from ..model import Due, Requeued, Undecodable
from . import pauses, sql
from .claim import loads
from .enqueue import CONFLICT_ROUNDS, require_sync
from .limits import Limits, cancelled_run, swaps
from .roundtrip import transaction

ARCHIVE_BATCH = 10_000
# How long failed jobs (cancelled ones too) stay in `jobs` after they failed (their
# run_at, set then): long enough to look into them and requeue, short enough that they
# do not pile up.


def start(conn: psycopg.Connection, *, now: datetime | None = None) -> tuple[int, bool]:
    """Reap expired leases of every queue, and learn the schema's optional parts, in
    one statement; returns (reaped, has_archive_table)."""
    reaped, *schema = sql.rows(conn, "start", {"now": now})[0]
    return int(reaped), sql.learn(conn, schema).archive


def reap(conn: psycopg.Connection, *, now: datetime | None = None) -> int:
    """Expired leases back to queued (or failed at max_attempts); returns how many."""
    return start(conn, now=now)[0]


def archive(
    conn: psycopg.Connection,
    older_than: timedelta,
    *,
    failed_older_than: timedelta = defaults.ARCHIVE_FAILED_AFTER,
    batch: int = ARCHIVE_BATCH,
    to_table: bool = True,
    now: datetime | None = None,
) -> int:
    """Move (or delete, without the archive table) done rows created more than
    `older_than` ago and failed rows (cancelled ones too) that failed more than
    `failed_older_than` ago (by their run_at, which the statements that fail a job set
    to when it failed), at most `batch` per statement, until none is left; returns how
    many."""
    name = "archive_move" if to_table else "archive_delete"
    params = {"older_than": older_than, "failed_older_than": failed_older_than,
              "limit": batch, "now": now}
    total = 0
    while True:
        moved = cancelled_run(conn, name, params).rowcount
        total += moved
        # Fewer rows than the limit means no more are old enough this round.
        if moved < batch:
            return total


MAX_NO_TASK = 20  # queue names next_due lists in `no_task` at most (its LIMIT)


def due(conn: psycopg.Connection, queues: Sequence[str], *,
        limited: Sequence[Limits] = (), now: datetime | None = None,
        known: Sequence[str] | None = None) -> Due:
    """When more work of `queues` and of the queues with `limited` becomes ready, and
    why: for the latter, when their limits let a job start (in a second statement).
    Paused queues are left out: their jobs wait, and wake nothing up.
    With `known` (the queues that have a task), also the ready queues outside it: in
    the same statement, a scan of the ready index that stops at MAX_NO_TASK names."""
    schema = sql.features(conn)
    next_, run_at, lease_end, read_at, no_task = sql.execute(
        conn, sql.variant("next_due", **pauses.swaps(schema)),
        {"queues": list(queues), "now": now,
         "known": None if known is None else list(known)}).fetchall()[0]
    plain = Due(next_, run_at, lease_end, read_at, sorted(no_task))
    if not limited:
        return plain
    rows = json.dumps([lim.fields for lim in limited])
    text = sql.variant("due_limited", **swaps(schema), **pauses.swaps(schema))
    with transaction(conn, no_jit=True):  # at the first statement's time: one moment
        cursor = sql.execute(conn, text, {"limits": rows, "now": now or plain.now})
    run_at, lease_end = cursor.fetchall()[0]
    run_at, lease_end = _earliest(plain.run_at, run_at), _earliest(plain.lease_end, lease_end)
    first = _earliest(run_at, lease_end)
    return Due(None if first is None else max(first, plain.now), run_at, lease_end, plain.now,
               plain.no_task)


def _earliest(*moments: datetime | None) -> datetime | None:
    return min((m for m in moments if m is not None), default=None)


def next_due(
    conn: psycopg.Connection, queues: Sequence[str], *, now: datetime | None = None
) -> datetime | None:
    """When more work of `queues` becomes ready: now() if some is ready, None if none is left."""
    return due(conn, queues, now=now).next_due


def has_archive(conn: psycopg.Connection) -> bool:
    """Whether `migrate` created the archive table (else archiving deletes)."""
    return sql.features(conn).archive


def result(conn: psycopg.Connection, job_id: int) -> Any:
    """The return value a done job's task kept (keep_result=True), from jobs or the
    archive, as JSON loads it. NoResult (a LookupError) when there is none: no such
    job, not done yet (its `status` says), failed (its error says why), or its task
    did not keep results."""
    if not has_results(conn):
        raise ConfigError("the jobs table has no result column: run `drainer migrate`")
    found = sql.row(conn, "job_result", {"id": job_id})
    if found is None and has_archive(conn):
        found = sql.row(conn, "archived_job_result", {"id": job_id})
    if found is None:
        raise NoResult(f"no job {job_id}")
    status, kept, error = found
    if status == "failed":
        raise NoResult(f"job {job_id} failed: {error}", status)
    if status != "done":
        raise NoResult(f"job {job_id} is {status}: no result yet", status)
    if kept is None:
        raise NoResult(f"job {job_id} is done, and its task keeps no result (@task(..., "
                       "keep_result=True) keeps them)", status)
    value = loads(kept.encode())
    if isinstance(value, Undecodable):
        raise NoResult(f"job {job_id}: its result cannot be loaded: {value.reason}", status)
    return value


def record_limits(conn: psycopg.Connection, limited: Sequence[Limits],
                  unlimited: Sequence[str]) -> None:
    """Write the limits in force for `stats` and `doctor` (where they changed), and
    forget those of `unlimited` queues."""
    require_sync(conn, limits=True)
    sql.run(conn, "limits_record", {"limits": json.dumps([lim.fields for lim in limited]),
                                    "unlimited": list(unlimited)})


def has_schedules(conn: psycopg.Connection, *, stored: bool = False) -> bool:
    """Whether `migrate` created the schedules table (`stored`: and it ever held a
    schedule, as the statistics say)."""
    known = sql.features(conn)
    return known.schedules and (known.scheduled or not stored)


def has_results(conn: psycopg.Connection) -> bool:
    """Whether `migrate` added the result column (tasks that keep results need it)."""
    return sql.features(conn).result



def requeue(
    conn: psycopg.Connection, *, queue: str | None = None, ids: Sequence[int] = ()
) -> Requeued:
    """Failed jobs of `queue` (cancelled ones left alone), or with these ids, back to
    queued with a fresh budget: max_attempts rises, attempts is never lowered (it is
    the ownership token of every claim). A job cancelled while running stays failed
    until its worker saw its handler end, or its lease ended (`waiting`). A job whose
    key is held stays failed (`held`).
    A new holder committed meanwhile makes the update fail on the unique index: it is
    undone to a savepoint, and the jobs looked at again."""
    params: dict[str, object] = {"queue": queue, "ids": list(ids), "now": None}
    for _ in range(CONFLICT_ROUNDS):
        held = dict(sql.rows(conn, "requeue_held", params)) if sql.features(conn).key else {}
        try:
            with sql.transaction(conn):
                rows = cancelled_run(conn, "requeue", {**params, "skip": list(held)}
                                     ).fetchall()
        except BadInput as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                continue
            raise
        waiting: dict[int, datetime] = (
            dict(cancelled_run(conn, "requeue_waiting", params).fetchall()) if ids else {})
        return Requeued((row[0] for row in rows), held, waiting)
    raise DrainerError("requeue: the keys of these jobs kept being taken; nothing was requeued")


def cancel(conn: psycopg.Connection, ids: Sequence[int]) -> list[int]:
    """Withdraw queued or running jobs: status failed, last_error 'cancelled'; returns
    those withdrawn. A running job's handler is not stopped, but whatever its worker
    writes afterwards changes nothing, and its `job.cancelled` is set at the worker's
    next heartbeat; the job keeps its limits' places until the worker sees the handler
    end (end_cancelled) or the claim's lease ends."""
    found = cancelled_run(conn, "cancel", {"ids": list(ids), "now": None})
    return sorted(row[0] for row in found.fetchall())
