"""Fleets: the drains of one queue set that widen together to work off a backlog,
kept in one row of drainer_fleets (migration 14) with no process to watch it.

A drain joins its fleet when it starts and leaves when it ends; a drain started to
widen the fleet joins with a ticket the widening issued, once: a second delivery of
its start finds the ticket spent and adds no member. Every change reads the row,
makes the new state here (pure methods of `Fleet`) and writes it back only if no
one changed it meanwhile (`change`: compare-and-set on its version), so drains that
decide at once never each start more. Members and tickets carry an end on the
database's clock: a member killed without leaving stops counting when its lease
ends, a ticket never used when it lapses.
"""

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from . import sql

ATTEMPTS = 20  # compare-and-set rounds before a change gives up (each a lost race)


def fleet_of(queues: list[str]) -> str:
    """The fleet's id: the queue set, sorted, comma-joined."""
    return ",".join(sorted(set(queues)))


def member_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Fleet:
    """A fleet as read (`version`), its live members and tickets (id: when it ends,
    epoch seconds of the database's clock `now`)."""

    name: str
    version: int = 0
    target: int = 0
    members: dict[str, float] = field(default_factory=dict)
    tickets: dict[str, float] = field(default_factory=dict)
    peak: int = 0
    now: float = 0.0

    @property
    def running(self) -> int:
        return len(self.members)

    @property
    def pending(self) -> int:
        """Members asked for and not started yet."""
        return len(self.tickets)

    def _with(self, **changes: Any) -> "Fleet":
        made = replace(self, **changes)
        return replace(made, peak=max(made.peak, made.running))

    def joined(self, member: str, lease: float, ticket: str | None = None) -> "Fleet | None":
        """With `member` running until its lease ends; its `ticket` spent. None when
        the ticket is not live: spent by an earlier delivery, or lapsed."""
        tickets = dict(self.tickets)
        if ticket is not None and tickets.pop(ticket, None) is None:
            return None
        members = {**self.members, member: self.now + lease}
        return self._with(members=members, tickets=tickets,
                          target=max(self.target, len(members)))

    def renewed(self, member: str, lease: float) -> "Fleet":
        return self._with(members={**self.members, member: self.now + lease})

    def left(self, member: str, *, empty: bool) -> "Fleet":
        """Without `member`; a member that found nothing ready (`empty`) lowers the
        target to the members still running, so the fleet goes back to zero."""
        members = {k: v for k, v in self.members.items() if k != member}
        target = min(self.target, len(members) + self.pending) if empty else self.target
        return self._with(members=members, target=target)

    def widened(self, more: int, lapse: float) -> tuple["Fleet", list[str]]:
        """`more` members asked for: the tickets their starts carry, each lapsing after
        `lapse` seconds, and the target raised to count them."""
        issued = [member_id() for _ in range(more)]
        tickets = {**self.tickets, **dict.fromkeys(issued, self.now + lapse)}
        return self._with(tickets=tickets,
                          target=max(self.target, self.running + len(tickets))), issued


def _live(entries: dict[str, float], now: float) -> dict[str, float]:
    return {k: v for k, v in entries.items() if v > now}


def read(conn: psycopg.Connection, name: str) -> Fleet:
    """The fleet `name` (made on first use), expired members and lapsed tickets left out."""
    found = sql.row(conn, "fleet_read", {"fleet": name})
    if found is None:
        sql.run(conn, "fleet_make", {"fleet": name})
        found = sql.row(conn, "fleet_read", {"fleet": name})
        assert found is not None  # made, and a fleet is never deleted
    version, target, members, tickets, peak, now = found
    return Fleet(name, version, target, _live(members, now), _live(tickets, now), peak, now)


def change(conn: psycopg.Connection, name: str,
           edit: Callable[[Fleet], Fleet | None]) -> tuple[Fleet, Fleet | None]:
    """Apply `edit` to the fleet as it is, and write the result if no one changed the
    fleet meanwhile; else read it again and edit again. Returns the fleet `edit` saw
    and the fleet as it now is (None: `edit` refused the change, or every round lost a
    race)."""
    for _ in range(ATTEMPTS):
        seen = read(conn, name)
        new = edit(seen)
        if new is None or new == seen:
            return seen, new
        written = sql.row(conn, "fleet_write", {
            "fleet": name, "version": seen.version, "target": new.target,
            "members": json.dumps(new.members), "tickets": json.dumps(new.tickets),
            "peak": new.peak})
        if written is not None:
            return seen, replace(new, version=written[0])
    return seen, None


def available(conn: psycopg.Connection) -> bool:
    """Whether the schema has the fleets table (read again each time: rare)."""
    return bool(sql.value(conn, "has_fleets"))


def fleets(conn: psycopg.Connection) -> list[Fleet]:
    """Every fleet, for `stats`; none on a schema without the table."""
    if not available(conn):
        return []
    return [Fleet(name, version, target, _live(members, now), _live(tickets, now), peak, now)
            for name, version, target, members, tickets, peak, now in sql.rows(conn, "fleets")]
