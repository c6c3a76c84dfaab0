"""`--processes N`: `drain` or `work` as N member processes, each the same command
with one process (its own session, its own --concurrency handlers), their summaries
added up into one line. Claims keep them apart as they keep separate machines apart.

The members end with this process: a SIGTERM or SIGINT sent to it goes on to each
(a first one finishes the running handlers, a second stops at once, as for one
process), and if it dies without a word (kill -9), each member sees its stdin
close and stops as at a first signal.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from datetime import datetime
from typing import Any

from .. import clock, config
from ..engine.summary import COUNTS, Summary
from ..settings import PROCESSES
from ..storage.budget import session_budget
from .common import emit, handlers_of, log, open_db
from .progress import closing
from .signals import MEMBER

# A summary's stop reason, the strongest first: one member stopped by the deadline or
# a signal left ready jobs, which the run as a whole did not finish either.
STOPPED = ("deadline", "signal", "empty")


def member_argv(argv: list[str]) -> list[str]:
    """The command line without its --processes (the members' environment says 1)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == PROCESSES.option:
            skip = True
        elif not arg.startswith(PROCESSES.option + "="):
            kept.append(arg)
    return kept


def run(args: argparse.Namespace) -> int | None:
    """Start the members, pass on the signals this process gets, wait for them and
    print their summaries added up; the exit status is the first member's that is not
    0, else 0."""
    handlers_of(args)  # a bad --tasks or --queue said once, here, not by every member
    began = clock.monotonic()
    env = {**os.environ, MEMBER: "1", PROCESSES.env: "1"}
    command = [sys.executable, "-m", "drainer", *member_argv(args.argv)]
    members = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=env, start_new_session=True)
               for _ in range(affordable(args))]
    log.info("%s with %d processes", args.command, len(members))
    _pass_on_signals(members)
    outputs = _outputs(members)
    codes = [member.wait() for member in members]
    summaries = [found for found in map(_summary, outputs) if found is not None]
    total = added_up(summaries)
    total.seconds = clock.monotonic() - began
    log.info("%s", closing(total, total.seconds))
    emit(total.as_json())
    return next((code for code in codes if code), None)


def affordable(args: argparse.Namespace) -> int:
    """The members the database's session budget takes, at most --processes, at least
    one: a share (--budget-share) of the sessions the server, the role and the
    database still take (behind a pooler, of --pool-size), each member holding one
    (two for `work`: its LISTEN too). Read on a session of this process's, which it
    closes before the members open theirs."""
    per_member = 2 if args.command == "work" else 1
    with open_db(args, db=config.resolve_database(args.database_url)) as conn:
        budget = session_budget(conn, pool_size=args.pool_size, share=args.budget_share)
        sessions = budget.more(running=1) + 1  # this session's, closed before they start
    members: int = max(1, min(args.processes, sessions // per_member))
    if members < args.processes:
        log.warning("the database takes %d more sessions for drainer (a share of %g of "
                    "what it still takes, --budget-share): %d processes instead of %d",
                    sessions, args.budget_share, members, args.processes)
    return members


def _pass_on_signals(members: list[subprocess.Popen[bytes]]) -> None:
    """Each SIGTERM or SIGINT this process gets, sent on to every member still running
    (they are in sessions of their own: a terminal's Ctrl-C reaches this one only)."""
    def pass_on(signum: int, _frame: object) -> None:
        for member in members:
            if member.poll() is None:
                member.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, pass_on)


def _outputs(members: list[subprocess.Popen[bytes]]) -> list[bytes]:
    """Each member's stdout, read to its end on threads of their own (a member that
    fills its pipe must not wait for this process)."""
    found: list[bytes] = [b""] * len(members)

    def read(i: int) -> None:
        stream = members[i].stdout
        found[i] = stream.read() if stream is not None else b""

    readers = [threading.Thread(target=read, args=(i,), daemon=True)
               for i in range(len(members))]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    return found


def _summary(output: bytes) -> dict[str, Any] | None:
    """A member's summary: its last stdout line, when it got that far."""
    lines = output.decode(errors="replace").strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def added_up(summaries: list[dict[str, Any]]) -> Summary:
    """One summary of the members': counts added, the strongest stop reason, the
    earliest next_due, every queue some member found without a task."""
    total = Summary()
    for one in summaries:
        for name in COUNTS:
            setattr(total, name, getattr(total, name) + int(one.get(name) or 0))
        total.no_task = sorted({*total.no_task, *one.get("no_task", [])})
        due = one.get("next_due")
        if due and (total.next_due is None or datetime.fromisoformat(due) < total.next_due):
            total.next_due = datetime.fromisoformat(due)
    reasons = {one.get("stopped") for one in summaries}
    total.stopped = next((r for r in STOPPED if r in reasons), "empty")
    return total
