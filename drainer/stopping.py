"""A drain's stop in two steps, as a terminal's Ctrl-C pressed twice asks for.

The first stop (`set()`) starts nothing more and lets the running handlers finish.
The second (`hurry()`) does not wait for them: within HURRY seconds the drain writes
back what finished and gives back the jobs it claimed that never started, then
returns. Handlers still running are left to their lease. Any round trip that does not
answer in that time is left unanswered (`Unanswered`), and so is the connection it
went out on (`stranded`): closing it while a thread still waits on it is not safe, so
the process ends without closing it.
"""

import threading

from . import clock
from .errors import DatabaseUnavailable

HURRY = 1.5  # seconds the drain's last round trips may take after a second stop
POLL = 0.05  # seconds between looks at a second stop while the drain waits after a first


class Unanswered(DatabaseUnavailable):
    """A round trip the drain stopped waiting for after a second stop."""


class Stop(threading.Event):
    """A stop (set: start nothing more) that a second signal may hurry."""

    def __init__(self) -> None:
        super().__init__()
        self.hurried_at: float | None = None
        self.signum: int | None = None  # the signal that hurried it
        self.stranded = False  # a round trip was left unanswered on a connection
        self.last_resort: threading.Timer | None = None  # ends the process if all else hangs

    def hurry(self, signum: int | None = None) -> None:
        """Stop at once: only plain assignments, as a signal handler may call it."""
        self.signum = signum
        self.hurried_at = clock.monotonic()
        self.set()

    def left(self) -> float | None:
        """Seconds left for the last round trips; None when not hurried."""
        if self.hurried_at is None:
            return None
        return max(0.0, self.hurried_at + HURRY - clock.monotonic())


def hurried(stop: threading.Event) -> bool:
    return isinstance(stop, Stop) and stop.hurried_at is not None


def stranded(stop: threading.Event | None) -> bool:
    """Whether a connection was left with a round trip out: it must not be closed."""
    return isinstance(stop, Stop) and stop.stranded
