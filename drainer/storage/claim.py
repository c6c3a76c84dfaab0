"""The claim's statements: which text a claim of some queues sends (`claim_sql`, by
the schema; `limited_sql`, for queues with limits), sending them, and loading the
claimed rows as jobs. The round trip that sends them, with a batch's write-back, is
`roundtrip`'s.
"""

import json
import json.scanner
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, cast

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.types.json import JsonbLoader

from ..errors import translated
from ..model import Job, Undecodable
from . import pauses, sql
from .limits import Limits, swaps


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


# Past this many queues a claim locks each queue's share of the batch (claim_sql's
# `many`) and runs without JIT. Up to it, each locking a whole batch costs no more than
# the first look the shares take, and a drain's statements stay the same.
MANY_QUEUES = 8


@lru_cache(maxsize=8)
def limited_sql(given_now: bool = False, grouped: bool = True,
                known: sql.Features | None = None) -> str:
    """The claim of queues with limits (a migrated table: priorities and meta), which
    records the starts its rate limits count; without `grouped` (no queue of the
    claim has per_group), without the per-group arm; `known`: the schema, when it may
    lack what counts the jobs cancelled while running (limits.swaps).

    Without `given_now`, its time is statement_timestamp(), read when the claim
    starts, after limits_lock granted the locks: now() is when the transaction began,
    before a wait for the locks, so the starts it records would be dated early and
    leave the rate's window early, letting a later claim take their tokens again."""
    arms = {} if grouped else {"limited_arms": "limited_free"}
    schema = pauses.swaps(known) | ({} if known is None else swaps(known))
    text = sql.variant("claim", claim_oldest="claim_limited", claim_no_meta="claim_meta",
                       claim_no_starts="claim_starts", claim_payload="claim_payload_bounded",
                       **arms, **schema)
    return text if given_now else text.replace("coalesce(%(now)s, now())",
                                               "statement_timestamp()")


def claim_kind(conn: psycopg.Connection) -> tuple[bool, bool, bool]:
    """`claim_sql`'s schema arguments for this connection: by priority, with meta,
    leaving paused queues out."""
    known = sql.features(conn)
    return known.priority, known.meta, known.pauses


@lru_cache(maxsize=64)
def claim_sql(limit: int, by_priority: bool = False, meta: bool = False,
              paused: bool = False, given_now: bool = False, many: bool = False) -> str:
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
    the plan it had.

    With `paused` (a schema with the table of paused queues), the claim's queues less
    the paused ones (queues_unpaused: one look at that table per claim)."""
    swaps = ({"claim_oldest": "claim_by_priority", "claim_look": "look_by_priority"}
             if by_priority else {})
    if many:  # the shares of the unpaused queues
        swaps |= {"queues": "claim_shares>queues_unpaused" if paused else "claim_shares",
                  "claim_each": "claim_share"}
    elif paused:
        swaps["queues"] = "queues_unpaused"
    if meta:
        swaps["claim_no_meta"] = "claim_meta"
    text = sql.variant("claim", **swaps)
    if not given_now:
        text = text.replace("coalesce(%(now)s, now())", "now()")
    return text.replace("%(limit)s", str(int(limit)))


def limited_claim(conn: psycopg.Connection, spec: Claim, now: datetime | None
                  ) -> psycopg.Cursor:
    """The claim of `spec`'s limited queues, in a limited transaction: their locks,
    then their jobs."""
    rows = json.dumps([lim.row(spec.take) for lim in spec.limited])
    rated = [lim.queue for lim in spec.limited if lim.rate is not None]
    grouped = any(lim.per_group is not None for lim in spec.limited)
    sql.run(conn, "limits_lock", {"limits": rows, "now": now})
    return send_claim(conn, limited_sql(now is not None, grouped, sql.features(conn)),
                      {"limits": rows, "rated": rated, "take": spec.take}, spec.lease, now)


def as_jobs(rows: Sequence[tuple[Any, ...]]) -> list[Job]:
    return [Job(*row) for row in rows]


def send_claim(conn: psycopg.Connection, text: str, params: dict[str, object],
               lease: timedelta, now: datetime | None = None) -> psycopg.Cursor:
    return sql.execute(payload_cursor(conn), text, {**params, "lease": lease, "now": now})


def payload_cursor(conn: psycopg.Connection) -> psycopg.Cursor:
    """A cursor for claimed rows: they are claimed once the statement commits, so one
    payload that fails to load must not lose the whole batch (nor crash every later
    drain): it loads as Undecodable."""
    cursor = sql.cursor(conn)
    cursor.adapters.register_loader("jsonb", _PayloadLoader)
    return cursor


def read_payloads(conn: psycopg.Connection, ids: list[int]) -> dict[int, object]:
    """{id: payload} of claimed jobs, loaded as a claim's are (one bad payload is
    Undecodable, in the connection's encoding)."""
    with translated():
        return dict(sql.run(payload_cursor(conn), "claimed_payloads", {"ids": ids}).fetchall())


_decoder = json.JSONDecoder()
# The decoder's own scanner, called directly: JSONDecoder.decode also matches leading
# and trailing blanks with two regular expressions, which the server's jsonb text never
# has; that took half of a small payload's load (1.5 us a job).
_scan = json.scanner.make_scanner(cast(Any, _decoder))  # typeshed types it oddly


def loads(data: Buffer, encoding: str = "utf-8") -> object:
    try:
        # surrogatepass: as json.loads decodes UTF-8 (other codecs ignore it)
        text = str(data, encoding, "surrogatepass")
        try:
            value, end = _scan(text, 0)
            if end == len(text):
                return value
        except (StopIteration, ValueError):  # decode() below says what is wrong
            pass
        return _decoder.decode(text)
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
        return loads(data, self.encoding)
