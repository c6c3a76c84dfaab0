"""The events the drainer function is invoked with: recognising them, and making
the ones drainer sends itself (kicks, continuations, wake-ups).

- `{"source": "drainer.cron"}`: the backstop schedule (EventBridge Scheduler's
  target input); a classic EventBridge "Scheduled Event" or Scheduler's default
  notification counts as the same.
- `{"source": "drainer.enqueue", "queue": Q}`: a producer's kick after its commit.
- `{"source": "drainer.continue", "depth": N}`: a run that hit its deadline with
  jobs still ready, continued by itself.
- `{"source": "drainer.wake", "at": ISO}`: the one-time schedule armed for the
  minute the next job becomes due.
- `{"source": "drainer.migrate"}`: run `migrate` (a deploy step, from inside the VPC).
- `{"source": "drainer.fanout", "fleet": F, "ticket": T}`: a member a run asked for
  to widen the fleet F of drains (its queue set) while a backlog lasts; the ticket
  lets it join once. A continuation of a fleet's member carries its fleet and a
  ticket too.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypedDict

from .. import cloud
from ..errors import BadInput

Kind = Literal["cron", "enqueue", "continue", "wake", "migrate", "fanout"]

CRON, ENQUEUE, CONTINUE, WAKE, MIGRATE, FANOUT = (
    "drainer.cron", "drainer.enqueue", "drainer.continue", "drainer.wake", "drainer.migrate",
    "drainer.fanout")
_SCHEDULED = {"aws.events", "aws.scheduler"}  # EventBridge's own scheduled notifications
_KINDS: dict[str, Kind] = {CRON: "cron", ENQUEUE: "enqueue", CONTINUE: "continue",
                           WAKE: "wake", MIGRATE: "migrate", FANOUT: "fanout"}


@dataclass(frozen=True)
class Trigger:
    """Why the function runs; `depth` counts continuations (0 for every other kind);
    `fleet` and `ticket`: the fleet a member started to widen it (or continued)
    joins, and the ticket it joins with."""

    kind: Kind
    depth: int = 0
    queue: str | None = None
    fleet: str | None = None
    ticket: str | None = None


class KickEvent(TypedDict):
    source: str
    queue: str


class ContinueEvent(TypedDict, total=False):
    source: str
    depth: int
    fleet: str
    ticket: str


class FanoutEvent(TypedDict):
    source: str
    fleet: str
    ticket: str


class WakeEvent(TypedDict):
    source: str
    at: str


def recognise(event: object) -> Trigger:
    """The trigger `event` stands for, or BadInput saying which shapes are expected."""
    fields: Mapping[object, object] = event if isinstance(event, dict) else {}
    source = fields.get("source")
    if source in _SCHEDULED and fields.get("detail-type") == "Scheduled Event":
        return Trigger("cron")
    kind = _KINDS.get(source) if isinstance(source, str) else None
    if kind is None:
        raise BadInput(f"unrecognised event (source {source!r}); expected source "
                       f"{', '.join(_KINDS)} or an EventBridge Scheduled Event")
    if kind == "fanout":
        fleet, ticket = _member(fields, required=True)
        return Trigger(kind, fleet=fleet, ticket=ticket)
    if kind == "continue":
        depth = cloud.continuation_depth(fields.get("depth"))
        fleet, ticket = _member(fields, required=False)
        return Trigger(kind, depth=depth, fleet=fleet, ticket=ticket)
    queue = fields.get("queue")
    return Trigger(kind, queue=queue if isinstance(queue, str) else None)


def _member(fields: Mapping[object, object], *, required: bool
            ) -> tuple[str | None, str | None]:
    """A fleet member's fleet and ticket, both strings (or, unless `required`, neither)."""
    fleet, ticket = fields.get("fleet"), fields.get("ticket")
    if fleet is None and ticket is None and not required:
        return None, None
    if not (isinstance(fleet, str) and isinstance(ticket, str) and fleet and ticket):
        raise BadInput(f"a fleet member's event needs a fleet and a ticket, not {fleet!r} "
                       f"and {ticket!r}")
    return fleet, ticket


def kick(queue: str) -> KickEvent:
    return {"source": ENQUEUE, "queue": queue}


def continuation(depth: int, fleet: str | None = None,
                 ticket: str | None = None) -> ContinueEvent:
    event: ContinueEvent = {"source": CONTINUE, "depth": depth}
    if fleet is not None and ticket is not None:
        event["fleet"], event["ticket"] = fleet, ticket
    return event


def fanout(fleet: str, ticket: str) -> FanoutEvent:
    return {"source": FANOUT, "fleet": fleet, "ticket": ticket}


def wake(at: datetime) -> WakeEvent:
    return {"source": WAKE, "at": at.isoformat()}
