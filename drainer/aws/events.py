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
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TypedDict

from ..errors import BadInput

Kind = Literal["cron", "enqueue", "continue", "wake", "migrate"]

CRON, ENQUEUE, CONTINUE, WAKE, MIGRATE = (
    "drainer.cron", "drainer.enqueue", "drainer.continue", "drainer.wake", "drainer.migrate")
_SCHEDULED = {"aws.events", "aws.scheduler"}  # EventBridge's own scheduled notifications
_KINDS: dict[str, Kind] = {CRON: "cron", ENQUEUE: "enqueue", CONTINUE: "continue",
                           WAKE: "wake", MIGRATE: "migrate"}


@dataclass(frozen=True)
class Trigger:
    """Why the function runs; `depth` counts continuations (0 for every other kind)."""

    kind: Kind
    depth: int = 0
    queue: str | None = None


class KickEvent(TypedDict):
    source: str
    queue: str


class ContinueEvent(TypedDict):
    source: str
    depth: int


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
    if kind == "continue":
        depth = fields.get("depth")
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise BadInput(f"a continuation needs a depth of 1 or more, not {depth!r}")
        return Trigger(kind, depth=depth)
    queue = fields.get("queue")
    return Trigger(kind, queue=queue if isinstance(queue, str) else None)


def kick(queue: str) -> KickEvent:
    return {"source": ENQUEUE, "queue": queue}


def continuation(depth: int) -> ContinueEvent:
    return {"source": CONTINUE, "depth": depth}


def wake(at: datetime) -> WakeEvent:
    return {"source": WAKE, "at": at.isoformat()}
