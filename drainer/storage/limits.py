"""Flow control that holds across every drainer: a queue's concurrency, its groups'
and its rate, enforced by the database in the claim.

A queue with limits is claimed in a transaction of its own that first takes one
advisory lock per limited queue (`limits_lock`), so two drainers never count the
same room; its claim (`claim_limited`) then takes at most what the limits leave.
Queues without limits keep the plain claim, and pay nothing for this.
"""

import re
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import TypedDict

import psycopg

from ..errors import ConfigError
from . import sql

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(second|minute|hour)s?\s*$")
_PER = {"second": 1.0, "minute": 60.0, "hour": 3600.0}
MAX_LIMIT = 2**31 - 1  # the claim reads limits as the database's int


@dataclass(frozen=True)
class Limits:
    """A queue's limits (None: no such limit): `concurrency`, jobs running at once
    across every drainer (unlike --concurrency, a process's jobs in flight);
    `per_group`, running jobs per group (1: a group's jobs one at a time, in enqueue
    order); `rate` starts per `per_seconds`, a sliding window."""

    queue: str
    concurrency: int | None = None
    per_group: int | None = None
    rate: int | None = None
    per_seconds: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.concurrency, self.per_group, self.rate))

    def row(self, take: int) -> dict[str, object]:
        """This queue's object in a limited claim's `limits` JSON."""
        return {**self.fields, "take": take}

    @cached_property
    def fields(self) -> dict[str, object]:
        """The limits as a JSON object's fields, made once (asdict copies deeply: 6 µs
        at every claim)."""
        return asdict(self)


def limits(queue: str, concurrency: int | None, per_group: int | None,
           rate: str | None) -> Limits:
    """A task's limits, checked; ConfigError names the bad one."""
    where = f"@task({queue!r})"
    for name, value in (("concurrency", concurrency), ("per_group", per_group)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_LIMIT):
            raise ConfigError(f"{where}: {name} must be a whole number from 1 to "
                              f"{MAX_LIMIT} (jobs running at once across every drainer)")
    count, per = (None, None) if rate is None else _rate(rate, where)
    return Limits(queue, concurrency, per_group, count, per)


def _rate(text: object, where: str) -> tuple[int, float]:
    found = _RATE.match(text) if isinstance(text, str) else None
    if found is None or not 1 <= int(found[1]) <= MAX_LIMIT:
        raise ConfigError(f"{where}: rate must look like '100/minute' (per second, minute "
                          f"or hour; from 1 to {MAX_LIMIT})")
    return int(found[1]), _PER[found[2]]


class Fill(TypedDict):
    """How full a limited queue is, for `stats` and `doctor`."""

    queue: str
    concurrency: int | None
    per_group: int | None
    rate: int | None
    per_seconds: float | None
    running: int
    started: int  # starts in the rate's window
    ready: int
    held: int  # ready jobs that cannot start now for a limit


def swaps(known: sql.Features) -> dict[str, str]:
    """The parts a statement that reads the jobs cancelled while running swaps for the
    schema: without migration 11's column, their form before it (the lease kept); and
    without migration 10's index, none of them holds a place under a limit, as counting
    them would read every failed job at each claim."""
    found = {} if known.cancelled_running else {
        "cancelled_running": "cancelled_running_unmigrated",
        "cancelled_running_end": "cancelled_running_end_unmigrated"}
    if not known.cancelled_running_index:
        found |= {"limit_cancelled_running": "cancelled_running_none",
                  "group_cancelled_running": "cancelled_running_none",
                  "limit_cancelled_running_until": "cancelled_running_until_none"}
    return found


def cancelled_run(conn: psycopg.Connection, name: str, params: sql.Params) -> psycopg.Cursor:
    """Send statement `name`, which reads or writes the jobs cancelled while running, as
    this schema has them: without migration 11's column, its parts swapped for the old
    form (swaps), and its twin `name`_unmigrated where it writes one."""
    known = sql.features(conn)
    if known.cancelled_running:
        return sql.run(conn, name, params)
    if f"{name}_unmigrated" in sql.QUERIES:
        name += "_unmigrated"
    return sql.execute(conn, sql.variant(name, **swaps(known)), params)


def fills(conn: psycopg.Connection) -> list[Fill]:
    """Each limited queue's limits (as its latest drain declared them) and fill; none
    before migration 9."""
    if not sql.features(conn).limits:
        return []
    found: list[Fill] = []
    text = sql.variant("stats_limits", **swaps(sql.features(conn)))
    for row in sql.execute(conn, text, {"now": None}).fetchall():
        queue, concurrency, per_group, rate, per, running, started, ready, grouped = row
        room = min((left for left in (None if concurrency is None else concurrency - running,
                                      None if rate is None else rate - started)
                    if left is not None), default=None)
        free = ready - grouped
        held = ready - (free if room is None else max(0, min(free, room)))
        found.append({"queue": queue, "concurrency": concurrency, "per_group": per_group,
                      "rate": rate, "per_seconds": per, "running": running,
                      "started": started, "ready": ready, "held": held})
    return found


def describe(fill: Fill) -> str:
    """One line: the limits, how full each is, and the jobs held back."""
    parts = []
    if fill["concurrency"] is not None:
        parts.append(f"concurrency {fill['running']}/{fill['concurrency']} running")
    if fill["per_group"] is not None:
        parts.append(f"{fill['per_group']} per group")
    if fill["rate"] is not None:
        per = fill["per_seconds"]  # None: a row edited by hand
        parts.append(f"rate {fill['started']}/{fill['rate']} per "
                     f"{'?' if per is None else format(per, 'g')} s")
    return (f"{fill['queue']}: {', '.join(parts)}; {fill['ready']} ready, "
            f"{fill['held']} held back")
