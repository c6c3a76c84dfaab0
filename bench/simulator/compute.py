"""The scale-to-zero compute and the client sessions that keep it awake.

The rule is a scale-to-zero platform's activity monitor: a session that is not idle is
activity now; an idle session is activity at its last state change. So the
compute stays awake until `timeout` seconds after the last state change of any
session, then suspends and drops every connection; the next connection resumes
it, `resume` seconds later. A statement is short, so a session is modelled as a
state change when a statement starts and one when it ends.
"""

from .engine import Flag, Process, Sim


class Compute:
    """Awake time, resumes and suspensions of one compute over a simulated day."""

    def __init__(self, sim: Sim, *, timeout: float, resume: float) -> None:
        self.sim = sim
        self.timeout = timeout
        self.resume = resume
        self.awake_since: float | None = None  # None: suspended (the day starts so)
        self.ready_at = 0.0  # the end of a resume under way
        self.last_change = float("-inf")
        self.awake_seconds = 0.0
        self.resumes = 0
        self.epoch = 0  # bumped by each suspension: connections older than it are gone
        self.suspended = Flag()
        self._check_armed = False

    def available(self) -> float:
        """Seconds until a statement arriving now can run (a resume if suspended)."""
        now = self.sim.now
        if self.awake_since is None:
            self.awake_since = now
            self.resumes += 1
            self.ready_at = now + self.resume
            self.change(self.ready_at)
        return max(0.0, self.ready_at - now)

    def change(self, moment: float | None = None) -> None:
        """A session changed state (a statement began or ended, a connection closed)."""
        self.last_change = max(self.last_change, self.sim.now if moment is None else moment)
        if not self._check_armed:
            self._check_armed = True
            self.sim.call_at(self.last_change + self.timeout, self._check)

    def _check(self) -> None:
        """The activity monitor, woken when the last state change may have aged out."""
        self._check_armed = False
        if self.sim.now < self.last_change + self.timeout:
            self.change(self.last_change)  # something happened since: look again later
            return
        self.awake_seconds += self.sim.now - self.awake_since
        self.awake_since = None
        self.epoch += 1
        self.suspended.set()

    def awake_until(self, end: float) -> float:
        """Awake seconds from the day's start to `end`, a compute still awake included."""
        if self.awake_since is None:
            return self.awake_seconds
        return self.awake_seconds + max(0.0, end - self.awake_since)


class Session:
    """One client connection: it (re)connects when it has none, or the compute
    dropped it by suspending."""

    def __init__(self, compute: Compute, *, connect: float, statement: float) -> None:
        self.compute = compute
        self.connect_seconds = connect
        self.statement_seconds = statement
        self.epoch: int | None = None
        self.statements = 0

    def connect(self) -> Process:
        yield from self._active(self.connect_seconds)
        self.epoch = self.compute.epoch

    def sql(self) -> Process:
        """One statement, in autocommit: active while it runs, idle after."""
        if self.epoch != self.compute.epoch:
            yield from self.connect()
        yield from self._active(self.statement_seconds)
        self.statements += 1

    def _active(self, seconds: float) -> Process:
        wait = self.compute.available()
        self.compute.change(self.compute.sim.now + wait)
        yield wait + seconds
        self.compute.change()

    def close(self) -> None:
        if self.epoch == self.compute.epoch:
            self.compute.change()
        self.epoch = None
