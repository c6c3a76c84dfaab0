"""The scale-to-zero compute and the client sessions that keep it awake.

The rule is a scale-to-zero platform's activity monitor: a session that is not idle is
activity now; an idle session is activity at its last state change. So the
compute stays awake until `timeout` seconds after the last state change of any
session, then suspends and drops every connection; the next connection resumes
it, `resume` seconds later. A statement takes no virtual time: it is one state
change. A connection is made on a real PostgreSQL (`Connection`), so the
statements are drainer's own; its session here says what they cost the compute.
"""

from collections.abc import Callable
from typing import Any, Self

import psycopg
from psycopg.abc import Params, Query

from drainer import clock

from .kernel import Kernel


class Compute:
    """Awake time, resumes and suspensions of one compute over a simulated day."""

    def __init__(self, kernel: Kernel, *, timeout: float, resume: float) -> None:
        self.kernel = kernel
        self.timeout = timeout
        self.resume = resume
        self.awake_since: float | None = None  # None: suspended (the day starts so)
        self.ready_at = 0.0  # the end of a resume under way
        self.last_change = float("-inf")
        self.awake_seconds = 0.0
        self.resumes = 0
        self.epoch = 0  # bumped by each suspension or restart: older connections are gone
        self.restarts = 0
        self.on_drop: list[Callable[[], None]] = []  # called as connections are dropped
        self._check_armed = False

    def available(self) -> float:
        """Seconds until a statement arriving now can run (a resume if suspended)."""
        now = self.kernel.now
        if self.awake_since is None:
            self.awake_since = now
            self.resumes += 1
            self.ready_at = now + self.resume
            self.change(self.ready_at)
        return max(0.0, self.ready_at - now)

    def change(self, moment: float | None = None) -> None:
        """A session changed state (a statement began or ended, a connection closed)."""
        self.last_change = max(self.last_change, self.kernel.now if moment is None else moment)
        if not self._check_armed:
            self._check_armed = True
            self.kernel.call_at(self.last_change + self.timeout, self._check)

    def _check(self) -> None:
        """The activity monitor, woken when the last state change may have aged out."""
        self._check_armed = False
        if self.kernel.now < self.last_change + self.timeout:
            self.change(self.last_change)  # something happened since: look again later
            return
        self.awake_seconds += self.kernel.now - self.awake_since
        self.awake_since = None
        self._drop()

    def restart(self, seconds: float) -> None:
        """The database restarts, awake: every connection dropped, and none accepted
        for `seconds`."""
        self.restarts += 1
        self.ready_at = max(self.ready_at, self.kernel.now + seconds)
        self.change(self.ready_at)
        self._drop()

    @property
    def suspensions(self) -> int:
        return self.epoch - self.restarts

    def _drop(self) -> None:
        self.epoch += 1
        for listener in self.on_drop:
            listener()

    def awake_until(self, end: float) -> float:
        """Awake seconds from the day's start to `end`, a compute still awake included."""
        if self.awake_since is None:
            return self.awake_seconds
        return self.awake_seconds + max(0.0, end - self.awake_since)


class Session:
    """One client session: what its connection, statements and close cost the compute."""

    def __init__(self, compute: Compute, *, connect: float) -> None:
        self.compute = compute
        self.connect_seconds = connect
        self.epoch: int | None = None

    @property
    def live(self) -> bool:
        """Connected, and not dropped by a suspension since."""
        return self.epoch == self.compute.epoch

    def open(self) -> None:
        """Connect: wait for a resume if the compute is suspended, then the connection's
        own time (on virtual time, in a simulated thread)."""
        wait = self.compute.available()
        self.compute.change(self.compute.kernel.now + wait)
        clock.sleep(wait + self.connect_seconds)
        self.compute.change()
        self.epoch = self.compute.epoch

    def statement(self) -> None:
        """One statement. On a session the compute dropped meanwhile (a drain idle for
        longer than the suspend timeout) it resumes the compute without waiting."""
        if not self.live:
            self.compute.available()
            self.epoch = self.compute.epoch
        self.compute.change()

    def close(self) -> None:
        if self.live:
            self.compute.change()
        self.epoch = None


class Cursor(psycopg.Cursor):
    """Every statement drainer sends goes through a cursor's `execute`."""

    def execute(self, query: Query, params: Params | None = None, **kwargs: Any) -> Self:
        self.connection.session.statement()
        return super().execute(query, params, **kwargs)


class Connection(psycopg.Connection):
    """A real autocommit connection whose statements and close its `session` sees.
    Closing it gives it back to its pool: a backend's caches and prepared statements
    stay warm for the next session (a real connection per function run would cost
    more than its drain)."""

    session: Session | None = None  # None: in its pool
    pool: list["Connection"]
    cut = False  # its server session was cut (a restart): never back to the pool

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None
            if self.cut or self.broken:
                super().close()
            else:
                self.pool.append(self)

    def discard(self) -> None:
        super().close()
