"""`work`: the always-on worker. Drain until nothing is ready, wait for a NOTIFY or
the fallback poll, drain again; until SIGTERM/SIGINT or the deadline.

A notification is only a hint to go and look: it is delivered at
commit, merged, and lost while nobody listens, so a slower fallback poll catches
whatever a reconnect missed. LISTEN belongs to a server session, so it needs a
direct connection; claims and completions may go through a transaction pooler.
Both connections reopen with backoff when they drop.
"""

import argparse
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import cast

import psycopg

from .. import clock, config, stopping
from ..errors import Conflict, DatabaseUnavailable, DrainerError
from ..run import COUNTS, Options, Summary, drain
from ..settings import DEFAULT_POLL
from ..storage import sql
from ..tasks import Handler
from .common import emit, handlers_of, open_db, options_of
from .drain import hint_failures
from .progress import closing, totals
from .signals import exit_code, ignore_signals, stop_on_signals

log = logging.getLogger(__name__)

LISTEN_NAME = "drainer-listen"  # application_name of the LISTEN session (see `doctor`)
MIN_WAIT = 0.5  # between drains that find ready work they cannot claim (rows locked elsewhere)
SLICE = 0.25  # seconds between looks at the stop signal while waiting; sends nothing

Opener = Callable[[], psycopg.Connection]


class Backoff:
    """Delays between reconnect attempts: doubling from FIRST up to MAX seconds."""

    FIRST, MAX = 0.5, 30.0

    def __init__(self) -> None:
        self.delay = self.FIRST

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.MAX, self.delay * 2)
        return delay

    def reset(self) -> None:
        self.delay = self.FIRST


def _pause(seconds: float, stop: threading.Event) -> bool:
    """Sleep in slices so a signal is seen promptly; True when stopped."""
    end = clock.monotonic() + seconds
    while not stop.is_set() and (left := end - clock.monotonic()) > 0:
        clock.sleep(min(SLICE, left))
    return stop.is_set()


def _close(conn: psycopg.Connection | None) -> None:
    if conn is not None:
        with contextlib.suppress(psycopg.Error):  # already gone
            conn.close()


class Listener:
    """`LISTEN jobs` on its own connection; when it drops, it is reopened with backoff
    while waiting, and the fallback poll covers the gap."""

    def __init__(self, opener: Opener, queues: Iterable[str]):
        self.opener = opener
        self.queues = set(queues)
        self.conn: psycopg.Connection | None = None
        self.backoff = Backoff()
        self.retry_at = 0.0
        self._listen()  # a first failure is the caller's (bad URL, server down: exit 2 or 3)

    def _listen(self) -> None:
        conn = self.opener()
        try:
            sql.run(conn, "listen")
        except BaseException:
            _close(conn)
            raise
        self.conn = conn

    def _dropped(self, exc: Exception) -> None:
        _close(self.conn)
        self.conn = None
        delay = self.backoff.next()
        self.retry_at = clock.monotonic() + delay
        log.warning("LISTEN connection lost (%s); reconnecting in %.1fs, the fallback poll "
                    "covers the gap", _first_line(exc), delay)

    def _reconnect(self) -> bool:
        try:
            self._listen()
        except DatabaseUnavailable as exc:
            self._dropped(exc)
            return False
        self.backoff.reset()
        log.info("LISTEN connection back")
        return True

    def _read(self, conn: psycopg.Connection, timeout: float) -> bool:
        """Whether a notification for one of our queues arrives within `timeout`."""
        try:
            payloads = [n.payload for n in conn.notifies(timeout=timeout, stop_after=1)]
        except psycopg.Error as exc:
            self._dropped(exc)
            return False
        return not self.queues.isdisjoint(payloads)

    def discard(self) -> None:
        """Consume what arrived, without waiting: called between a drain's batches, each
        followed by another claim that sees every job those notifications announced."""
        if self.conn is not None:
            self._read(self.conn, 0)

    def wait(self, seconds: float, stop: threading.Event) -> None:
        """Return when there may be work: a notification for our queues, a reconnect
        (anything may have been missed meanwhile), `seconds` elapsed, or `stop`."""
        end = clock.monotonic() + seconds
        while not stop.is_set() and (left := end - clock.monotonic()) > 0:
            if self.conn is not None:
                if self._read(self.conn, min(SLICE, left)):
                    return
            elif clock.monotonic() >= self.retry_at:
                if self._reconnect():
                    return
            else:
                clock.sleep(max(0.0, min(SLICE, left, self.retry_at - clock.monotonic())))

    def close(self) -> None:
        _close(self.conn)
        self.conn = None


def _log(summary: Summary) -> None:
    if any(getattr(summary, name) for name in COUNTS):
        log.info("drained: %s", totals(summary, summary.seconds))


def _wait_for(conn: psycopg.Connection, next_due: datetime | None, poll: float) -> float:
    """Seconds until the drain's next_due (a delayed job, a retry, a lease end), measured
    by the database clock, within [MIN_WAIT, poll]; the poll interval when nothing is due."""
    if next_due is None:
        return poll
    seconds: float = sql.value(conn, "seconds_until", {"at": next_due})
    return min(poll, max(MIN_WAIT, seconds))


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _reopen(opener: Opener, exc: Exception, stop: threading.Event) -> psycopg.Connection | None:
    """A new connection after `exc` dropped the old one, retried with backoff; None if stopped."""
    backoff = Backoff()
    log.warning("database connection lost (%s); reconnecting", _first_line(exc))
    while not _pause(backoff.next(), stop):
        try:
            conn = opener()
        except DatabaseUnavailable as again:
            log.warning("reconnect failed (%s); retrying", _first_line(again))
            continue
        log.info("database connection back")
        return conn
    return None


def _plus_before(total: Summary, exc: DrainerError) -> Summary:
    """`total` with the counts of what a drain wrote back before its error (the error's
    `summary`): those jobs ran, and the drain that goes on will not count them."""
    before = exc.summary or {}
    return replace(total, **{name: getattr(total, name) + cast(int, before.get(name, 0))
                             for name in COUNTS})


def work(
    claims: Opener,
    listen: Opener,
    handlers: Mapping[str, Handler],
    options: Options,
    *,
    poll_interval: float = DEFAULT_POLL,
    stop: threading.Event | None = None,
) -> Summary:
    """Drain, wait, drain again until `stop` is set or `options.deadline` passes.

    `claims` opens the (possibly pooled) connection for the drains, `listen` the
    direct one for LISTEN; both are called again to reconnect. Returns the totals.
    """
    began = clock.monotonic()
    stop = stop or threading.Event()
    total = Summary()
    listener = Listener(listen, options.queues)  # before the first drain: nothing slips by
    conn: psycopg.Connection | None = None
    try:
        conn = claims()
        while not stop.is_set():
            try:
                summary = drain(conn, handlers, options, stop=stop, reopen=claims,
                                on_batch=lambda _s: listener.discard())
                _log(summary)
                total = total.plus(summary)
                if summary.stopped != "empty":
                    break
                seconds = _wait_for(conn, summary.next_due, poll_interval)
            except DatabaseUnavailable as exc:
                total = _plus_before(total, exc)
                _close(conn)
                conn = _reopen(claims, exc, stop)
                if conn is None:
                    break
                continue
            except Conflict as exc:  # the drain's transaction was rolled back: drain again
                log.warning("%s; draining again", exc)
                total = _plus_before(total, exc)
                if _pause(MIN_WAIT, stop):
                    break
                continue
            if options.deadline is not None:
                seconds = min(seconds, max(0.0, options.deadline - clock.monotonic()))
            listener.wait(seconds, stop)
    finally:
        if not stopping.stranded(stop):  # else a thread may still wait on it
            _close(conn)
        listener.close()
    # Only a signal (or the deadline, reported by the drain) ends the loop.
    stopped = "signal" if total.stopped == "empty" else total.stopped
    return replace(total, stopped=stopped, seconds=clock.monotonic() - began)


def cmd_work(args: argparse.Namespace) -> int | None:
    if args.processes > 1:
        from . import members  # only here: a drain of one process never pays its import

        return members.run(args)
    handlers, queues = handlers_of(args)
    db = config.resolve_database(args.database_url)
    if args.no_prepare and not args.listen_url:
        log.warning("--no-prepare without --listen-url: LISTEN goes through the same URL; "
                    "behind a transaction pooler no notification arrives and only the "
                    "fallback poll finds work")
    listen_db = config.Database(args.listen_url) if args.listen_url else db
    stop = stop_on_signals()
    summary = work(partial(open_db, args, db=db),
                   partial(open_db, args, db=listen_db, application_name=LISTEN_NAME),
                   handlers, options_of(args, queues), poll_interval=args.poll_interval,
                   stop=stop)
    ignore_signals()
    log.info("%s", closing(summary, summary.seconds))  # as a drain ends: same words
    hint_failures(summary)
    emit(summary.as_json())
    return exit_code(stop)


__all__ = ["DEFAULT_POLL", "LISTEN_NAME", "Listener", "cmd_work", "work"]
