"""Fill a bench database with the drainer this process imports: `seed()` empties the
jobs table, enqueues the jobs and runs VACUUM ANALYZE. The bench calls it in-process
for the current code; run as a program (`seed_jobs.py JSON`) by an earlier commit's
interpreter and tree (`python -m bench.speed --against REV`), it migrates or fills
that side's database with that side's own code, so each side gets its own schema.
"""

import json
import sys
from collections.abc import Sequence

import psycopg

import drainer


def seed(conn: psycopg.Connection, queue: str, jobs: int,
         priorities: Sequence[int] = ()) -> None:
    """`jobs` empty jobs on `queue`; with `priorities`, each job gets a unique key and
    the jobs are shared out between the priorities."""
    conn.execute("TRUNCATE jobs")
    if priorities:
        share = -(-jobs // len(priorities))
        for i, priority in enumerate(priorities):
            n = range(i * share, min(jobs, (i + 1) * share))
            drainer.enqueue_many(conn, queue, ({} for _ in n),
                                 keys=[f"job-{k}" for k in n], priority=priority)
    else:
        drainer.enqueue_many(conn, queue, ({} for _ in range(jobs)))
    conn.execute("VACUUM ANALYZE jobs")


def main() -> None:
    """argv[1]: {"url": ..., "migrate": true} or {"url", "queue", "jobs", "priorities"}."""
    spec = json.loads(sys.argv[1])
    with psycopg.connect(spec["url"], autocommit=True) as conn:
        if spec.get("migrate"):
            drainer.migrate(conn)
        else:
            seed(conn, spec["queue"], spec["jobs"], spec.get("priorities", ()))


if __name__ == "__main__":
    main()
