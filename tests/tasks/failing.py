"""Test tasks that fail on purpose, for the failure log lines and their tracebacks."""

import time

import psycopg

import drainer
from drainer import task


def _deliver(message: str) -> None:
    """A frame of its own, so a traceback has a function name to show."""
    raise RuntimeError(message)


@task("fails")
def fails(job):
    _deliver(job.payload["message"])


@task("hangs", timeout=0.3)
def hangs(job):
    time.sleep(3600)  # abandoned at its timeout


@task("cancels_itself")
def cancels_itself(job):
    """Withdrawn while running (as `drainer cancel` would), then fails: its failure is
    no longer the worker's to record."""
    with psycopg.connect(job.payload["url"], autocommit=True) as conn:
        drainer.cancel(conn, [job.id])
    raise RuntimeError("failed after being cancelled")
