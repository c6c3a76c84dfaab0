"""The producer's side: wake the drainer function right after an enqueue commits,
instead of waiting for the backstop schedule (a push from the producer: nothing
polls the database).

    kicker = Kicker("arn:aws:lambda:...:function:drainer")   # once per process
    with kicker.transaction(conn, "email"):
        conn.execute("INSERT INTO orders ...")
        drainer.enqueue(conn, "email", {"order_id": 42})
    # committed: the function is invoked; rolled back: it is not

Kicks are coalesced: at most one invocation per function per `interval` in a
process; kicks inside the interval are folded into one sent when it ends, so no
job waits for the backstop because its kick was folded. A kick that fails is
logged and sent again in the background a few times (riding out about half a
minute of throttling or outage), never raised: the job is committed, and should
every attempt fail, the backstop schedule drains it.
"""

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg import pq

from .. import clock, defaults
from . import clients, events

log = logging.getLogger(__name__)

RETRY_DELAYS = (1.0, 5.0, 25.0)  # seconds before each new attempt of a failed kick


class _Coalescer:
    """One function's kicks in this process: leading edge now, trailing edge later."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: float | None = None  # when the last kick was sent
        self.timer: threading.Timer | None = None

    def request(self, interval: float, send: Callable[[], None]) -> bool:
        """Send now (True), or make sure one send follows the interval (False)."""
        with self.lock:
            now = clock.monotonic()
            wait = 0.0 if self.last is None else self.last + interval - now
            if wait > 0:
                if self.timer is None:
                    self.timer = clock.later(wait, self._trailing, send)
                return False
            self.last = now
        send()
        return True

    def _trailing(self, send: Callable[[], None]) -> None:
        with self.lock:
            self.timer, self.last = None, clock.monotonic()
        send()


_coalescers: dict[str, _Coalescer] = {}
_registry_lock = threading.Lock()


def cancel_all() -> None:
    """Cancel every trailing kick still to come and forget when kicks were last sent,
    so a Kicker made afterwards starts afresh (for tests: no kick of one test fires
    in the next; see drainer.testing.reset). A Kicker made before keeps its past."""
    with _registry_lock:
        coalescers = list(_coalescers.values())
        _coalescers.clear()
    for coalescer in coalescers:
        with coalescer.lock:
            if coalescer.timer:
                coalescer.timer.cancel()
                coalescer.timer = None


class Kicker:
    def __init__(self, function: str, *, interval: float = defaults.KICK_INTERVAL,
                 retry: bool = True):
        """`function`: the drainer function's name or ARN (an alias ARN keeps the alias).
        `retry=False`: a failed kick is logged and not sent again, for a process about
        to exit (a command), which would drop the attempts due later."""
        self.function = function
        self.interval = interval
        self.retry = retry
        with _registry_lock:
            self._coalescer = _coalescers.setdefault(function, _Coalescer())

    def kick(self, queue: str) -> bool:
        """Invoke the function asynchronously, unless a kick was sent within the
        interval (then one follows when it ends). Call it after your commit (e.g.
        from your framework's on-commit hook); never raises. True when sent now."""
        return self._coalescer.request(self.interval, lambda: self._send(queue))

    def _send(self, queue: str, attempt: int = 0) -> None:
        try:
            clients.invoke_async(self.function, events.kick(queue))
        except Exception as exc:  # noqa: BLE001 - a kick must never fail the producer
            failure = f"kick of {self.function} failed ({type(exc).__name__}: {exc})"
            if not self.retry or attempt == len(RETRY_DELAYS):
                times = f" {attempt + 1} times" if attempt else ""
                log.error("%s%s; the backstop schedule will drain the queue", failure,
                          times)
                return
            delay = RETRY_DELAYS[attempt]
            log.warning("%s; sending it again in %g s", failure, delay)
            # A producer that exits meanwhile leaves it to the backstop.
            clock.later(delay, self._send, queue, attempt + 1)

    @contextmanager
    def transaction(self, conn: psycopg.Connection, queue: str) -> Iterator[None]:
        """A transaction on `conn` that kicks the function once it has committed.

        It must be the outermost transaction: inside another one it would be a
        savepoint, and a kick before the real commit would find nothing to drain.
        """
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            raise RuntimeError("Kicker.transaction() must begin the transaction, but the "
                               "connection is already in one; kick after your own commit")
        body_done = False
        with conn.transaction():
            yield
            body_done = True  # skipped when the block raises, psycopg.Rollback included
        if body_done:
            self.kick(queue)
