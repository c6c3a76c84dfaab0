"""The queue's lifecycle operations: one function per statement of `sql/queries.sql`.

Every function takes the caller's connection. `enqueue` joins the caller's
transaction (the point of a table queue); the others are single statements that
commit at once on drainer's autocommit connections. `now` lets tests pretend the
database clock says another time; production passes None and `now()` decides.
"""

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.types.json import JsonbLoader

from . import sql
from .db import storable
from .errors import BadInput

ARCHIVE_BATCH = 10_000
# The jobs table's column default; the COPY path must write it explicitly.
DEFAULT_MAX_ATTEMPTS = 5
MAX_QUEUE_NAME = 200  # a NOTIFY payload must stay far below 8,000 bytes
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")  # \u0000, not an escaped backslash + u0000
# One encoder for every payload: json.dumps with options builds a new one per call,
# which doubles the cost of encoding a small payload.
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stored payload Python's json cannot load (nested too deep, a number too long),
    e.g. written by another producer; its job fails without running its handler."""

    reason: str


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed job. `attempts` is this claim's attempt number: the ownership token."""

    id: int
    queue: str
    payload: Any  # the JSON value as json.loads returns it, or Undecodable
    attempts: int
    max_attempts: int


def _literal(values: Iterable[object]) -> str:
    """An array literal ({1,2,3}, cast in the SQL) of ids, attempts or target words:
    psycopg's list adapter takes 0.4 ms for a batch of 500, the literal 0.06."""
    return "{" + ",".join([str(v) for v in values]) + "}"


def _pairs(jobs: Sequence[Job]) -> dict[str, str]:
    """The jobs' tokens: their ids and attempts."""
    return {"ids": _literal([j.id for j in jobs]), "attempts": _literal([j.attempts for j in jobs])}


def check_queue(queue: str) -> str:
    """The queue name, or BadInput when no NOTIFY could carry it."""
    if not isinstance(queue, str) or not queue or "\x00" in queue:
        raise BadInput("a queue name must be a non-empty string without NUL characters")
    if len(_utf8(queue, "a queue name")) > MAX_QUEUE_NAME:
        raise BadInput(f"a queue name must be at most {MAX_QUEUE_NAME} bytes")
    return queue


def encode_payload(payload: object) -> str:
    """The payload as JSON text PostgreSQL's jsonb accepts, or BadInput saying why not."""
    try:
        text = _encode(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise BadInput(f"the payload is not JSON-serialisable: {exc}") from exc
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise BadInput("the payload contains a NUL character, which jsonb cannot store")
    _utf8(text, "the payload")
    return text


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInput(f"{what} contains a lone surrogate, which is not valid Unicode") from None


def _when(run_at: datetime | None, delay: float | timedelta | None
          ) -> dict[str, datetime | timedelta | None]:
    if run_at is not None and delay is not None:
        raise BadInput("give run_at or delay, not both")
    if isinstance(delay, int | float):
        try:
            delay = timedelta(seconds=delay)
        except (OverflowError, ValueError):  # NaN, or beyond timedelta's range
            raise BadInput(f"the delay {delay!r} is not a usable number of seconds") from None
    return {"run_at": run_at, "delay": delay}


def enqueue(
    conn: psycopg.Connection,
    queue: str,
    payload: object,
    *,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    now: datetime | None = None,
) -> int:
    """Insert one job in the caller's transaction and return its id."""
    params = {
        "queue": check_queue(queue),
        "payload": encode_payload(payload),
        "max_attempts": DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts,
        "now": now,
        **_when(run_at, delay),
    }
    return int(sql.value(conn, "enqueue", params))


def enqueue_many(
    conn: psycopg.Connection,
    queue: str,
    payloads: Iterable[object],
    *,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    now: datetime | None = None,
) -> int:
    """Bulk insert with COPY in the caller's transaction (all or nothing); returns the count.

    run_at is computed once by the database clock, then copied with every row, as
    text (it is exact, offset included) so that no row pays for dumping a datetime.
    """
    check_queue(queue)
    with sql.transaction(conn):
        when = str(sql.value(conn, "db_time", {"now": now, **_when(run_at, delay)}))
        attempts = DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts
        count = 0
        with sql.copy(conn, "copy_jobs") as copy:
            for payload in payloads:
                count += 1
                try:
                    text = encode_payload(payload)
                except BadInput as exc:
                    raise BadInput(f"payload {count}: {exc}; nothing was enqueued") from exc
                copy.write_row((queue, text, when, attempts))
    return count


def claim(
    conn: psycopg.Connection,
    queues: Sequence[str],
    batch_size: int,
    lease: timedelta,
    *,
    now: datetime | None = None,
) -> list[Job]:
    """Claim up to `batch_size` ready jobs, oldest run_at first; commits at once."""
    return [Job(*row) for row in _claim(conn, queues, batch_size, lease, now).fetchall()]


def _claim(conn: psycopg.Connection, queues: Sequence[str], batch_size: int,
           lease: timedelta, now: datetime | None = None) -> psycopg.Cursor:
    cursor = conn.cursor()
    # The rows are claimed once the statement commits: one payload that fails to
    # load must not lose the whole batch (nor crash every later drain).
    cursor.adapters.register_loader("jsonb", _PayloadLoader)
    params = {"queues": list(queues), "lease": lease, "now": now}
    return sql.execute(cursor, claim_sql(batch_size), params)


@lru_cache(maxsize=64)
def claim_sql(limit: int) -> str:
    """The claim with its LIMIT written as a literal. As a parameter, the planner
    guesses a tenth of the table for it, so the prepared plan looks costly and every
    claim is planned afresh, which takes as long as running it at small batches; with
    a literal, one prepared plan per batch size serves every claim."""
    return sql.QUERIES["claim"].replace("%(limit)s", str(int(limit)))


_decode = json.JSONDecoder().decode


def _loads(data: Buffer, encoding: str = "utf-8") -> object:
    try:
        # surrogatepass: as json.loads decodes UTF-8 (other codecs ignore it)
        return _decode(str(data, encoding, "surrogatepass"))
    except (RecursionError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        return Undecodable(f"{type(exc).__name__}: {exc}")


class _PayloadLoader(JsonbLoader):
    """Claimed payloads (jsonb, text format): one json cannot load is Undecodable.

    The server sends text in the connection's client encoding: UTF-8 on drainer's
    own connections, but a user's connection to a LATIN1 database speaks LATIN1,
    and its 'é' is not valid UTF-8."""

    def __init__(self, oid: int, context: AdaptContext | None = None):
        super().__init__(oid, context)
        self.encoding = self.connection.info.encoding if self.connection else "utf-8"

    def load(self, data: Buffer) -> object:
        return _loads(data, self.encoding)


def complete(conn: psycopg.Connection, jobs: Sequence[Job]) -> set[int]:
    """Mark jobs done; returns the ids that were still ours (the others are lost)."""
    return settle(conn, jobs, (), ()).done


def fail(
    conn: psycopg.Connection,
    failures: Sequence[tuple[Job, str]],
    *,
    now: datetime | None = None,
) -> dict[int, str]:
    """Record failures (retry with backoff, or failed at max_attempts).

    Returns {id: new status} for the jobs that were still ours.
    """
    failed = settle(conn, (), failures, (), now=now).failed
    return {job_id: failure.status for job_id, failure in failed.items()}


def release(conn: psycopg.Connection, jobs: Sequence[Job]) -> set[int]:
    """Give back claimed jobs that never started, attempt included."""
    return settle(conn, (), (), jobs).released


def extend(
    conn: psycopg.Connection,
    jobs: Sequence[Job],
    lease: timedelta,
    *,
    now: datetime | None = None,
) -> set[int]:
    """Push the leases of running jobs forward; returns the ids still ours."""
    if not jobs:
        return set()
    params = {**_pairs(jobs), "lease": lease, "now": now}
    return {row[0] for row in sql.rows(conn, "extend", params)}


def _guarded(
    conn: psycopg.Connection,
    *,
    failures: Sequence[tuple[Job, str]] = (),
    done: Sequence[Job] = (),
    released: Sequence[Job] = (),
    now: datetime | None = None,
) -> dict[str, object] | None:
    """The parameters of `settle`, the one guarded batch write, where each row carries
    its target; None when there is nothing to write. Failures come first: the errors
    array, shorter than the ids, is padded with NULLs for the rows after them (and the
    delays, none yet: the default backoff for all)."""
    parts = (("retry", [job for job, _ in failures]), ("done", done), ("queued", released))
    jobs = [job for _, group in parts for job in group]
    if not jobs:
        return None
    return {**_pairs(jobs), "targets": _literal([t for t, group in parts for _ in group]),
            "errors": [storable(error, conn) for _, error in failures] or None,
            "delays": None, "now": now}


class Failure(NamedTuple):
    """A recorded failure: the job's new status, 'queued' (to retry) or 'failed' (for
    good), and its new run_at, the database's time for the retry, which the failure's
    log line names."""

    status: str
    run_at: datetime


@dataclass
class Settled:
    """What writing a batch back found: the ids done, {id: Failure} of the failures
    and the ids released that were still ours (a job in none was no longer ours), and
    the next batch."""

    done: set[int]
    failed: dict[int, Failure]
    released: set[int]
    claimed: list[Job]


def _settled(rows: Iterable[tuple[Any, ...]], claimed: list[Job]) -> Settled:
    """Sort `settle`'s rows (id, target, status, run_at) by target."""
    settled = Settled(done=set(), failed={}, released=set(), claimed=claimed)
    for job_id, target, status, run_at in rows:
        if target == "done":
            settled.done.add(job_id)
        elif target == "retry":
            settled.failed[job_id] = Failure(status, run_at)
        else:
            settled.released.add(job_id)
    return settled


def settle(
    conn: psycopg.Connection,
    succeeded: Sequence[Job],
    failures: Sequence[tuple[Job, str]],
    unstarted: Sequence[Job],
    *,
    claim_next: tuple[Sequence[str], int, timedelta] | None = None,
    now: datetime | None = None,
) -> Settled:
    """Complete, fail and release a batch's jobs in one guarded statement, and claim
    the next batch (queues, size, lease), in one round trip: the statements go out
    together in pipeline mode. Only what there is to send is sent."""
    params = _guarded(conn, failures=failures, done=succeeded, released=unstarted, now=now)
    with sql.pipeline(conn):
        written = sql.run(conn, "settle", params) if params else None
        claimed = _claim(conn, *claim_next, now) if claim_next else None
    return _settled(written.fetchall() if written is not None else (),
                    [Job(*row) for row in claimed.fetchall()] if claimed is not None else [])


def settle_again(
    conn: psycopg.Connection,
    succeeded: Sequence[Job],
    failures: Sequence[tuple[Job, str]],
    *,
    claim_next: tuple[Sequence[str], int, timedelta] | None = None,
    now: datetime | None = None,
) -> Settled:
    """`settle` on a new session after the first one's answer was lost with its
    session: without the release (whose outcome is unknown), and counting as ours the
    completions and failures of the first send that had landed (else reported lost)."""
    settled = settle(conn, succeeded, failures, (), claim_next=claim_next, now=now)
    done = [job for job in succeeded if job.id not in settled.done]
    failed = [(job, error) for job, error in failures if job.id not in settled.failed]
    if done or failed:
        params = {**_pairs([*done, *(job for job, _ in failed)]),
                  "errors": [None] * len(done) + [storable(e, conn) for _, e in failed]}
        for job_id, status, run_at in sql.rows(conn, "landed", params):
            if status == "done":
                settled.done.add(job_id)
            else:
                settled.failed[job_id] = Failure(status, run_at)
    return settled


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
    batch: int = ARCHIVE_BATCH,
    to_table: bool = True,
    now: datetime | None = None,
) -> int:
    """Move (or delete, without the archive table) done rows older than `older_than`,
    at most `batch` per statement, until none is left; returns how many."""
    name = "archive_move" if to_table else "archive_delete"
    params = {"older_than": older_than, "limit": batch, "now": now}
    total = 0
    while True:
        moved = sql.run(conn, name, params).rowcount
        total += moved
        # Fewer rows than the limit means no more are old enough this round.
        if moved < batch:
            return total


@dataclass(frozen=True)
class Due:
    """`next_due` and where it comes from: the earliest queued job's run_at and the
    earliest running job's lease end (None when there is none); `now`, the database
    clock when they were read, for decisions about them taken outside SQL (wake-ups)."""

    next_due: datetime | None
    run_at: datetime | None
    lease_end: datetime | None
    now: datetime


def due(conn: psycopg.Connection, queues: Sequence[str], *, now: datetime | None = None) -> Due:
    """When more work of `queues` becomes ready, and why, in one statement."""
    return Due(*sql.rows(conn, "next_due", {"queues": list(queues), "now": now})[0])


def next_due(
    conn: psycopg.Connection, queues: Sequence[str], *, now: datetime | None = None
) -> datetime | None:
    """When more work of `queues` becomes ready: now() if some is ready, None if none is left."""
    return due(conn, queues, now=now).next_due


def has_archive(conn: psycopg.Connection) -> bool:
    """Whether `migrate` created the archive table (else archiving deletes)."""
    return sql.features(conn).archive


def requeue(
    conn: psycopg.Connection, *, queue: str | None = None, ids: Sequence[int] = ()
) -> list[int]:
    """Failed jobs of `queue` (cancelled ones left alone), or with these ids, back to
    queued with a fresh budget: max_attempts rises, attempts is never lowered (it is
    the ownership token of every claim)."""
    rows = sql.rows(conn, "requeue", {"queue": queue, "ids": list(ids)})
    return sorted(row[0] for row in rows)


def cancel(conn: psycopg.Connection, ids: Sequence[int]) -> list[int]:
    """Withdraw queued or running jobs: status failed, last_error 'cancelled'; returns
    those withdrawn. A running job's handler is not stopped, but whatever its worker
    writes afterwards changes nothing."""
    return sorted(row[0] for row in sql.rows(conn, "cancel", {"ids": list(ids)}))
