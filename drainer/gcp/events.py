"""What the function is asked to do: a JSON object, the body of an HTTP request or
the data of a Pub/Sub message, and the ones drainer sends itself.

- no body, or `{"source": "drainer.cron"}`: the backstop (Cloud Scheduler's job);
- `{"source": "drainer.enqueue", "queue": Q}`: a producer's kick after its commit;
- `{"source": "drainer.continue", "depth": N}`: a run cut short by its deadline
  with jobs still ready, continued through a Cloud Tasks task;
- `{"source": "drainer.wake", "at": ISO}`: the task armed for the minute the next
  job becomes due;
- `{"source": "drainer.migrate"}`: apply the schema's migrations (a deploy step).
"""

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from .. import cloud
from ..errors import BadInput

Kind = Literal["cron", "enqueue", "continue", "wake", "migrate"]
KINDS: dict[str, Kind] = {f"drainer.{kind}": kind
                          for kind in ("cron", "enqueue", "continue", "wake", "migrate")}


@dataclass(frozen=True)
class Trigger:
    """Why the function runs; `depth` counts continuations (0 for every other kind)."""

    kind: Kind
    depth: int = 0
    queue: str | None = None


def parse(body: bytes) -> Trigger:
    """The trigger a body stands for, or BadInput saying what is expected."""
    if not body.strip():
        return Trigger("cron")
    try:
        fields = json.loads(body)
    except ValueError:
        raise BadInput("the body is not JSON; expected an object with a source "
                       f"({', '.join(KINDS)}), or no body for the backstop") from None
    source = fields.get("source") if isinstance(fields, dict) else None
    kind = KINDS.get(source) if isinstance(source, str) else None
    if kind is None:
        raise BadInput(f"unrecognised source {source!r}; expected one of {', '.join(KINDS)}")
    if kind == "continue":
        return Trigger(kind, depth=cloud.continuation_depth(fields.get("depth")))
    queue = fields.get("queue")
    return Trigger(kind, queue=queue if isinstance(queue, str) else None)


def body(kind: Kind, **fields: object) -> bytes:
    """The JSON body of a trigger drainer sends itself."""
    values = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in fields.items()}
    return json.dumps({"source": f"drainer.{kind}", **values}).encode()
