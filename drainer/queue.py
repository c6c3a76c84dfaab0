"""The queue's lifecycle operations: one function per statement of `sql/queries.sql`.

Every function takes the caller's connection. `enqueue` joins the caller's
transaction (the point of a table queue); the others are single statements that
commit at once on drainer's autocommit connections. `now` lets tests pretend the
database clock says another time; production passes None and `now()` decides.
"""

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, TypedDict, Unpack, overload

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.pq import TransactionStatus
from psycopg.types.json import JsonbLoader

from . import tracing
from .db import storable
from .errors import BadInput, ConfigError, DrainerError, NoResult, translated
from .model import (
    Due,
    Enqueued,
    Failure,
    Failures,
    Job,
    Requeued,
    Settled,
    Token,
    Undecodable,
    as_setback,
)
from .storage import drivers, sql
from .storage.limits import Limits, held_swaps

ARCHIVE_BATCH = 10_000
# How long failed jobs (cancelled ones too) stay in `jobs` after they failed (their
# run_at, set then): long enough to look into them and requeue, short enough that they
# do not pile up.
ARCHIVE_FAILED_AFTER = timedelta(days=30)
# The jobs table's column default; the COPY path must write it explicitly.
DEFAULT_MAX_ATTEMPTS = 5
MAX_QUEUE_NAME = 200  # a NOTIFY payload must stay far below 8,000 bytes
MIN_PRIORITY, MAX_PRIORITY = -100, 100  # the column's CHECK
MAX_KEY = 1000  # bytes: far below what one entry of the unique index may hold (2,704)
# A holder seen by the insert's conflict but not by the statement's snapshot sends it
# again; so does a holder that finished meanwhile. Each round means another enqueue of
# the same key committed or finished during ours: a bound far past any real race.
CONFLICT_ROUNDS = 100
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")  # \u0000, not an escaped backslash + u0000
# One encoder for every payload: json.dumps with options builds a new one per call,
# which doubles the cost of encoding a small payload.
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode




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
    if isinstance(run_at, datetime) and run_at.utcoffset() is None:
        # The database would read it in the session's time zone, the server's or the
        # role's: a job due at a time the caller never meant.
        raise BadInput(f"run_at {run_at.isoformat()} has no time zone; give an aware "
                       "datetime, e.g. datetime.now(UTC) + timedelta(minutes=10)")
    if isinstance(delay, int | float):
        try:
            delay = timedelta(seconds=delay)
        except (OverflowError, ValueError):  # NaN, or beyond timedelta's range
            raise BadInput(f"the delay {delay!r} is not a usable number of seconds") from None
    return {"run_at": run_at, "delay": delay}


def check_priority(priority: int) -> int:
    """The priority, or BadInput: an int from MIN_PRIORITY to MAX_PRIORITY."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not (
            MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise BadInput(f"a priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, "
                       f"not {priority!r}")
    return priority


def _group_meta(group: object, context: Mapping[str, str] | None = None) -> str | None:
    """The meta of a job in `group` (None: no group) and enqueued under the trace
    `context` (`_trace_context`), as JSON text; None when it has neither. BadInput for
    a bad group."""
    if group is None:
        return None if context is None else _encode(context)
    if not isinstance(group, str) or "\x00" in group or len(_utf8(group, "a group")) > MAX_KEY:
        raise BadInput(f"a group must be a string without NUL characters, at most {MAX_KEY} "
                       "bytes")
    return _encode({"group": group, **(context or {})})


async def _trace_context(db: drivers.Db) -> dict[str, str] | None:
    """The active span's trace context for the job's meta, when OpenTelemetry is in use
    (`drainer.tracing`) and the table has meta; a table without it (not migrated) gets
    the job without its context rather than an error."""
    context = tracing.context_meta()
    if context is None or not (await db.features()).meta:
        return None
    return context


def check_key(key: object) -> str:
    """The key, or BadInput when the text column or its unique index cannot hold it."""
    if not isinstance(key, str) or "\x00" in key:
        raise BadInput("a key must be a string without NUL characters")
    if len(_utf8(key, "a key")) > MAX_KEY:
        raise BadInput(f"a key must be at most {MAX_KEY} bytes")
    return key


async def _require(db: drivers.Db, *, priority: bool = False, key: bool = False,
                   meta: bool = False, limits: bool = False) -> None:
    """ConfigError, before anything is sent, when the table lacks what the call uses
    (a hand-made one); the catalog is read again first, in case `migrate` ran since."""
    def lacking(known: sql.Features) -> list[str]:
        return [name for name, used, has in (("priorities", priority, known.priority),
                                             ("unique keys", key, known.key),
                                             ("groups", meta, known.meta),
                                             ("flow control (limits, groups)", limits,
                                              known.limits))
                if used and not has]

    if lacking(await db.features()):
        missing = lacking(await db.features(fresh=True))
        if missing:
            raise ConfigError(f"the jobs table has no {' or '.join(missing)}: run "
                              "`drainer migrate` to add them")


def _require_sync(conn: psycopg.Connection, **used: bool) -> None:
    """`_require` on drainer's own connection."""
    drivers.blocking(_require(drivers.for_sync(conn), **used))



def enqueue(
    conn: drivers.Connectable,
    queue: str,
    payload: object,
    *,
    key: str | None = None,
    replace: bool = False,
    priority: int = 0,
    group: str | None = None,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    now: datetime | None = None,
) -> int:
    """Insert one job in the caller's transaction and return its id; with a key a
    queued or running job of the queue holds, insert nothing and return the holder's
    id (`replace`: a queued holder takes this payload, run_at and priority). `group`:
    for its task's per-group limit (the job's meta records it). The connection is
    psycopg 3's or another driver's (`drivers.Connectable`)."""
    return enqueue_keyed(conn, queue, payload, key=key, replace=replace, priority=priority,
                         group=group, run_at=run_at, delay=delay, max_attempts=max_attempts,
                         now=now).id


class _ManyOptions(TypedDict, total=False):
    """`enqueue_many`'s keyword arguments but `keys`."""

    priority: int
    group: str | None
    run_at: datetime | None
    delay: float | timedelta | None
    max_attempts: int | None
    now: datetime | None


class _Options(_ManyOptions, total=False):
    """`enqueue`'s keyword arguments."""

    key: str | None
    replace: bool


async def enqueue_async(conn: drivers.Connectable, queue: str, payload: object,
                        **options: Unpack[_Options]) -> int:
    """`enqueue` on an asyncio connection (`drivers.ASYNC_KINDS`)."""
    return (await drivers.run_async(
        conn, lambda db: _enqueue_keyed(db, queue, payload, options))).id


def enqueue_keyed(conn: drivers.Connectable, queue: str, payload: object,
                  **options: Unpack[_Options]) -> Enqueued:
    """`enqueue`, saying what it did (the CLI tells the user)."""
    return drivers.run_sync(conn, lambda db: _enqueue_keyed(db, queue, payload, options))


async def _enqueue_keyed(db: drivers.Db, queue: str, payload: object,
                         options: _Options) -> Enqueued:
    """`enqueue_keyed`'s work, the same for sync and asyncio connections."""
    attempts = options.get("max_attempts")
    params: dict[str, object] = {
        "queue": check_queue(queue),
        "payload": encode_payload(payload),
        "max_attempts": DEFAULT_MAX_ATTEMPTS if attempts is None else attempts,
        "now": options.get("now"),
        **_when(options.get("run_at"), options.get("delay")),
    }
    key, priority = options.get("key"), check_priority(options.get("priority", 0))
    group = options.get("group")
    context = await _trace_context(db)
    if key is None and priority == 0 and group is None and context is None:
        return Enqueued(int(_first(await db.row("enqueue", params), "enqueue")), "inserted")
    await _require(db, priority=priority != 0, key=key is not None, meta=group is not None)
    params.update(key=None if key is None else check_key(key), priority=priority,
                  replace=bool(options.get("replace")), meta=_group_meta(group, context))
    for _ in range(CONFLICT_ROUNDS):
        found = await _enqueue_keyed_once(db, params)
        if found is not None:
            return found
    raise DrainerError(f"key {key!r} of queue {queue!r}: its holder kept changing; nothing "
                       "was enqueued")


async def _enqueue_keyed_once(db: drivers.Db, params: dict[str, object]
                              ) -> Enqueued | None:
    """One try of `enqueue_keyed`; None when it must be asked again. A replace inside a
    transaction runs in a savepoint (sent with it, in one round trip), rolled back when
    the holder it saw queued was not replaced: a claim took it meanwhile, and the
    update's recheck left that running row locked until the caller commits."""
    if not params["replace"] or db.own_transaction():
        return _enqueued(await db.row("enqueue_keyed", params))
    try:
        found = _enqueued(await db.row("enqueue_keyed", params, first="savepoint"))
    except BaseException:
        with suppress(DrainerError):  # the first error is the one to report
            await db.roll_back()
        raise
    if found is None or found.outcome == "queued":
        await db.roll_back()
        return None
    await db.send("savepoint_release")
    return found


def _enqueued(row: tuple[Any, ...] | None) -> Enqueued | None:
    return None if row is None else Enqueued(int(row[0]), str(row[1]))


def _first(row: tuple[Any, ...] | None, name: str) -> Any:
    """The first column of a statement's one row."""
    if row is None:
        raise LookupError(f"statement {name!r} returned no row")
    return row[0]


@overload
def enqueue_many(conn: drivers.Connectable, queue: str, payloads: Iterable[object], *,
                 keys: None = None, priority: int = 0, group: str | None = None,
                 run_at: datetime | None = None, delay: float | timedelta | None = None,
                 max_attempts: int | None = None, now: datetime | None = None) -> int: ...
@overload
def enqueue_many(conn: drivers.Connectable, queue: str, payloads: Iterable[object], *,
                 keys: Iterable[str], priority: int = 0, group: str | None = None,
                 run_at: datetime | None = None, delay: float | timedelta | None = None,
                 max_attempts: int | None = None, now: datetime | None = None
                 ) -> list[int]: ...
def enqueue_many(
    conn: drivers.Connectable,
    queue: str,
    payloads: Iterable[object],
    *,
    keys: Iterable[str] | None = None,
    priority: int = 0,
    group: str | None = None,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    now: datetime | None = None,
) -> int | list[int]:
    """Bulk insert in the caller's transaction (all or nothing). Without keys: one COPY
    into jobs, and the count (COPY returns no ids). With keys (one per payload): each
    payload's job id, in order; a key a queued or running job holds (or an earlier
    payload of the batch) inserts nothing and gives that job's id. Still a bulk path:
    one INSERT of one JSON document for the whole batch, returning the ids.

    run_at is computed once by the database clock, then copied with every row, as
    text (it is exact, offset included) so that no row pays for dumping a datetime.
    `group`: every job's (see `enqueue`). A driver without psycopg 3's COPY
    (psycopg 2) sends the payloads as one JSON document in one INSERT instead, which
    needs the columns of migration 6.
    """
    options: _ManyOptions = {"priority": priority, "group": group, "run_at": run_at,
                             "delay": delay, "max_attempts": max_attempts, "now": now}
    return drivers.run_sync(conn, lambda db: _enqueue_many(db, queue, payloads, keys, options))


@overload
async def enqueue_many_async(conn: drivers.Connectable, queue: str, payloads: Iterable[object],
                             *, keys: None = None, **options: Unpack[_ManyOptions]) -> int: ...
@overload
async def enqueue_many_async(conn: drivers.Connectable, queue: str, payloads: Iterable[object],
                             *, keys: Iterable[str], **options: Unpack[_ManyOptions]
                             ) -> list[int]: ...
async def enqueue_many_async(conn: drivers.Connectable, queue: str, payloads: Iterable[object],
                             *, keys: Iterable[str] | None = None,
                             **options: Unpack[_ManyOptions]) -> int | list[int]:
    """`enqueue_many` on an asyncio connection (`drivers.ASYNC_KINDS`)."""
    return await drivers.run_async(
        conn, lambda db: _enqueue_many(db, queue, payloads, keys, options))


async def _enqueue_many(db: drivers.Db, queue: str, payloads: Iterable[object],
                        keys: Iterable[str] | None, options: _ManyOptions) -> int | list[int]:
    """`enqueue_many`'s work, the same for sync and asyncio connections."""
    check_queue(queue)
    priority = check_priority(options.get("priority", 0))
    group = options.get("group")
    meta = _group_meta(group, await _trace_context(db))
    as_json = keys is None and not db.copies  # _insert_jobs
    # Without keys, enqueue_keyed_batch only for a priority or meta: insert_jobs fits
    # a table made by hand.
    keyed = keys is not None or (as_json and (priority != 0 or meta is not None))
    await _require(db, priority=priority != 0 or keyed, key=keyed, meta=group is not None)
    attempts = options.get("max_attempts")
    async with db.atomic():
        when = await db.row("db_time", {"now": options.get("now"),
                                        **_when(options.get("run_at"), options.get("delay"))})
        params = {"queue": queue, "priority": priority, "meta": meta,
                  "run_at": str(_first(when, "db_time")),
                  "max_attempts": DEFAULT_MAX_ATTEMPTS if attempts is None else attempts}
        if keys is not None:
            return await _enqueue_batch(db, payloads, keys, params)
        if as_json:
            return await _insert_jobs(db, payloads, params)
        return await _copy_jobs(db, payloads, params)


def _encoded(payloads: Iterable[object]) -> Iterator[str]:
    """Each payload as jsonb text; BadInput names the first bad one."""
    for n, payload in enumerate(payloads, 1):
        try:
            yield encode_payload(payload)
        except BadInput as exc:
            raise BadInput(f"payload {n}: {exc}; nothing was enqueued") from exc


async def _copy_jobs(db: drivers.Db, payloads: Iterable[object],
                     params: dict[str, Any]) -> int:
    """The keyless path: COPY straight into jobs (the priority and meta columns only if
    used)."""
    extra: tuple[object, ...] = ()
    if params["priority"] or params["meta"]:
        extra = (params["priority"],) + ((params["meta"],) if params["meta"] else ())
    name = ("copy_jobs_meta" if params["meta"] else "copy_jobs_priority") if extra else (
        "copy_jobs")
    head = (params["queue"],)
    tail = (params["run_at"], params["max_attempts"], *extra)
    return await db.copy(name, ((*head, text, *tail) for text in _encoded(payloads)))


async def _insert_jobs(db: drivers.Db, payloads: Iterable[object],
                       params: dict[str, Any]) -> int:
    """The keyless path without COPY: every payload in one JSON document (each encoded
    once, as for COPY). With a priority or meta, as [payload, null] pairs, by the keyed
    batch's statement with no key; else by insert_jobs, which needs only the columns
    of a table made by hand."""
    if not params["priority"] and not params["meta"]:
        doc = "[" + ",".join(_encoded(payloads)) + "]"
        return int(_first(await db.row("insert_jobs", {**params, "rows": doc}), "insert_jobs"))
    doc = "[" + ",".join([f"[{text},null]" for text in _encoded(payloads)]) + "]"
    return len(_first(await db.row("enqueue_keyed_batch", {**params, "rows": doc}),
                      "enqueue_keyed_batch"))


async def _enqueue_batch(db: drivers.Db, payloads: Iterable[object],
                         keys: Iterable[str], params: dict[str, Any]) -> list[int]:
    """The keyed path: the first payload of each key, all in one JSON document (one
    encode instead of one per payload), inserted by one statement that returns their
    ids. A key a job holds already, or that another transaction takes meanwhile, fails
    the insert on the unique index: it is undone to a savepoint, the holders of the
    keys are read, and the keys no job holds are sent again. When no holder is found,
    a REPEATABLE READ or SERIALIZABLE transaction cannot see it: a serialization
    failure (`batch_unseen`), as a single enqueue's.

    The keys go sorted: an insert waits for a transaction that inserted the same key
    before it, and two calls that took their keys in opposite orders would each wait
    for the other (a deadlock, which rolls back one caller's whole transaction)."""
    order = list(keys)
    firsts, doc = _checked_rows(list(payloads), order)
    ids: dict[str, int] = {}
    todo = list(firsts)
    for _ in range(CONFLICT_ROUNDS):
        if len(todo) != len(firsts):
            doc = _encode([[firsts[key], key] for key in todo])
        try:
            async with db.atomic():
                new = _first(await db.row("enqueue_keyed_batch", {**params, "rows": doc}),
                             "enqueue_keyed_batch")
        except BadInput as exc:
            if not isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                raise
        else:
            ids.update(zip(todo, new, strict=True))
            return [ids[key] for key in order]
        found = _first(await db.row("batch_holders", {"queue": params["queue"],
                                                       "keys": _encode(todo)}),
                       "batch_holders")
        if not any(found):
            await db.send("batch_unseen")  # a holder this snapshot cannot see
        ids.update((key, job) for key, job in zip(todo, found, strict=True) if job)
        todo = [key for key in todo if key not in ids]
    raise DrainerError(f"keys of queue {params['queue']!r}: their holders kept changing; "
                       "nothing was enqueued")


def _checked_rows(payloads: list[object], keys: list[str]) -> tuple[dict[str, object], str]:
    """Each key's first payload, by key in sorted order, and those [payload, key] pairs
    as one JSON document jsonb accepts; or BadInput naming the first bad payload or key
    (found one by one only when the whole fails, or when a key repeats: a payload left
    out must be valid too)."""
    if len(keys) != len(payloads):
        raise BadInput(f"keys: {len(keys)} keys for {len(payloads)} payloads (give one key "
                       "for each payload); nothing was enqueued")
    for n, key in enumerate(keys, 1):
        if key is None:
            raise BadInput(f"keys: payload {n} has no key (enqueue those without one in a "
                           "call of their own); nothing was enqueued")
        check_key(key)
    firsts: dict[str, object] = {}
    for key, payload in zip(keys, payloads, strict=True):
        firsts.setdefault(key, payload)
    if len(firsts) != len(keys):
        _check_each(payloads)  # a payload left out must be valid too
    firsts = {key: firsts[key] for key in sorted(firsts)}
    try:
        return firsts, encode_payload([[p, k] for k, p in firsts.items()])
    except BadInput:
        _check_each(payloads)  # raises, naming the payload
        raise


def _check_each(payloads: Iterable[object]) -> None:
    """BadInput naming the first payload jsonb cannot store, if any."""
    for _ in _encoded(payloads):
        pass


@dataclass(frozen=True)
class Claim:
    """What one claim takes: up to `size` ready jobs of `queues`, and of each queue of
    `limited` at most `take` (its process's free handler slots) and what its limits
    leave, under `lease`."""

    queues: Sequence[str]
    size: int
    lease: timedelta
    limited: Sequence[Limits] = ()
    take: int = 0


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
    return _jobs(_send(conn, spec, now)[1])


Write = Callable[[], "psycopg.Cursor | None"]

# Past this many queues a claim locks each queue's share of the batch (claim_sql's
# `many`) and runs without JIT. Up to it, each locking a whole batch costs no more than
# the first look the shares take, and a drain's statements stay the same.
MANY_QUEUES = 8


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
    trip that is one transaction (_transaction), in which the locks of queues with
    limits are taken last, after the plain claim, so as to be held the least: when
    anything fails, nothing of it landed. Nothing here reads from the server before the
    end: a read would sync the pipeline midway. The limited queues' jobs come first in
    the batch: they are no more than its free handler slots, so they start at once,
    never held in the batch behind others. Returns the write-back's cursor and the
    claimed rows."""
    spec = spec or Claim((), 0, timedelta(0))  # nothing to claim
    if spec.limited and not sql.features(conn).limits:  # known: no call per claim
        _require_sync(conn, limits=True)
    many = len(spec.queues) > MANY_QUEUES
    plain = (claim_sql(spec.size, *claim_kind(conn), now is not None, many=many)
             if spec.queues else None)
    # A plain claim of one queue alone is one statement, sent as it is. (After a
    # pipeline, the server's idle_session_timeout is not armed: psycopg's Flush after
    # the sync disarms it.)
    frame = (_transaction(conn, no_jit=bool(spec.limited) or many, trip=trip)
             if spec.limited or many or write is not None else nullcontext())
    with frame:
        written = write() if write is not None else None
        plain_cursor = (_claim(conn, plain, {"queues": list(spec.queues)}, spec.lease, now)
                        if plain is not None else None)
        limited_cursor = _limited_claim(conn, spec, now) if spec.limited else None
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
    with _transaction(conn, no_jit=True):
        cursor = _claim(conn, text, {"queues": list(spec.queues)}, spec.lease, now)
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
        found = _payloads(conn, left)
    except BaseException:
        if _idle(conn):  # not after a drop, as for any claim whose answer it cut
            with suppress(BaseException):
                release(conn, _jobs([*rows, *others]))
        raise
    gone = Undecodable("the job's row was deleted before its payload was read")
    return [row if row[2] is not None else (row[0], row[1], found.get(row[0], gone), *row[3:])
            for row in rows]


def _payloads(conn: psycopg.Connection, ids: list[int]) -> dict[int, object]:
    """{id: payload} of claimed jobs, loaded as a claim's are (one bad payload is
    Undecodable, in the connection's encoding)."""
    with translated():
        return dict(sql.run(_payload_cursor(conn), "claimed_payloads", {"ids": ids}).fetchall())


def _limited_claim(conn: psycopg.Connection, spec: Claim, now: datetime | None
                   ) -> psycopg.Cursor:
    """The claim of `spec`'s limited queues, in a limited transaction: their locks,
    then their jobs."""
    rows = json.dumps([lim.row(spec.take) for lim in spec.limited])
    rated = [lim.queue for lim in spec.limited if lim.rate is not None]
    grouped = any(lim.per_group is not None for lim in spec.limited)
    sql.run(conn, "limits_lock", {"limits": rows, "now": now})
    return _claim(conn, limited_sql(now is not None, grouped, sql.features(conn).held),
                  {"limits": rows, "rated": rated, "take": spec.take}, spec.lease, now)


@contextmanager
def _transaction(conn: psycopg.Connection, *, no_jit: bool = False,
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


def _jobs(rows: Sequence[tuple[Any, ...]]) -> list[Job]:
    return [Job(*row) for row in rows]


def _claim(conn: psycopg.Connection, text: str, params: dict[str, object],
           lease: timedelta, now: datetime | None = None) -> psycopg.Cursor:
    return sql.execute(_payload_cursor(conn), text, {**params, "lease": lease, "now": now})


def _payload_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """A cursor for claimed rows: they are claimed once the statement commits, so one
    payload that fails to load must not lose the whole batch (nor crash every later
    drain): it loads as Undecodable."""
    cursor = conn.cursor()
    cursor.adapters.register_loader("jsonb", _PayloadLoader)
    return cursor


@lru_cache(maxsize=8)
def limited_sql(given_now: bool = False, grouped: bool = True, held: bool = True) -> str:
    """The claim of queues with limits (a migrated table: priorities and meta), which
    records the starts its rate limits count; without `grouped` (no queue of the
    claim has per_group), without the per-group arm; without `held` (a schema before
    migration 10), counting no job cancelled while running.

    Without `given_now`, its time is statement_timestamp(), read when the claim
    starts, after limits_lock granted the locks: now() is when the transaction began,
    before a wait for the locks, so the starts it records would be dated early and
    leave the rate's window early, letting a later claim take their tokens again."""
    arms = {} if grouped else {"limited_arms": "limited_free"}
    text = sql.variant("claim", claim_oldest="claim_limited", claim_no_meta="claim_meta",
                       claim_no_starts="claim_starts", claim_payload="claim_payload_bounded",
                       **arms, **held_swaps(held))
    return text if given_now else text.replace("coalesce(%(now)s, now())",
                                               "statement_timestamp()")


def claim_kind(conn: psycopg.Connection) -> tuple[bool, bool]:
    """`claim_sql`'s schema arguments for this connection: by priority, with meta."""
    known = sql.features(conn)
    return known.priority, known.meta


@lru_cache(maxsize=64)
def claim_sql(limit: int, by_priority: bool = False, meta: bool = False,
              given_now: bool = False, many: bool = False) -> str:
    """The claim for the schema (by priority, and returning meta, once `migrate` added
    them), with its LIMIT written as a literal. As a parameter, the planner guesses a
    tenth of the table for it, so the prepared plan looks costly and every claim is
    planned afresh, which takes as long as running it at small batches; with a literal,
    one prepared plan per batch size serves every claim.

    Without `given_now` (a drain's claims: the database's clock decides) the time is
    written as now() too. The server plans a prepared statement's first five runs for
    their values and then keeps one generic plan, unless that looks dearer; in a
    generic plan `run_at <= coalesce($now, now())` is a guess, a third of the rows, so
    each priority's scan looked three times dearer than its custom plan, the generic
    plan of the claim by priority was never kept and every claim was planned again
    (0.5 ms at 500 jobs). The planner estimates `run_at <= now()` from the statistics,
    as it does for a custom plan.

    With `many` (more than MANY_QUEUES queues), each queue locks only its share of the
    batch (claim_shares), not a whole batch of its own; a claim of fewer queues keeps
    the plan it had."""
    swaps = ({"claim_oldest": "claim_by_priority", "claim_look": "look_by_priority"}
             if by_priority else {})
    if many:
        swaps |= {"queues": "claim_shares", "claim_each": "claim_share"}
    if meta:
        swaps["claim_no_meta"] = "claim_meta"
    text = sql.variant("claim", **swaps)
    if not given_now:
        text = text.replace("coalesce(%(now)s, now())", "now()")
    return text.replace("%(limit)s", str(int(limit)))


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


def let_go(conn: psycopg.Connection, jobs: Sequence[Job], *,
           now: datetime | None = None) -> int:
    """Free the places under their limits of claims cancelled while running, once their
    handler is known to have ended (or never began): `cancel` holds them until the
    claim's lease ends, since the handler may run on. How many it freed. Guarded by
    the claims' tokens: safe to send again, and no later claim of a job is touched."""
    return sql.run(conn, "let_go", {**_pairs(jobs), "now": now}).rowcount


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
    params = {**_pairs(jobs), "lease": lease, "now": now}
    return {(row[0], row[1]) for row in sql.rows(conn, "extend", params)}


def hold(conn: psycopg.Connection, jobs: Sequence[Job], lease: timedelta, *,
         now: datetime | None = None) -> int:
    """The heartbeat of claims cancelled while running whose handler still runs here:
    the lease cancel kept for each (its places under its limits) is extended, as a
    running job's. How many were."""
    return sql.run(conn, "hold", {**_pairs(jobs), "lease": lease, "now": now}).rowcount


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
    return {**_pairs(jobs), "targets": _literal(targets),
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
    also: Callable[[psycopg.Connection], None] | None = None,
    now: datetime | None = None,
) -> Settled:
    """Complete, fail and release a batch's jobs in one guarded statement, and claim
    the next batch (queues, size, lease), in one round trip that is one transaction
    (see _send). `results` ({claim: JSON text}) are the return values of succeeded jobs
    whose task keeps them, written first; `also(conn)` sends more statements in the
    same round trip (their answers are not read). Only what there is to send is sent.
    When the round trip fails and the session lives on, the write-back is sent again
    on its own before the error is raised (else the jobs that ran would run again):
    whole where nothing of it landed (a database's error, a statement refused before
    it was sent, any failure whose transaction was rolled back); without the release
    where it may have committed (an interrupt as the COMMIT was answered), as
    settle_again does. Never with `also`, which may be what failed: a schedule's next
    slot is then enqueued by the next drain's start."""
    trip = _RoundTrip()
    try:
        written, claimed = _send(conn, claim_next, now, _write_back(
            conn, succeeded, failures, unstarted, results, also, now), trip)
    except BaseException as exc:
        if _idle(conn) and not trip.committed:  # committed: it all landed, release too
            landed = not trip.undone and not isinstance(exc, DrainerError)
            with suppress(BaseException):  # the first failure is the one to raise
                _send(conn, None, now, _write_back(
                    conn, succeeded, failures, () if landed else unstarted, results, None, now))
        raise
    return _settled(written.fetchall() if written is not None else (), _jobs(claimed))


def _write_back(conn: psycopg.Connection, succeeded: Sequence[Job], failures: Failures,
                released: Sequence[Job], results: Mapping[Token, str] | None,
                also: Callable[[psycopg.Connection], None] | None, now: datetime | None
                ) -> Write | None:
    """`settle`'s statements, kept results first, to send when the round trip goes;
    None when there is nothing to send."""
    params = _guarded(conn, failures=failures, done=succeeded, released=released, now=now)
    if params is None and also is None:
        return None

    def write() -> psycopg.Cursor | None:
        if results:
            kept = [job for job in succeeded if job.token in results]
            sql.run(conn, "keep_results", {**_pairs(kept),
                                           "results": [results[job.token] for job in kept]})
        written = sql.run(conn, "settle", params) if params else None
        if also is not None:
            also(conn)
        return written
    return write


def _idle(conn: psycopg.Connection) -> bool:
    """Whether the session lives on, outside any transaction (one of ours that failed
    was rolled back; a caller's is the caller's to end)."""
    return not conn.broken and conn.info.transaction_status == TransactionStatus.IDLE


def settle_again(
    conn: psycopg.Connection,
    succeeded: Sequence[Job],
    failures: Failures,
    *,
    results: Mapping[Token, str] | None = None,
    claim_next: Claim | None = None,
    also: Callable[[psycopg.Connection], None] | None = None,
    now: datetime | None = None,
) -> Settled:
    """`settle` on a new session after the first one's answer was lost with its
    session: without the release (whose outcome is unknown), and counting as ours the
    completions and failures of the first send that had landed (else reported lost)."""
    settled = settle(conn, succeeded, failures, (), results=results, claim_next=claim_next,
                     also=also, now=now)
    settled.resent = True
    done = [job for job in succeeded if job.token not in settled.done]
    failed = [(job, as_setback(f)) for job, f in failures if job.token not in settled.failed]
    if done or failed:
        jobs = [*done, *(job for job, _ in failed)]
        params = {**_pairs(jobs),
                  "targets": _literal(["done"] * len(done) + [s.then for _, s in failed]),
                  "errors": [None] * len(done) + [storable(s.error, conn) for _, s in failed],
                  "budgets": [job.max_attempts for job in jobs]}
        for job_id, attempts, status, run_at in sql.rows(conn, "landed", params):
            if status == "done":
                settled.done.add((job_id, attempts))
            else:
                settled.failed[job_id, attempts] = Failure(status, run_at)
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
    failed_older_than: timedelta = ARCHIVE_FAILED_AFTER,
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
        moved = sql.run(conn, name, params).rowcount
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
    With `known` (the queues that have a task), also the ready queues outside it: in
    the same statement, a scan of the ready index that stops at MAX_NO_TASK names."""
    next_, run_at, lease_end, read_at, no_task = sql.rows(conn, "next_due", {
        "queues": list(queues), "now": now, "known": None if known is None else list(known)})[0]
    plain = Due(next_, run_at, lease_end, read_at, sorted(no_task))
    if not limited:
        return plain
    rows = json.dumps([lim.fields for lim in limited])
    text = sql.variant("due_limited", **held_swaps(sql.features(conn).held))
    with _transaction(conn, no_jit=True):  # at the first statement's time: one moment
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
    value = _loads(kept.encode())
    if isinstance(value, Undecodable):
        raise NoResult(f"job {job_id}: its result cannot be loaded: {value.reason}", status)
    return value


def record_limits(conn: psycopg.Connection, limited: Sequence[Limits],
                  unlimited: Sequence[str]) -> None:
    """Write the limits in force for `stats` and `doctor` (where they changed), and
    forget those of `unlimited` queues."""
    _require_sync(conn, limits=True)
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
    params: dict[str, object] = {"queue": queue, "ids": list(ids)}
    for _ in range(CONFLICT_ROUNDS):
        held = dict(sql.rows(conn, "requeue_held", params)) if sql.features(conn).key else {}
        try:
            with sql.transaction(conn):
                rows = sql.rows(conn, "requeue", {**params, "skip": list(held)})
        except BadInput as exc:
            if isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                continue
            raise
        waiting = dict(sql.rows(conn, "requeue_waiting", params)) if ids else {}
        return Requeued((row[0] for row in rows), held, waiting)
    raise DrainerError("requeue: the keys of these jobs kept being taken; nothing was requeued")


def cancel(conn: psycopg.Connection, ids: Sequence[int]) -> list[int]:
    """Withdraw queued or running jobs: status failed, last_error 'cancelled'; returns
    those withdrawn. A running job's handler is not stopped, but whatever its worker
    writes afterwards changes nothing, and its `job.cancelled` is set at the worker's
    next heartbeat; the job keeps its limits' places until the worker sees the handler
    end (let_go) or the claim's lease ends."""
    return sorted(row[0] for row in sql.rows(conn, "cancel", {"ids": list(ids)}))
