"""The measurements: drain runs as processes, cold starts, bulk enqueue against a bare
COPY, and claim latency with and without a long history of finished rows."""

import json
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

import psycopg

import drainer
from drainer.db import connect
from drainer.storage import roundtrip
from drainer.storage.schema import migrate

from . import pg, procs
from .systems import Load, System

LEASE = timedelta(minutes=5)
WARM_UP = 100  # claims before the timed ones
COPY = "COPY jobs (queue, payload, run_at, max_attempts) FROM STDIN"

Log = Callable[[str], None]


class Failed(Exception):
    """A figure could not be measured; the message says why."""


def drain(system: System, load: Load, jobs: int) -> tuple[procs.Timed, float]:
    """One timed drain of `jobs` fresh jobs; returns the timing and statements per job."""
    system.seed(load.kind, jobs)
    pg.reset_statements(system.url)
    try:
        timed = procs.run(system.argvs(load, jobs), system.env())
    except procs.RunFailed as exc:
        raise Failed(str(exc)) from None
    statements = pg.statements(system.url)
    left = system.left()
    if left:
        raise Failed(f"{left} of {jobs} jobs left unfinished")
    return timed, statements / jobs


def cold_start(system: System) -> float:
    """Seconds for one process to start, find the queue empty and exit."""
    system.seed("noop", 0)
    try:
        return procs.run([system.argv("noop")], system.env()).seconds
    except procs.RunFailed as exc:
        raise Failed(str(exc)) from None


def enqueue_rates(url: str, rows: int) -> tuple[float, float, float]:
    """Rows per second of drainer.enqueue_many, of a bare COPY of the same rows (the
    same four columns and values, json.dumps for the payload), and of enqueue_many
    with a unique key for every row."""
    payloads = [{"n": i} for i in range(rows)]
    keys = [f"job-{i}" for i in range(rows)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs")
        ours = rows / _timed(lambda: drainer.enqueue_many(conn, "bench_noop", payloads))
        conn.execute("TRUNCATE jobs")
        began = time.perf_counter()
        with conn.transaction():
            now = conn.execute("SELECT now()").fetchone()[0]
            with conn.cursor().copy(COPY) as copy:
                for payload in payloads:
                    copy.write_row(("bench_noop", json.dumps(payload), now, 5))
        bare = rows / (time.perf_counter() - began)
        conn.execute("TRUNCATE jobs")
        keyed = rows / _timed(lambda: drainer.enqueue_many(conn, "bench_noop", payloads,
                                                           keys=keys))
    return ours, bare, keyed


def _timed(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def prepare_history(url: str, finished: int) -> None:
    """The jobs table with `finished` done rows, as a long-running queue has."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        conn.execute("""
            INSERT INTO jobs (queue, payload, status, attempts)
            SELECT 'bench_noop', jsonb_build_object('n', g), 'done', 1
            FROM generate_series(1, %s) AS g""", (finished,))
        conn.execute("VACUUM (FREEZE, ANALYZE) jobs")  # the history's upkeep, done once


def prepare_future(url: str, future: int) -> None:
    """The jobs table with `future` jobs at the highest priority, due in a day: the rows
    a claim by priority must not step over one by one."""
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        conn.execute("""
            INSERT INTO jobs (queue, payload, priority, run_at)
            SELECT 'bench_noop', jsonb_build_object('n', g), 100, now() + interval '1 day'
            FROM generate_series(1, %s) AS g""", (future,))
        conn.execute("VACUUM (FREEZE, ANALYZE) jobs")


def claim_latency(url: str, ready: int, claims: int) -> float:
    """Median milliseconds of drainer's claim of 10, over `claims` claims (after
    WARM_UP more) from a queue of `ready` fresh jobs (the table's done rows, and its
    jobs due later, are kept)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM jobs WHERE status <> 'done' AND run_at <= now()")
        drainer.enqueue_many(conn, "bench_noop", ({} for _ in range(ready)))
        conn.execute("VACUUM ANALYZE jobs")
        conn.execute("CHECKPOINT")  # no page writing left in the background to time
    times = []
    with connect(url) as conn:
        for n in range(WARM_UP + claims):
            began = time.perf_counter()
            if len(roundtrip.claim(conn, ["bench_noop"], 10, LEASE)) != 10:
                raise Failed("the claim found fewer than 10 ready jobs")
            if n >= WARM_UP:  # the statement prepared and its plan settled
                times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000
