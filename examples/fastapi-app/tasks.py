"""The example service's task: confirm an order by email (here, record it as sent)."""

import os

import psycopg

from drainer import task


@task("email")
def confirm(job):
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS sent (order_id bigint PRIMARY KEY)")
        conn.execute("INSERT INTO sent VALUES (%s) ON CONFLICT DO NOTHING",
                     (job.payload["order"],))  # idempotent: a job may run twice
