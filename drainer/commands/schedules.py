"""`schedules`: each schedule and its next slot, last run and outcome; `--sync`
stores what the task modules declare (a deploy step). What a schedule is, and how
a drain keeps them, is drainer.schedules."""

import argparse

from .. import schedules
from ..errors import ConfigError
from ..storage import admin
from .common import emit, handlers_of, log, open_db


def cmd_schedules(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        if args.sync:
            args.queue = []  # every queue its modules have a task for
            _, queues = handlers_of(args)
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
        emit({"schedules": rows})
    else:
        print(schedules.format_listed(rows))
