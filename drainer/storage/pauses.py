"""Paused queues: `pause` and `resume` a queue, list the `paused` ones, and the part
swaps (`swaps`) by which every claim, `next_due` and the wake-ups leave them out.

A pause lives in the database (the drainer_pauses table `migrate` creates), so every
drainer sees it at its next claim. A paused queue's jobs wait, queued; everything
else goes on: enqueues, schedules' slots, the reaper, archiving.
"""

from dataclasses import dataclass
from datetime import datetime

import psycopg

from ..errors import ConfigError
from . import sql
from .enqueue import check_queue

MORE_READY = 10_001  # `paused` counts a queue's ready jobs up to this many


@dataclass(frozen=True)
class Pause:
    """A paused queue: since when, by which database role, and its ready jobs (at most
    MORE_READY: more than MORE_READY - 1 beyond)."""

    queue: str
    paused_at: datetime
    paused_by: str
    ready: int


def swaps(known: sql.Features | None) -> dict[str, str]:
    """The part a statement that leaves paused queues out reads them from, on the
    schema `known` (None: the latest): none without the table."""
    return {"none_paused": "paused_queues"} if known is None or known.pauses else {}


def require(conn: psycopg.Connection) -> None:
    """ConfigError when the schema has no table of paused queues (the catalog read
    again, in case `migrate` ran since)."""
    sql.forget(conn)
    if not sql.features(conn).pauses:
        raise ConfigError("this database has no table of paused queues: run "
                          "`drainer migrate` to add it")


def pause(conn: psycopg.Connection, queue: str) -> bool:
    """Pause `queue` (committed at once on an autocommit connection): no drainer claims
    its jobs from its next claim on. False when it was paused already."""
    require(conn)
    return sql.row(conn, "pause", {"queue": check_queue(queue)}) is not None


def resume(conn: psycopg.Connection, queue: str) -> bool:
    """Resume `queue`: its jobs may be claimed again, and every `drainer work` draining
    it is woken (a NOTIFY at commit). False when it was not paused."""
    require(conn)
    return sql.row(conn, "resume", {"queue": check_queue(queue)}) is not None


def paused(conn: psycopg.Connection) -> list[Pause]:
    """The paused queues, by name; none on a schema without the table."""
    if not sql.features(conn).pauses:
        return []
    return [Pause(*row) for row in sql.rows(conn, "paused", {"cap": MORE_READY})]
