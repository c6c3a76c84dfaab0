"""What a serverless run does once its drain returns: nothing, continue, wait, or wake later.

Pure decisions on the run's summary, shared by the cloud entry points and the
scale-to-zero simulator in `bench/`, so the simulator cannot drift from what ships.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from .run import Summary

SOON = timedelta(minutes=1)  # a wake-up schedule has minute granularity
# A wake-up fires at its minute by the scheduler's clock, which may be a moment ahead
# of the database's: a job due on the minute (a schedule's slot) is then not due yet.
# Any run waits that moment out rather than arm a wake-up for a minute already begun.
CLOCK_SLACK = timedelta(seconds=5)


@dataclass(frozen=True)
class Next:
    """`continue`: invoke a fresh run now (ready work is left, the deadline stopped us);
    `wait`: sleep until `at` with no session open, then drain again in this run;
    `wake`: arm a one-time schedule for the minute `at`; `none`: nothing is left.

    `lease`: `at` is a running job's lease end, not a queued job's run_at; such a
    wake-up matters only if the lease's holder dies (it reaps the job), so the holder,
    or any run after it, deletes it once stale. `leases_from`: the database at the
    run's end said no lease ends before this minute (None: no job is running), so
    lease wake-ups of earlier minutes are stale; a run that stops (none, wake) deletes
    them."""

    action: Literal["none", "continue", "wait", "wake"]
    at: datetime | None = None
    lease: bool = False
    leases_from: datetime | None = None

    @property
    def stops(self) -> bool:
        """Whether the run stops here (none, wake), rather than drain again soon
        (wait, continue), so its view of the leases is the last word for now."""
        return self.action in ("none", "wake")

    def stale(self, lease_wake_up: datetime) -> bool:
        """Whether the lease wake-up armed for the minute `lease_wake_up` can go."""
        return self.stops and (self.leases_from is None or lease_wake_up < self.leases_from)


WAKE_PREFIX, LEASE_PREFIX = "wake-", "lease-"  # wake-up names: a queued job's, a lease end's
MINUTE = "%Y%m%dT%H%MZ"  # the minute in a wake-up's name, in UTC


def name_for(at: datetime, *, lease: bool = False) -> str:
    """A wake-up's name on a cloud scheduler: its kind and its minute, so runs that
    arm the same minute arm one wake-up."""
    if at.tzinfo is None:
        raise ValueError("a wake-up time must carry its time zone")
    return (LEASE_PREFIX if lease else WAKE_PREFIX) + at.astimezone(UTC).strftime(MINUTE)


def stale(names: Iterable[str], decision: Next) -> list[str]:
    """The lease wake-ups among `names` that `decision` says are no longer needed;
    a name not of our making is never among them."""
    found = []
    for name in (n for n in names if n.startswith(LEASE_PREFIX)):
        try:
            minute = datetime.strptime(name.removeprefix(LEASE_PREFIX), MINUTE)
        except ValueError:
            continue  # someone else's: not ours to delete
        if decision.stale(minute.replace(tzinfo=UTC)):
            found.append(name)
    return found


def ceil_minute(moment: datetime) -> datetime:
    """The first whole minute at or after `moment`, so a wake-up never fires early."""
    floor = moment.replace(second=0, microsecond=0)
    return floor if floor == moment else floor + timedelta(minutes=1)


def switch_at(now: datetime, lease: timedelta) -> datetime:
    """The minute a run's dead-man's switch fires: that of the lease its claim took at
    `now`, so it never fires before the lease can have expired (on one clock)."""
    return ceil_minute(now + lease)


def after_run(
    summary: Summary,
    *,
    now: datetime,
    depth: int,
    max_depth: int,
    remaining: timedelta,
) -> Next:
    """Decide from the run's last drain (`next_due` and its sources, what it claimed),
    the database's `now`, the continuation depth and the time the function has left
    (after its safety margin)."""
    due, lease_end = summary.next_due, summary.next_lease_end
    leases_from = None if lease_end is None else ceil_minute(lease_end)
    if due is None:
        return Next("none")
    if due <= now:
        # Ready work is left: the deadline (or a signal) cut the run short.
        if depth < max_depth:
            return Next("continue")
        return Next("none", leases_from=leases_from)
    lease = lease_end is not None and (summary.next_run_at is None
                                       or lease_end < summary.next_run_at)
    # Wait in the run only for a queued job (a live holder extends its lease or
    # finishes, so waiting for a lease end would most likely be for nothing), and
    # only after a drain that claimed something: one that found nothing lost the
    # race to a sibling, and in a burst every run would wait for the same job. It
    # arms the wake-up instead, whose name dedupes across runs; but a job due within
    # CLOCK_SLACK is waited for by any run.
    if not lease and remaining > due - now and (
            due - now <= CLOCK_SLACK or (summary.claimed and due - now <= SOON)):
        return Next("wait", due)
    return Next("wake", ceil_minute(due), lease=lease, leases_from=leases_from)
