"""The drain's session: how its statements reach the database. A drain sends each
round trip through `Session.send(first, again)`: `first(conn)`, and `again(conn)` if
the session dropped and the round trip goes again on a new one.

- `Reconnecting`, a drain's: an autocommit connection, opened again when its session drops
  (for what may safely be sent twice: guarded writes, claims, reads); after a stop,
  a second stop may cut a round trip short.
- `InTransaction`, drain_now(in_transaction=True)'s: the caller's open transaction,
  which every statement joins; no reconnect, no commit of its own.

`first_session` gets a drain its first connection, riding through a database that
is resuming from a pause.
"""

import contextlib
import logging
import random
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

import psycopg

from .. import clock, stopping
from ..errors import DatabaseUnavailable, redact

log = logging.getLogger("drainer.run")  # the name its log lines always had

Reopen = Callable[[], psycopg.Connection]
# A new connection whose attempt takes at most this many seconds (None: libpq's own).
Open = Callable[[float | None], psycopg.Connection]
T = TypeVar("T")
# Pauses before each new connection when the drain's session drops (an idle limit
# of the server or a pooler, a restart); then the drain gives up (exit 3).
RECONNECTS = (0.0, 0.5, 2.0)
# The pauses between first attempts: doubling from the first to the longest, each
# jittered (a burst of runs woken together must not knock in step).
FIRST_PAUSE = 0.25
LONGEST_PAUSE = 2.0


def first_session(open: Open, budget: float, deadline: float | None = None
                  ) -> psycopg.Connection:
    """A drain's first connection, tried again with backoff for up to `budget`
    seconds in all, or until `deadline` (on `clock.monotonic`) when that comes first.
    A database that scales to zero refuses, holds or drops connections while it
    resumes; each attempt is given at most the time left. One log line when it starts
    waiting; DatabaseUnavailable, saying how long it tried, when it never answers."""
    end = clock.monotonic() + budget
    bound = f"for {budget:g} s (the connect timeout)"
    if deadline is not None and deadline < end:
        end, bound = deadline, "until the run's deadline"
    pause, waiting = FIRST_PAUSE, False
    while True:
        left = end - clock.monotonic()
        try:
            return open(left if left > 0 else None)
        except DatabaseUnavailable as exc:
            if not _worth_waiting(exc) or budget <= 0:
                raise
            if end - clock.monotonic() <= 0:
                raise _gave_up(exc, bound) from exc
            lost = exc
        if not waiting:
            log.warning("waiting for the database, which may be resuming (%s); trying "
                        "again %s", _reason(lost), bound)
            waiting = True
        clock.sleep(min(random.uniform(pause / 2, pause), max(0.0, end - clock.monotonic())))
        pause = min(2 * pause, LONGEST_PAUSE)
        if end - clock.monotonic() <= 0:
            raise _gave_up(lost, bound) from lost


def _worth_waiting(exc: DatabaseUnavailable) -> bool:
    """Whether another attempt may succeed: not when the server answered that the
    database or the role does not exist."""
    return "does not exist" not in str(exc)


def _reason(exc: DatabaseUnavailable) -> str:
    """What the driver said, without our advice on what to check (that comes once, if
    it never answers)."""
    said = str(exc.__cause__ or exc).strip().splitlines()
    return redact(said[0]) if said else str(exc)


def _gave_up(exc: DatabaseUnavailable, bound: str) -> DatabaseUnavailable:
    return DatabaseUnavailable(f"{exc}; it was tried {bound}")


class Reconnecting:
    """The drain's connection, opened again when its session drops, for what may
    safely be sent twice: guarded writes (complete, fail, extend), claims, reads.
    Connections it opened, it closes; the caller's stays the caller's."""

    one_trip = True

    def __init__(self, conn: psycopg.Connection, reopen: Reopen | None,
                 stop: threading.Event | None = None):
        self.conn = conn
        self.reopen = reopen
        self.stop = stop
        self.opened: list[psycopg.Connection] = []
        self.lock = threading.Lock()  # heartbeats come from handler threads too
        self.closed = False

    def send(self, first: Callable[[psycopg.Connection], T],
             again: Callable[[psycopg.Connection], T] | None = None) -> T:
        """`first(conn)`; if the session drops, `again` (default: `first`) on a new one.
        An error that leaves the session alive (a deadlock, a full disk) is raised as is:
        then what was sent is known to have rolled back. Once stopped, a second stop
        may cut the round trip short (`_within`)."""
        with self.lock:
            if self.closed:  # a handler written off at a stop, still going after the drain
                if stopping.stranded(self.stop):
                    raise stopping.Unanswered("the database did not answer in time")
                raise DatabaseUnavailable("the drain has ended; its connection is closed")
            if isinstance(self.stop, stopping.Stop) and self.stop.is_set():
                return self._within(self.stop, lambda: self._send(first, again))
            return self._send(first, again)

    def _within(self, stop: stopping.Stop, send: Callable[[], T]) -> T:
        """`send()` on another thread, waited for until a second stop's time is up:
        then the round trip, and its connection, are left as they are (`stranded`)."""
        done, answer, raised = clock.event(), list[T](), list[BaseException]()

        def run() -> None:
            try:
                answer.append(send())
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
                raised.append(exc)
            done.set()

        threading.Thread(target=run, daemon=True, name="drainer-round-trip").start()
        while not done.wait(stopping.POLL):
            left = stop.left()
            if left is not None and left <= 0:
                self.closed = stop.stranded = True
                raise stopping.Unanswered(
                    f"the database did not answer within {stopping.HURRY:g} s")
        if raised:
            raise raised[0]
        return answer[0]

    def _send(self, first: Callable[[psycopg.Connection], T],
              again: Callable[[psycopg.Connection], T] | None) -> T:
        """`send`'s round trip, and its reconnects; the caller holds the lock."""
        try:
            return first(self.conn)
        except DatabaseUnavailable as exc:
            if self.reopen is None or not (self.conn.broken or self.conn.closed):
                raise
            lost = exc
        for pause in RECONNECTS:
            clock.sleep(pause)
            log.warning("database connection lost (%s); sending again on a new one",
                        lost)
            try:
                self.conn = self.reopen()
                self.opened.append(self.conn)
                return (again or first)(self.conn)
            except DatabaseUnavailable as exc:
                lost = exc
        raise lost

    def close(self) -> None:
        with self.lock:
            self.closed = True
        if stopping.stranded(self.stop):
            return  # a thread may still wait on one of them
        for conn in self.opened:
            with contextlib.suppress(psycopg.Error):
                conn.close()


class Session(Protocol):
    """Where a drain's round trips go. `one_trip`: a batch's write-back and the next
    claim go in one round trip (False: the claim follows the write-back and the
    let-go of jobs cancelled under the batch, whose places a transaction whose clock
    stands still frees only then)."""

    conn: psycopg.Connection
    one_trip: bool

    def send(self, first: Callable[[psycopg.Connection], T],
             again: Callable[[psycopg.Connection], T] | None = None) -> T: ...

    def close(self) -> None: ...


class InTransaction:
    """The caller's open transaction (drain_now(in_transaction=True)): statements go
    on its connection as they are, once; a drop is the caller's error to see."""

    one_trip = False

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def send(self, first: Callable[[psycopg.Connection], T],
             again: Callable[[psycopg.Connection], T] | None = None) -> T:
        return first(self.conn)

    def close(self) -> None:
        """The connection, and its transaction, stay the caller's."""
