"""`drain`, the default command: reap, drain the queues until none is ready, archive,
report, exit; with a progress line on stderr."""

import argparse
import sys
from collections.abc import Mapping
from functools import partial

import psycopg

from .. import config, stopping
from .. import settings as s
from ..engine.session import first_session
from ..run import Options, Summary, drain
from ..tasks import Handler
from .common import emit, handlers_of, log, open_db, options_of
from .progress import Progress
from .signals import exit_code, ignore_signals, stop_on_signals


def drain_with_progress(args: argparse.Namespace, handlers: Mapping[str, Handler],
                        options: Options, *, db: config.Database | None = None,
                        stop: stopping.Stop | None = None) -> Summary:
    """A drain with progress on stderr; its first connection waits for a database
    that is resuming (--connect-timeout), and it reconnects if its session drops."""
    db = db or config.resolve_database(args.database_url)
    progress = Progress(sys.stderr)
    stop = stop or stop_on_signals()
    conn = first_session(partial(_attempt, args, db), _budget(args), options.deadline)
    try:
        summary = drain(conn, handlers, options, stop=stop,
                        on_batch=progress.update, reopen=partial(open_db, args, db=db))
    finally:
        if not stop.stranded:
            conn.close()
    ignore_signals()
    progress.finish(summary)
    return summary


def _attempt(args: argparse.Namespace, db: config.Database, within: float | None
             ) -> psycopg.Connection:
    return open_db(args, db=db, connect_timeout=within)


def _budget(args: argparse.Namespace) -> float:
    """--connect-timeout; `demo`, which has no such option, takes the default."""
    return s.CONNECT_TIMEOUT.resolve(getattr(args, "connect_timeout", None))


def hint_failures(summary: Summary) -> None:
    """Where to look when the summary counts failures: without it a user sees only
    `retried 14`, with no way to learn why short of psql."""
    counts = [f"{n} {what}" for n, what in ((summary.failed, "failed for good"),
                                             (summary.retried, "to be retried")) if n]
    if counts:
        log.info("%s: why is in the lines above; `drainer failed` lists failed jobs with "
                 "their last error, `drainer show ID` shows one job whole", " and ".join(counts))


def cmd_drain(args: argparse.Namespace) -> int | None:
    if args.processes > 1:
        from . import members  # only here: a drain of one process never pays its import

        return members.run(args)
    handlers, queues = handlers_of(args)
    stop = stop_on_signals()
    summary = drain_with_progress(args, handlers, options_of(args, queues), stop=stop)
    hint_failures(summary)
    emit(summary.as_json())
    return exit_code(stop)
