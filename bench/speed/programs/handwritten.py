"""The hand-written baseline: the classic jobs-table statements in a plain psycopg loop.

`python handwritten.py URL QUEUE --complete each|batch [--sleep S] [--concurrency N]`
claims 10 jobs with the classic claim CTE (FOR UPDATE SKIP LOCKED, committed at once),
runs a no-op (or sleeping) handler on each, then completes them: one guarded UPDATE
per job (`each`, checking each row count), or one guarded UPDATE for the batch
(`batch`); it exits when a claim comes back empty. This is what a user writes in an
afternoon, and what drainer has to beat.
"""

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg

CLAIM = """
WITH next AS (
  SELECT id FROM jobs
  WHERE queue = %(queue)s AND status = 'queued' AND run_at <= now()
  ORDER BY run_at
  LIMIT 10
  FOR UPDATE SKIP LOCKED
)
UPDATE jobs j
SET status = 'running', attempts = j.attempts + 1,
    locked_until = now() + interval '5 minutes'
FROM next
WHERE j.id = next.id
RETURNING j.id, j.payload, j.attempts"""

COMPLETE_ONE = """
UPDATE jobs SET status = 'done', locked_until = NULL
WHERE id = %s AND status = 'running' AND attempts = %s"""

COMPLETE_BATCH = """
UPDATE jobs j SET status = 'done', locked_until = NULL
FROM unnest(%s::bigint[], %s::int[]) AS t(id, attempts)
WHERE j.id = t.id AND j.status = 'running' AND j.attempts = t.attempts"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("queue")
    p.add_argument("--complete", choices=["each", "batch"], required=True)
    p.add_argument("--sleep", type=float, default=0.0, help="seconds each handler sleeps")
    p.add_argument("--concurrency", type=int, default=1)
    args = p.parse_args()

    def handle(job: tuple) -> None:
        if args.sleep:
            time.sleep(args.sleep)

    pool = ThreadPoolExecutor(args.concurrency) if args.concurrency > 1 else None
    lost = 0
    with psycopg.connect(args.url, autocommit=True) as conn:
        while jobs := conn.execute(CLAIM, {"queue": args.queue}).fetchall():
            if pool:
                list(pool.map(handle, jobs))
            else:
                for job in jobs:
                    handle(job)
            if args.complete == "each":
                for job_id, _, attempts in jobs:
                    lost += conn.execute(COMPLETE_ONE, (job_id, attempts)).rowcount != 1
            else:
                ids = [j[0] for j in jobs]
                done = conn.execute(COMPLETE_BATCH, (ids, [j[2] for j in jobs])).rowcount
                lost += len(jobs) - done
    if lost:
        raise SystemExit(f"{lost} jobs lost")


if __name__ == "__main__":
    main()
