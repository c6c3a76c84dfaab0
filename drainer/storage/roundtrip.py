"""The pipelined round trip: a batch's write-back and the next claim sent together,
one transaction answered in one round trip (`settle`), or a claim alone (`claim`);
and the guarded batch write's parameters.

Every function takes drainer's connection and commits at once (or joins the
caller's transaction, a test's). `now` lets tests pretend the database clock says
another time; production passes None and `now()` decides.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ..db import storable
from ..errors import DrainerError, translated
from ..model import Failure, Failures, Job, Settled, Token, Undecodable, as_setback
from . import sql
from .claim import (
    MANY_QUEUES,
    Claim,
    as_jobs,
    claim_kind,
    claim_sql,
    limited_claim,
    read_payloads,
    send_claim,
)
from .enqueue import require_sync
from .limits import Limits


def claim(
    conn: psycopg.Connection,
    queues: Sequence[str],
    batch_size: int,
    lease: timedelta,
    *,
    limited: Sequence[Limits] = (),
    take: int = 1,
    now: datetime | None = None,
) -> list[Job]:
    """Claim up to `batch_size` ready jobs of `queues`, highest priority then oldest
    run_at first (oldest first on a table without priorities), and up to `take` of
    each queue of `limited` within its limits; commits at once. A queue named twice is
    claimed once: scanned twice, its rows (locked by this transaction, which SKIP LOCKED
    does not skip) came back twice, to run twice."""
    once: dict[str, Limits] = {}
    for lim in limited:
        once.setdefault(lim.queue, lim)
    spec = Claim(list(dict.fromkeys(queues)), batch_size, lease, list(once.values()), take)
    return as_jobs(_send(conn, spec, now)[1])


Write = Callable[[], "psycopg.Cursor | None"]


@dataclass
class _RoundTrip:
    """`undone`: the round trip's transaction was rolled back after a failure, so
    nothing of it landed."""

    undone: bool = False
    committed: bool = False  # it committed (or joined a caller's transaction): all landed


def _send(conn: psycopg.Connection, spec: Claim | None, now: datetime | None,
          write: Write | None = None, trip: _RoundTrip | None = None,
          ) -> tuple["psycopg.Cursor | None", list[tuple[Any, ...]]]:
    """Send `write()` (a batch's write-back) and the claims `spec` asks for in one round
    trip that is one transaction (`transaction`), in which the locks of queues with
    limits are taken last, after the plain claim, so as to be held the least: when
    anything fails, nothing of it landed. Nothing here reads from the server before the
    end: a read would sync the pipeline midway. The limited queues' jobs come first in
    the batch: they are no more than its free handler slots, so they start at once,
    never held in the batch behind others. Returns the write-back's cursor and the
    claimed rows."""
    spec = spec or Claim((), 0, timedelta(0))  # nothing to claim
    if spec.limited and not sql.features(conn).limits:  # known: no call per claim
        require_sync(conn, limits=True)
    many = len(spec.queues) > MANY_QUEUES
    plain = (claim_sql(spec.size, *claim_kind(conn), now is not None, many=many)
             if spec.queues else None)
    # A plain claim of one queue alone is one statement, sent as it is. (After a
    # pipeline, the server's idle_session_timeout is not armed: psycopg's Flush after
    # the sync disarms it.)
    frame = (transaction(conn, no_jit=bool(spec.limited) or many, trip=trip)
             if spec.limited or many or write is not None else nullcontext())
    with frame:
        written = write() if write is not None else None
        plain_cursor = (send_claim(conn, plain, {"queues": list(spec.queues)}, spec.lease, now)
                        if plain is not None else None)
        limited_cursor = limited_claim(conn, spec, now) if spec.limited else None
    if trip is not None:
        trip.committed = True
    with translated():
        limited_rows = limited_cursor.fetchall() if limited_cursor else []
        plain_rows = plain_cursor.fetchall() if plain_cursor else []
    if many and not plain_rows:
        plain_rows = _claim_whole(conn, spec, now)
    return written, [*_withheld_read(conn, limited_rows, plain_rows), *plain_rows]


def _claim_whole(conn: psycopg.Connection, spec: Claim, now: datetime | None
                 ) -> list[tuple[Any, ...]]:
    """A claim of many queues that took nothing, sent again with each queue locking
    up to a whole batch, as a claim of one queue does: the shares counted the rows
    other drainers' claims held locked, so a queue whose ready rows they all held gave
    none, though others had some (a drain stops at a claim that takes nothing). Its
    cost, the one every claim of several queues had, is paid at a drain's last claim
    and under such contention only."""
    text = claim_sql(spec.size, *claim_kind(conn), now is not None)
    with transaction(conn, no_jit=True):
        cursor = send_claim(conn, text, {"queues": list(spec.queues)}, spec.lease, now)
    with translated():
        return cursor.fetchall()


def _withheld_read(conn: psycopg.Connection, rows: list[tuple[Any, ...]],
                   others: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A limited claim's rows with the payloads its answer left out (claim_payload_bounded:
    NULL past its first 64 kB) read once it committed, in one more round trip that only
    big payloads cost (and JSON nulls, read again for nothing). When that read fails,
    the round trip's claimed jobs (`others` too), ours and never to start, are given
    back rather than left, their places and an attempt each, to their lease."""
    left = [row[0] for row in rows if row[2] is None]
    if not left:
        return rows
    try:
        found = read_payloads(conn, left)
    except BaseException:
        if _idle(conn):  # not after a drop, as for any claim whose answer it cut
            with suppress(BaseException):
                settle(conn, (), (), as_jobs([*rows, *others]))  # writeback.release
        raise
    gone = Undecodable("the job's row was deleted before its payload was read")
    return [row if row[2] is not None else (row[0], row[1], found.get(row[0], gone), *row[3:])
            for row in rows]


@contextmanager
def transaction(conn: psycopg.Connection, *, no_jit: bool = False,
                trip: _RoundTrip | None = None) -> Iterator[None]:
    """A pipeline whose statements are one transaction of their own, read committed
    whatever the database's or role's default (a limited claim must see the jobs other
    drainers started while it waited for their locks); with `no_jit` (a limited claim,
    a claim of several queues), without JIT. Its BEGIN and COMMIT go in the pipeline
    with them: psycopg's transaction() waits for the server as it begins and as it
    commits, two more round trips. Not the pipeline's implicit transaction either: a COMMIT that
    fails (a deferred constraint's error) is then a statement's error, which leaves
    the session usable, and an exception raised while the statements are queued
    leaves the transaction open, to be rolled back (`trip.undone`): nothing of it
    landed. On a connection outside autocommit, or in a transaction already open (a
    test's: drainer.testing's in_transaction), the statements join the caller's
    transaction (in a savepoint where one is open), the caller's to commit."""
    status = conn.info.transaction_status
    if not conn.autocommit or status != TransactionStatus.IDLE:
        with sql.pipeline(conn), (
                sql.transaction(conn) if status != TransactionStatus.IDLE else nullcontext()):
            if no_jit:
                sql.run(conn, "no_jit")
            yield
        return
    try:
        with sql.pipeline(conn):
            sql.run(conn, "begin_read_committed")
            if no_jit:
                sql.run(conn, "no_jit")
            yield
            sql.run(conn, "commit")
    except BaseException:
        if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            with suppress(psycopg.Error):
                conn.rollback()
            if trip is not None:
                trip.undone = True
        raise


def literal(values: Iterable[object]) -> str:
    """An array literal ({1,2,3}, cast in the SQL) of ids, attempts or target words:
    psycopg's list adapter takes 0.4 ms for a batch of 500, the literal 0.06."""
    return "{" + ",".join([str(v) for v in values]) + "}"


def pairs(jobs: Sequence[Job]) -> dict[str, str]:
    """The jobs' tokens: their ids and attempts."""
    return {"ids": literal([j.id for j in jobs]), "attempts": literal([j.attempts for j in jobs])}


def _guarded(
    conn: psycopg.Connection,
    *,
    failures: Failures = (),
    done: Sequence[Job] = (),
    released: Sequence[Job] = (),
    now: datetime | None = None,
) -> dict[str, object] | None:
    """The parameters of `settle`, the one guarded batch write, where each row carries
    its target; None when there is nothing to write. Failures come first: the errors
    and delays arrays, shorter than the ids, are padded with NULLs for the rows after
    them (and the delays are sent only when one is not the default backoff)."""
    setbacks = [as_setback(failure) for _, failure in failures]
    jobs = [*(job for job, _ in failures), *done, *released]
    if not jobs:
        return None
    targets = [s.then for s in setbacks] + ["done"] * len(done) + ["queued"] * len(released)
    return {**pairs(jobs), "targets": literal(targets),
            "errors": [storable(s.error, conn) for s in setbacks] or None,
            "delays": ([s.delay for s in setbacks]
                       if any(s.delay is not None for s in setbacks) else None),
            "now": now}



def _settled(rows: Iterable[tuple[Any, ...]], claimed: list[Job]) -> Settled:
    """Sort `settle`'s rows (id, attempts, target, status, run_at) by target."""
    settled = Settled(done=set(), failed={}, released=set(), claimed=claimed)
    for job_id, attempts, target, status, run_at in rows:
        token = (job_id, attempts)
        if target == "done":
            settled.done.add(token)
        elif target == "queued":
            settled.released.add(token)
        else:  # a setback: retry, failed or snooze
            settled.failed[token] = Failure(status, run_at)
    return settled


def settle(
    conn: psycopg.Connection,
    succeeded: Sequence[Job],
    failures: Failures,
    unstarted: Sequence[Job],
    *,
    results: Mapping[Token, str] | None = None,
    claim_next: Claim | None = None,
    same_transaction: Callable[[psycopg.Connection], None] | None = None,
    now: datetime | None = None,
) -> Settled:
    """Complete, fail and release a batch's jobs in one guarded statement, and claim
    the next batch (queues, size, lease), in one round trip that is one transaction
    (see _send). `results` ({claim: JSON text}) are the return values of succeeded jobs
    whose task keeps them, written first; `same_transaction(conn)` sends more statements in the
    same round trip (their answers are not read). Only what there is to send is sent.
    When the round trip fails and the session lives on, the write-back is sent again
    on its own before the error is raised (else the jobs that ran would run again):
    whole where nothing of it landed (a database's error, a statement refused before
    it was sent, any failure whose transaction was rolled back); without the release
    where it may have committed (an interrupt as the COMMIT was answered), as
    settle_again does. Never with `same_transaction`, which may be what failed: a schedule's next
    slot is then enqueued by the next drain's start."""
    trip = _RoundTrip()
    try:
        written, claimed = _send(conn, claim_next, now, _write_back(
            conn, succeeded, failures, unstarted, results, same_transaction, now), trip)
    except BaseException as exc:
        if _idle(conn) and not trip.committed:  # committed: it all landed, release too
            landed = not trip.undone and not isinstance(exc, DrainerError)
            with suppress(BaseException):  # the first failure is the one to raise
                _send(conn, None, now, _write_back(
                    conn, succeeded, failures, () if landed else unstarted, results, None, now))
        raise
    return _settled(written.fetchall() if written is not None else (), as_jobs(claimed))


def _write_back(conn: psycopg.Connection, succeeded: Sequence[Job], failures: Failures,
                released: Sequence[Job], results: Mapping[Token, str] | None,
                same_transaction: Callable[[psycopg.Connection], None] | None, now: datetime | None
                ) -> Write | None:
    """`settle`'s statements, kept results first, to send when the round trip goes;
    None when there is nothing to send."""
    params = _guarded(conn, failures=failures, done=succeeded, released=released, now=now)
    if params is None and same_transaction is None:
        return None
    text = settle_sql(sql.features(conn).done_at)  # read before the pipeline, not in it

    def write() -> psycopg.Cursor | None:
        if results:
            kept = [job for job in succeeded if job.token in results]
            sql.run(conn, "keep_results", {**pairs(kept),
                                           "results": [results[job.token] for job in kept]})
        written = sql.execute(conn, text, params) if params else None
        if same_transaction is not None:
            same_transaction(conn)
        return written
    return write


_DONE_AT = "    done_at      = CASE WHEN t.target = 'done' THEN now() ELSE j.done_at END,\n"


def settle_sql(done_at: bool) -> str:
    """`settle` for the schema: a table without the done_at column (made by hand, or
    before migration 5) gets the statement without the line that sets it."""
    text = sql.QUERIES["settle"]
    return text if done_at else text.replace(_DONE_AT, "")


def _idle(conn: psycopg.Connection) -> bool:
    """Whether the session lives on, outside any transaction (one of ours that failed
    was rolled back; a caller's is the caller's to end)."""
    return not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE
