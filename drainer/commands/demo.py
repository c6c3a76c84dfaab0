"""`drainer demo`: sample jobs on the embedded database, drained with progress."""

import argparse
import os
import random
import sys
import time
from datetime import timedelta

import psycopg

from .. import config, model
from ..run import Options
from ..storage import enqueue
from ..tasks import Handler, task
from .common import emit, open_db
from .drain import drain_with_progress
from .stats import format_stats, stats


class FlakyError(Exception):
    """The sample failure a demo handler raises."""


@task("demo.email")
def send_email(job: model.Job) -> None:
    time.sleep(0.002)
    if job.payload.get("bounce"):
        raise FlakyError(f"550 mailbox {job.payload['to']} unavailable")


@task("demo.thumbnail")
def make_thumbnail(job: model.Job) -> None:
    time.sleep(job.payload["ms"] / 1000)


OPTIONS = Options(queues=["demo.email", "demo.thumbnail"], concurrency=8)


def hint(program: str) -> str:
    """The closing hint, with `program` as the user ran it (`drainer`, `python -m
    drainer`), so the command it suggests can be pasted as is."""
    return ("\nBounced emails are retried after 20 s (the default backoff) and fail for good "
            f"on their second attempt;\nrun `{program} demo` again later to see them move.")


def enqueue_samples(conn: psycopg.Connection, rng: random.Random | None = None
                    ) -> dict[str, Handler]:
    """A few hundred jobs: fast ones, slow ones, failing ones, and some due later;
    returns the demo's handlers."""
    rng = rng or random.Random(7)
    emails = [{"to": f"user{i}@example.com", "bounce": rng.random() < 0.05} for i in range(240)]
    thumbs = [{"ms": rng.randint(10, 60)} for _ in range(60)]
    with conn.transaction():
        n = enqueue.enqueue_many(conn, "demo.email", emails, max_attempts=2)
        n += enqueue.enqueue_many(conn, "demo.thumbnail", thumbs)
        n += enqueue.enqueue_many(conn, "demo.email", [{"to": "later@example.com"}] * 5,
                                delay=timedelta(hours=1))
    print(f"drainer demo: enqueued {n} sample jobs (5% of the emails bounce; "
          "5 are due in an hour)", file=sys.stderr)
    return {"demo.email": send_email, "demo.thumbnail": make_thumbnail}


def _program() -> str:
    """How drainer was run, for a command the user can paste: `python -m drainer`
    (sys.argv[0] is then __main__.py's path), else the console script's name."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name == "drainer.__main__":
        return f"{os.path.basename(sys.executable) or 'python'} -m drainer"
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name and not name.startswith("-") and not name.endswith(".py") else "drainer"


def cmd_demo(args: argparse.Namespace) -> None:
    db = config.resolve_database(None, force_embedded=True)
    with open_db(args, db=db) as conn:
        handlers = enqueue_samples(conn)
        summary = drain_with_progress(args, handlers, OPTIONS, db=db)
        print(format_stats(stats(conn)))
    print(hint(_program()), file=sys.stderr)
    emit(summary.as_json())
