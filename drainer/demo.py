"""`drainer demo`: sample jobs on the embedded database, drained with progress."""

import argparse
import json
import random
import sys
import threading
import time
from datetime import timedelta

import psycopg

from . import queue, report
from .progress import Progress
from .run import Options, drain
from .tasks import task


class FlakyError(Exception):
    """The sample failure a demo handler raises."""


@task("demo.email")
def send_email(job: queue.Job) -> None:
    time.sleep(0.002)
    if job.payload.get("bounce"):
        raise FlakyError(f"550 mailbox {job.payload['to']} unavailable")


@task("demo.thumbnail")
def make_thumbnail(job: queue.Job) -> None:
    time.sleep(job.payload["ms"] / 1000)


def enqueue_samples(conn: psycopg.Connection, rng: random.Random) -> int:
    """A few hundred jobs: fast ones, slow ones, failing ones, and some due later."""
    emails = [{"to": f"user{i}@example.com", "bounce": rng.random() < 0.05} for i in range(240)]
    thumbs = [{"ms": rng.randint(10, 60)} for _ in range(60)]
    with conn.transaction():
        n = queue.enqueue_many(conn, "demo.email", emails, max_attempts=2)
        n += queue.enqueue_many(conn, "demo.thumbnail", thumbs)
        n += queue.enqueue_many(conn, "demo.email", [{"to": "later@example.com"}] * 5,
                                delay=timedelta(hours=1))
    return n


def run(conn: psycopg.Connection, args: argparse.Namespace, *, stop: threading.Event) -> None:
    count = enqueue_samples(conn, random.Random(7))
    print(f"drainer demo: enqueued {count} sample jobs (5% of the emails bounce; "
          "5 are due in an hour)", file=sys.stderr)
    options = Options(queues=["demo.email", "demo.thumbnail"], concurrency=8)
    progress = Progress(sys.stderr)
    summary = drain(conn, {"demo.email": send_email, "demo.thumbnail": make_thumbnail},
                    options, stop=stop, on_batch=progress.update)
    progress.finish(summary)
    print(report.format_stats(report.stats(conn)))
    print("\nBounced emails are retried after 20 s (the seed's backoff) and fail for good on "
          "their second attempt;\nrun `python -m drainer demo` again later to see them move.",
          file=sys.stderr)
    print(json.dumps(summary.as_json()))
