"""Enqueue: the producer's statements and the checks of what it sends.

Every function takes the caller's connection, psycopg 3's or another driver's
(`drivers.Connectable`), and joins the caller's transaction (the point of a table
queue). The logic is written once, as coroutines awaiting a `drivers.Db`. `now` lets
tests pretend the database clock says another time; production passes None and
`now()` decides.
"""

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any, TypedDict, Unpack, overload

import psycopg

from .. import defaults, tracing
from ..errors import NO_JOBS_TABLE, BadInput, ConfigError, DrainerError, SchemaMissing
from ..model import Enqueued
from . import drivers, sql

# The jobs table's column default; the COPY path must write it explicitly.
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


async def require(db: drivers.Db, *, priority: bool = False, key: bool = False,
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
        known = await db.features(fresh=True)
        if not known.jobs:
            raise SchemaMissing(NO_JOBS_TABLE)
        missing = lacking(known)
        if missing:
            raise ConfigError(f"the jobs table has no {' or '.join(missing)}: run "
                              "`drainer migrate` to add them")


def require_sync(conn: psycopg.Connection, **used: bool) -> None:
    """`require` on drainer's own connection."""
    drivers.blocking(require(drivers.for_sync(conn), **used))



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
        "max_attempts": defaults.MAX_ATTEMPTS if attempts is None else attempts,
        "now": options.get("now"),
        **_when(options.get("run_at"), options.get("delay")),
    }
    key, priority = options.get("key"), check_priority(options.get("priority", 0))
    group = options.get("group")
    context = await _trace_context(db)
    if key is None and priority == 0 and group is None and context is None:
        return Enqueued(int(_first(await db.row("enqueue", params), "enqueue")), "inserted")
    await require(db, priority=priority != 0, key=key is not None, meta=group is not None)
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
    await require(db, priority=priority != 0 or keyed, key=keyed, meta=group is not None)
    attempts = options.get("max_attempts")
    async with db.atomic():
        when = await db.row("db_time", {"now": options.get("now"),
                                        **_when(options.get("run_at"), options.get("delay"))})
        params = {"queue": queue, "priority": priority, "meta": meta,
                  "run_at": str(_first(when, "db_time")),
                  "max_attempts": defaults.MAX_ATTEMPTS if attempts is None else attempts}
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
