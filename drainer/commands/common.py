"""What several commands share: the connection their arguments name, the handlers of
--tasks, a drain's options and deadline, and the JSON line each prints on stdout."""

import argparse
import json
import logging
import sys
import traceback
from collections.abc import Mapping
from typing import Any

import psycopg

from .. import clock, config
from .. import settings as s
from ..db import connect
from ..errors import ConfigError, redact
from ..run import Options
from ..storage import schema
from ..tasks import Task, select

log = logging.getLogger("drainer")


def open_db(args: argparse.Namespace, *, db: config.Database | None = None,
            **options: Any) -> psycopg.Connection:  # options: db.connect's keywords
    db = db or config.resolve_database(getattr(args, "database_url", None))
    conn = connect(db.url, prepare=not getattr(args, "no_prepare", False), **options)
    if db.embedded:
        schema.migrate(conn)
    return conn


def handlers_of(args: argparse.Namespace) -> tuple[dict[str, Task], list[str]]:
    try:
        return select(args.tasks, args.queue)
    except ConfigError as exc:
        # The one-line error names the module and the cause; --verbose adds the whole
        # traceback of a failed import, above it.
        if args.verbose and exc.__cause__ is not None:
            text = "".join(traceback.format_exception(exc.__cause__))
            print(redact(text).rstrip("\n"), file=sys.stderr)
        raise


def deadline(args: argparse.Namespace) -> float | None:
    return None if args.max_runtime is None else clock.process_start() + args.max_runtime


def options_of(args: argparse.Namespace, queues: list[str]) -> Options:
    return s.Drain.resolve(vars(args)).options(queues, deadline(args))


def emit(data: Mapping[str, object]) -> None:
    print(json.dumps(data, default=str), flush=True)
