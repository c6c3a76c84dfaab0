"""What becomes of a job whose handler did not return: retried after a delay, failed
for good at once, or snoozed (put back without counting the attempt).

A task's `backoff` is any callable from the attempt number (1 for the first claim)
to a delay, in seconds or a `timedelta`; `Exponential` and `Constant` are the usual
ones. Without one, the database computes the classic backoff in the write-back
itself, `least(1 hour, 10 s * 2^attempts)`, as it always has.
"""

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from .model import Job, Setback

log = logging.getLogger(__name__)

# The longest delay a policy, Retry or Snooze may ask for; longer ones are cut to it,
# so a run_at past what PostgreSQL and Python can hold is never written.
MAX_DELAY = timedelta(days=365)
# The shortest snooze: a job snoozed for less would be claimed again by the same drain
# at once, and a handler that always snoozes would keep it busy until its deadline.
MIN_SNOOZE = timedelta(seconds=1)

Delay = float | timedelta
Backoff = Callable[[int], Delay]


class Retry(Exception):  # noqa: N818 - raised to ask for a retry, not an error
    """Raised by a handler: run the job again after `delay` (seconds or a timedelta;
    None: the task's backoff), whatever the task's `retry_on` says. It counts as an
    attempt, so the job fails for good at max_attempts."""

    def __init__(self, *args: object, delay: Delay | None = None):
        super().__init__(*args or ("retry requested",))
        self.delay = delay


class Snooze(Exception):  # noqa: N818 - raised to put the job back, not an error
    """Raised by a handler: put the job back for `delay` (seconds or a timedelta). The
    attempt does not count against max_attempts: the job's budget rises by one (the
    attempt number, the claim's ownership token, is never lowered). Its last error
    stays as it was. A delay under a second counts as one second."""

    def __init__(self, *args: object, delay: Delay):
        super().__init__(*args or ("snoozed",))
        self.delay = delay


@dataclass(frozen=True)
class Exponential:
    """`base` seconds times `factor` to the attempt number, at most `cap` seconds; with
    `jitter` (0 to 1) up to that share of the delay is taken off at random, so jobs that
    failed together do not all come back in the same second. The defaults are the
    classic backoff: 20 s after the first attempt, 40 s, 80 s... at most an hour."""

    base: float = 10.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.0

    def __call__(self, attempt: int) -> float:
        try:
            delay = min(self.cap, self.base * self.factor ** attempt)
        except OverflowError:
            delay = self.cap
        return delay * (1 - self.jitter * random.random())


@dataclass(frozen=True)
class Constant:
    """The same delay after every attempt."""

    seconds: float

    def __call__(self, attempt: int) -> float:
        return self.seconds


def clamp(delay: object) -> timedelta:
    """A delay as a timedelta from 0 to MAX_DELAY: negative or NaN is 0, huge or
    infinite is MAX_DELAY; not a number at all is TypeError."""
    if isinstance(delay, timedelta):
        return min(max(delay, timedelta(0)), MAX_DELAY)
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise TypeError(f"a delay is a number of seconds or a timedelta, not {delay!r}")
    if math.isnan(delay) or delay <= 0:
        return timedelta(0)
    return MAX_DELAY if delay >= MAX_DELAY.total_seconds() else timedelta(seconds=delay)


@dataclass(frozen=True)
class Policy:
    """A task's answer to a failed attempt: its backoff (None: the database's classic
    one) and the exception types worth retrying (None: all)."""

    backoff: Backoff | None = None
    retry_on: tuple[type[BaseException], ...] | None = None

    def delay(self, job: Job) -> timedelta | None:
        """The backoff's delay for this attempt, clamped; None for the default. A policy
        that raises or returns something else is logged and the default used: a bug in
        it must not lose the failure."""
        if self.backoff is None:
            return None
        try:
            return clamp(self.backoff(job.attempts))
        except Exception as exc:  # noqa: BLE001 - the user's policy may raise anything
            log.warning("job %d (queue %s): the task's backoff failed (%s: %s); the default "
                        "backoff applies", job.id, job.queue, type(exc).__name__, exc)
            return None

    def judge(self, job: Job, exc: BaseException, error: str) -> Setback:
        """What `exc`, described as `error`, makes of the job."""
        if isinstance(exc, Snooze):
            return Setback(error, "snooze", max(MIN_SNOOZE, _asked(job, exc.delay) or MIN_SNOOZE))
        if isinstance(exc, Retry):
            asked = self.delay(job) if exc.delay is None else _asked(job, exc.delay)
            return Setback(error, "retry", asked)
        if self.retry_on is not None and not isinstance(exc, self.retry_on):
            return Setback(error, "failed", why="its task's retry_on does not name this exception")
        return Setback(error, "retry", self.delay(job))


def _asked(job: Job, delay: object) -> timedelta | None:
    """A delay a handler raised, clamped; None (the default) when it is not a delay."""
    try:
        return clamp(delay)
    except TypeError as exc:
        log.warning("job %d (queue %s): %s; the default applies", job.id, job.queue, exc)
        return None
