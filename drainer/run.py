"""The drain, drainer's public entry to it: reap, claim batches and run them until
nothing is ready, archive, report. The loop is `drainer.engine.drain`'s; this is
where a drain's session (an autocommit connection that reconnects) and runner (the
handler threads and the event loop) are chosen, and its summary and trace made.
"""

import threading
from collections.abc import Callable, Mapping

import psycopg

from . import clock
from .engine.drain import Drain, Options, checked
from .engine.runners import THREADS
from .engine.session import Reconnecting, Reopen
from .engine.sizer import MAX_INT, Sizer
from .engine.spans import DrainTrace
from .engine.summary import COUNTS, Summary, warn_no_task
from .errors import ConfigError, DrainerError, SchemaMissing
from .tasks import Handler

__all__ = ["COUNTS", "MAX_INT", "Options", "Sizer", "Summary", "drain", "warn_no_task"]


def _use_loop(kind: str | None) -> None:
    if kind is None:
        return
    try:
        kind = clock.loop_kind(kind)
    except ValueError as exc:
        raise ConfigError(f"event_loop={exc}") from None
    if kind == "uvloop" and not clock.uvloop_installed():
        raise ConfigError("the uvloop event loop was asked for, and uvloop is not installed: "
                          "pip install 'drainer[uvloop]', or ask for auto or asyncio")
    clock.use_loop(kind)


def drain(
    conn: psycopg.Connection,
    handlers: Mapping[str, Handler],
    options: Options,
    *,
    stop: threading.Event | None = None,
    on_batch: Callable[[Summary], None] | None = None,
    on_claim: Callable[[], None] | None = None,
    reopen: Reopen | None = None,
) -> Summary:
    """One drain on `conn`, which must be an autocommit connection. `on_claim` is
    called once, when the drain first holds jobs and before any handler starts (the
    cloud run arms its dead-man's switch there). `reopen` opens a new connection when
    the session drops mid-drain; without it the drain stops with the error.

    A DrainerError raised after the drain began carries `summary`, the JSON of the
    work done until then; SchemaMissing none (there was no table to work on)."""
    options = checked(handlers, options)
    if not conn.autocommit:
        raise ConfigError("drain() needs an autocommit connection (psycopg.connect(url, "
                          "autocommit=True)): on any other, its claims would stay in an "
                          "open transaction while the handlers run")
    _use_loop(options.event_loop)
    began = clock.monotonic()
    summary = Summary()
    stop = stop or threading.Event()
    link = Reconnecting(conn, reopen, stop)
    traced = DrainTrace.start(options.queues)
    failed: BaseException | None = None
    try:
        Drain(link, THREADS, handlers, options, stop, summary, traced=traced).run(
            on_batch, on_claim)
    except DrainerError as exc:
        summary.seconds = clock.monotonic() - began
        if not isinstance(exc, SchemaMissing):  # no jobs table: no work done, nor
            exc.summary = summary.as_json()     # queues found empty, to report
        failed = exc
        raise
    except BaseException as exc:
        failed = exc
        raise
    finally:
        link.close()
        if traced is not None:
            summary.seconds = clock.monotonic() - began
            traced.end(summary.as_json(), failed)
    summary.seconds = clock.monotonic() - began
    return summary
