"""What a serverless run does once its drain returns: nothing, continue, wait, or wake later.

Pure decisions on the run's summary, shared by the cloud entry points and the
scale-to-zero simulator in `bench/`, so the simulator cannot drift from what ships.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from .run import Summary

SOON = timedelta(minutes=1)  # a wake-up schedule has minute granularity


@dataclass(frozen=True)
class Next:
    """`continue`: invoke a fresh run now (ready work is left, the deadline stopped us);
    `wait`: sleep until `at` with no session open, then drain again in this run;
    `wake`: arm a one-time schedule for the minute `at`; `none`: nothing is left."""

    action: Literal["none", "continue", "wait", "wake"]
    at: datetime | None = None


def ceil_minute(moment: datetime) -> datetime:
    """The first whole minute at or after `moment`, so a wake-up never fires early."""
    floor = moment.replace(second=0, microsecond=0)
    return floor if floor == moment else floor + timedelta(minutes=1)


def after_run(
    summary: Summary,
    *,
    now: datetime,
    depth: int,
    max_depth: int,
    remaining: timedelta,
) -> Next:
    """Decide from the run's `next_due`, the database's `now`, the continuation depth
    and the time the function has left (after its safety margin)."""
    due = summary.next_due
    if due is None:
        return Next("none")
    if due <= now:
        # Ready work is left: the deadline (or a signal) cut the run short.
        return Next("continue") if depth < max_depth else Next("none")
    if due - now <= SOON and remaining > due - now:
        return Next("wait", due)
    return Next("wake", ceil_minute(due))
