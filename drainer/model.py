"""The job model: what a claim hands out and what writing a batch back and the other
lifecycle calls report. Plain data with no SQL and no I/O, the bottom layer every
other module may import (it imports only the standard library).
"""

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A stored payload Python's json cannot load (nested too deep, a number too long),
    e.g. written by another producer; its job fails without running its handler."""

    reason: str


# Guards the first creation of a job's `cancelled` event: the handler's thread and the
# heartbeat's may both ask at once, and must get one event.
_CANCELLED_LOCK = threading.Lock()


Token = tuple[int, int]  # a claim's ownership token: (id, attempts)


@dataclass(frozen=True, slots=True, init=False)
class Job:
    """A claimed job. `attempts` is this claim's attempt number: the ownership token."""

    id: int
    queue: str
    payload: Any  # the JSON value as json.loads returns it, or Undecodable
    attempts: int
    max_attempts: int
    meta: Any = None  # what is about the job rather than its payload (a schedule's slot)
    # `cancelled`'s event, made when first asked for: jobs are made by the tens of
    # thousands a second, and most handlers never look.
    _cancelled: threading.Event | None = field(default=None, init=False, repr=False,
                                               compare=False)
    # (id, attempts): this claim of the job. A later claim of the same job has another
    # (attempts rises with each claim that may run it). Kept, not computed: a batch
    # looks it up several times a job.
    token: Token = field(init=False, repr=False, compare=False)

    def __init__(self, id: int, queue: str, payload: Any, attempts: int,  # noqa: A002
                 max_attempts: int, meta: Any = None) -> None:
        # Frozen: each field set through its slot's descriptor. A frozen dataclass's
        # own __init__ sets them by name through object.__setattr__, at twice the cost:
        # 1.3 us a job more, a tenth of a no-op drain's time on the client.
        _SET_ID(self, id)
        _SET_QUEUE(self, queue)
        _SET_PAYLOAD(self, payload)
        _SET_ATTEMPTS(self, attempts)
        _SET_MAX_ATTEMPTS(self, max_attempts)
        _SET_META(self, meta)
        _SET_CANCELLED(self, None)
        _SET_TOKEN(self, (id, attempts))

    def __post_init__(self) -> None:
        """The token, for a dataclass subclass: its generated __init__ calls this."""
        _SET_TOKEN(self, (self.id, self.attempts))

    @property
    def cancelled(self) -> threading.Event:
        """Set at the next lease heartbeat that finds the job no longer this worker's
        (cancelled, or taken over after its lease ran out), or when the drain writes its
        handler off (past its task's timeout, or still running at a stop's bound): the
        handler's result changes nothing any more, so it may as well stop. Once a handler
        has looked, its batch heartbeats at least every `engine.core.CANCEL_CHECK` seconds."""
        event = self._cancelled
        if event is None:
            with _CANCELLED_LOCK:
                event = self._cancelled
                if event is None:
                    event = threading.Event()
                    object.__setattr__(self, "_cancelled", event)  # frozen: past __setattr__
        return event

    @property
    def scheduled_for(self) -> datetime | None:
        """The slot a schedule's job runs for, in the schedule's time zone: its ZoneInfo,
        so that local arithmetic (a day later) crosses a daylight-saving change right;
        the slot's fixed offset when its meta names no zone (a slot queued by an older
        release). None for a job no schedule enqueued, and for a meta no schedule
        wrote: another producer's name that is not a string, or a slot that is not a
        time with its offset."""
        meta = self.meta
        named = isinstance(meta, dict) and isinstance(meta.get("schedule"), str)
        slot = meta.get("slot") if named else None
        try:
            when = datetime.fromisoformat(slot) if isinstance(slot, str) else None
        except ValueError:  # another producer's meta: not a slot any schedule wrote
            return None
        if when is None or when.tzinfo is None:
            return None
        zone = _zone(meta["tz"]) if isinstance(meta.get("tz"), str) else None
        try:
            return when if zone is None else _in_zone(when, zone)
        except OverflowError:  # another producer's slot at the calendar's end
            return when

    @property
    def cancel_watched(self) -> bool:
        """Whether `cancelled` was looked at (its event exists), without making it: the
        batch hurries its heartbeats only for handlers that watch."""
        return self._cancelled is not None



(_SET_ID, _SET_QUEUE, _SET_PAYLOAD, _SET_ATTEMPTS, _SET_MAX_ATTEMPTS, _SET_META, _SET_CANCELLED,
 _SET_TOKEN) = (getattr(Job, name).__set__ for name in (
    "id", "queue", "payload", "attempts", "max_attempts", "meta", "_cancelled", "token"))

@lru_cache(maxsize=64)
def _zone(name: str) -> ZoneInfo | None:
    """The time zone a slot job's meta names; None for a name that is none (another
    producer's meta)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _in_zone(when: datetime, zone: ZoneInfo) -> datetime:
    """`when` in `zone`, the same moment; in the hour that repeats as clocks go back,
    the pass `when`'s offset says (a datetime subclass, freezegun's say, loses the fold
    astimezone sets)."""
    local = when.astimezone(zone)
    other = local.replace(fold=1 - local.fold)
    return other if local.utcoffset() != when.utcoffset() == other.utcoffset() else local


class Setback(NamedTuple):
    """A started job that did not complete, as `settle` writes it: the error (`Type:
    message`), where the job goes ('retry': queued again after `delay`, or failed for
    good at max_attempts; 'failed': for good at once; 'snooze': queued again after
    `delay`, the attempt not counted), the delay (None: the default backoff), and why,
    for the log line, when the reason is not the error itself."""

    error: str
    then: str = "retry"
    delay: timedelta | None = None
    why: str | None = None



Failures = Sequence[tuple[Job, "str | Setback"]]  # a failure: its error, or a Setback


def as_setback(failure: "str | Setback") -> Setback:
    """A failure as `settle` writes it: an error alone retries with the default backoff."""
    return failure if isinstance(failure, Setback) else Setback(failure)


class Enqueued(NamedTuple):
    """What an enqueue with a key did: the job's id, and 'inserted', 'replaced' (a
    queued holder took the new payload, run_at and priority), or the status of the
    holder left as it was ('queued' or 'running')."""

    id: int
    outcome: str


class Failure(NamedTuple):
    """A recorded failure: the job's new status, 'queued' (to retry) or 'failed' (for
    good), and its new run_at, the database's time for the retry, which the failure's
    log line names."""

    status: str
    run_at: datetime


@dataclass
class Settled:
    """What writing a batch back found, by claim (Job.token: one write-back may hold
    two claims of a job, the older no longer ours): the claims done, {claim: Failure}
    of the failures and the claims released that were still ours (a claim in none was
    no longer ours), and the next batch."""

    done: set[Token]
    failed: dict[Token, Failure]
    released: set[Token]
    claimed: list[Job]
    # Sent again after a lost answer (settle_again), without the release: whether the
    # first one landed is unknown (its tokens, lowered, may be another drainer's now).
    resent: bool = False


@dataclass(frozen=True)
class Due:
    """`next_due` and where it comes from: the earliest queued job's run_at and the
    earliest running job's lease end (None when there is none); `now`, the database
    clock when they were read, for decisions about them taken outside SQL (wake-ups);
    `no_task`: queues with ready jobs that no known task handles (sorted, at most
    admin.MAX_NO_TASK)."""

    next_due: datetime | None
    run_at: datetime | None
    lease_end: datetime | None
    now: datetime
    no_task: list[str] = field(default_factory=list)


class Requeued(list[int]):
    """The ids `requeue` brought back, sorted; `held` maps each failed job it left
    failed to the job that holds its key (a queued or running one, or the newest of
    the requeued jobs with that key), since two jobs cannot hold one key."""

    def __init__(self, ids: Iterable[int], held: dict[int, int],
                 waiting: dict[int, datetime] | None = None):
        super().__init__(sorted(ids))
        self.held = held
        # {id: lease end} of jobs cancelled while running whose handler may still run:
        # left failed until then (requeued now, the job could run twice at once).
        self.waiting = waiting or {}
