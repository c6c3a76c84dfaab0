"""The function's run as a member of its fleet: the drains of its queue set that
widen together while a backlog lasts (drainer.storage.fleets).

A run joins when it starts (a member started to widen the fleet, with its ticket:
once), decides now and then while it drains whether the backlog calls for more
members (drainer.width, within the cap and the database's session budget) and, if
so, invokes the function asynchronously once per member asked for, each with a
`drainer.fanout` event. It leaves when it ends; cut by its deadline with work still
ready, it continues itself only to keep the fleet at its target width. A database
without the fleets table (or a cap of 1) runs every drain alone, as before.
"""

import logging
from collections.abc import Mapping
from typing import Any

import psycopg

from .. import clock, width
from ..errors import DrainerError
from ..run import Summary
from ..storage import budget, fleets
from ..tasks import Handler, as_task
from ..wake import Next
from . import clients, events
from .events import Trigger
from .settings import Settings

log = logging.getLogger(__name__)

DECIDE_EVERY = width.STARTUP  # seconds between a member's decisions (and lease renewals)
# Seconds a member asked for has to join: Lambda starts an asynchronous invocation
# within a second or so unless throttled; one that comes later (or never: a failed
# invoke) no longer counts, and is refused when it comes, so it adds no member.
TICKET_LAPSE = 60.0


class Member:
    """This run in its fleet; `enabled` False when it runs alone (no fleets table, a
    cap of 1); `refused` when it was started to widen the fleet and its ticket was
    spent already (a second delivery) or has lapsed: it does not drain."""

    def __init__(self, settings: Settings, trigger: Trigger, queues: list[str],
                 handlers: Mapping[str, Handler], function_arn: str, deadline: float) -> None:
        self.settings, self.trigger, self.arn = settings, trigger, function_arn
        self.deadline = deadline
        self.fleet = trigger.fleet or fleets.fleet_of(queues)
        self.id = fleets.member_id()
        self.lease = settings.lease.total_seconds()
        limits = [as_task(q, handlers[q]).limits.concurrency for q in queues]
        self.allowed = width.allowed(limits, settings.drain.concurrency)
        self.enabled = self.refused = False
        self.conn: psycopg.Connection | None = None
        self.began = self.last = clock.monotonic()
        self.started = 0  # members this run asked for

    def join(self, conn: psycopg.Connection) -> None:
        """Join the fleet on the run's first session."""
        if self.settings.max_width <= 1 or not fleets.available(conn):
            return
        seen, joined = fleets.change(conn, self.fleet, lambda f: f.joined(
            self.id, self.lease, self.trigger.ticket))
        ticket = self.trigger.ticket
        self.refused = ticket is not None and ticket not in seen.tickets
        self.enabled = joined is not None
        if self.refused:
            log.info("not needed: this member's ticket was spent or has lapsed",
                     extra={"data": {"event": "not_needed", "fleet": self.fleet}})

    def draining(self, conn: psycopg.Connection) -> None:
        """A drain begins on `conn`: the session decisions are sent on."""
        self.conn, self.began, self.last = conn, clock.monotonic(), clock.monotonic()

    def on_batch(self, summary: Summary) -> None:
        """After a batch: now and then, renew this member's lease and decide whether
        to widen. A failure is logged: the drain goes on, alone if need be."""
        now = clock.monotonic()
        if not self.enabled or self.conn is None or now - self.last < DECIDE_EVERY:
            return
        self.last = now
        try:
            self._decide(summary, now)
        except (psycopg.Error, DrainerError) as exc:
            log.warning("could not decide the fleet's width: %s", exc,
                        extra={"data": {"event": "widen_failed"}})

    def _load(self, summary: Summary, fleet: fleets.Fleet, room: int, now: float
              ) -> width.Load:
        elapsed = max(now - self.began, 1e-3)
        return width.Load(taken=summary.taken, full=summary.full, done=summary.claimed,
                          rate=summary.claimed / elapsed, left=self.deadline - now,
                          running=fleet.running + fleet.pending, cap=self.settings.max_width,
                          allowed=self.allowed, budget=room)

    def _decide(self, summary: Summary, now: float) -> None:
        conn = self.conn
        assert conn is not None
        issued: list[str] = []

        def edit(fleet: fleets.Fleet) -> fleets.Fleet:
            fleet = fleet.renewed(self.id, self.lease)
            issued.clear()
            asked = self._load(summary, fleet, 0, now)
            if width.wanted(asked) <= asked.running:
                return fleet  # the backlog calls for none: no need to read the budget
            room = budget.session_budget(conn, pool_size=self.settings.pool_size,
                                         share=self.settings.budget_share
                                         ).more(fleet.running, fleet.pending)
            more = width.more_members(self._load(summary, fleet, room, now))
            if more == 0:
                return fleet
            fleet, tickets = fleet.widened(more, TICKET_LAPSE)
            issued.extend(tickets)
            return fleet

        _, written = fleets.change(conn, self.fleet, edit)
        if written is None or not issued:
            return
        log.info("widening: %d more member(s), %d running", len(issued), written.running,
                 extra={"data": {"event": "widen", "fleet": self.fleet, "more": len(issued),
                                 "target": written.target, "running": written.running}})
        self._invoke([events.fanout(self.fleet, ticket) for ticket in issued])

    def _invoke(self, started: list[Any]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        for event in started:
            try:
                clients.invoke_async(self.arn, event)
                self.started += 1
            except (BotoCoreError, ClientError) as exc:
                log.error("could not start a member: %s; its ticket lapses", exc,
                          extra={"data": {"event": "fanout_failed"}})

    def leave(self, conn: psycopg.Connection, decision: Next, summary: Summary,
              ) -> events.ContinueEvent | None:
        """Leave the fleet at the run's end, and the continuation to send if the
        decision is to continue (None: the fleet's other members go on without it).
        A member that found nothing ready lowers the target (back to zero once all
        have)."""
        continuation = events.continuation(self.trigger.depth + 1)
        if not self.enabled:
            return continuation
        asked: list[str] = []

        def edit(fleet: fleets.Fleet) -> fleets.Fleet:
            fleet = fleet.left(self.id, empty=summary.stopped == "empty")
            asked.clear()
            if (decision.action == "continue" and fleet.target > 1
                    and fleet.running + fleet.pending < fleet.target):
                fleet, asked[:] = fleet.widened(1, TICKET_LAPSE)
            return fleet

        seen, written = fleets.change(conn, self.fleet, edit)
        if decision.action != "continue":
            return None
        if seen.target <= 1:  # never widened: it continues as a drain alone does
            return continuation
        if written is None or not asked:
            return None
        return events.continuation(self.trigger.depth + 1, self.fleet, asked[0])
