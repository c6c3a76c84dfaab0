"""The least-privilege role of `drainer/storage/queries/roles.sql`: a login that holds only
`drainer_worker` runs a full drain (reap, claim, complete, fail, archive, next_due),
enqueues and does maintenance, and can change nothing else: no DDL. `migrate`
stays with the owner."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib.resources import files

import psycopg
import pytest

import drainer
from drainer import schedules
from drainer.db import connect
from drainer.run import Options, drain
from drainer.schedules import Schedule
from tests.helpers import at, run_cli, summary_of

LOGIN = "drainer_least_login"
ROLES_SQL = files("drainer").joinpath("storage", "queries", "roles.sql").read_text()


@pytest.fixture
def worker_url(server, db_url) -> Iterator[str]:
    """The URL of a login holding only drainer_worker, in a freshly migrated database."""
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute(ROLES_SQL)
        owner.execute(ROLES_SQL)  # idempotent
        owner.execute(f"DROP ROLE IF EXISTS {LOGIN}")
        owner.execute(f"CREATE ROLE {LOGIN} LOGIN IN ROLE drainer_worker")
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    yield server.url(dbname, LOGIN)
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute("DROP OWNED BY drainer_worker")  # its grants, so the roles can go
        owner.execute(f"DROP ROLE {LOGIN}")
        owner.execute("DROP ROLE drainer_worker")


def test_a_full_drain_as_the_worker_role(worker_url, conn):
    with connect(worker_url) as worker:
        assert worker.execute("SELECT current_user").fetchone() == (LOGIN,)
        drainer.enqueue(worker, "default", {"n": 1})
        drainer.enqueue(worker, "default", {"fail": True}, max_attempts=1)
        drainer.enqueue_many(worker, "default", [{"n": i} for i in range(5)])  # COPY
    # Owner-side staging: a dead worker's expired lease and an old finished row.
    conn.execute("INSERT INTO jobs (payload, status, attempts, locked_until) "
                 "VALUES ('{}', 'running', 1, now() - interval '1 minute')")
    conn.execute("INSERT INTO jobs (payload, status, created_at) "
                 "VALUES ('{}', 'done', now() - interval '8 days')")

    def handler(job):
        if job.payload.get("fail"):
            raise RuntimeError("planned")

    with connect(worker_url) as worker:
        s = drain(worker, {"default": handler}, Options(queues=["default"], batch_size=3,
                                                        lease=timedelta(seconds=30)))
        assert (s.reaped, s.claimed, s.done, s.failed, s.archived) == (1, 8, 7, 1, 1)
        assert s.next_due is None  # next_due ran: nothing left
        ids = drainer.requeue(worker, ids=[r[0] for r in worker.execute(
            "SELECT id FROM jobs WHERE status = 'failed'")])
        assert len(ids) == 1 and drainer.cancel(worker, ids) == ids
    assert conn.execute("SELECT count(*) FROM jobs_archive").fetchone() == (1,)


def test_the_cli_as_the_worker_role_and_migrate_as_the_owner(worker_url, db_url):
    assert run_cli("enqueue", "default", '{"sleep": 0}', "--database-url", worker_url
                   ).returncode == 0
    result = run_cli("drain", "--database-url", worker_url, "--tasks", "behave")
    assert result.returncode == 0, result.stderr
    assert summary_of(result.stdout)["done"] == 1
    for command in (["stats"], ["reap"], ["archive"]):
        assert run_cli(*command, "--database-url", worker_url).returncode == 0, command
    refused = run_cli("migrate", "--database-url", worker_url)
    assert refused.returncode == 2 and "permission denied" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert run_cli("migrate", "--database-url", db_url).returncode == 0  # the owner


@pytest.mark.parametrize("statement", [
    "CREATE TABLE mine (x int)",
    "CREATE INDEX mine_idx ON jobs (created_at)",
    "ALTER TABLE jobs ADD COLUMN mine int",
    "DROP TABLE jobs",
    "TRUNCATE jobs",
    "DROP TRIGGER jobs_notify ON jobs",
    "CREATE OR REPLACE FUNCTION jobs_notify() RETURNS trigger LANGUAGE plpgsql "
    "AS $$ BEGIN RETURN NULL; END $$",
    "UPDATE jobs_archive SET queue = 'x'",
    "DELETE FROM jobs_archive",
    "INSERT INTO drainer_schema (version) VALUES (99)",
    "DROP TABLE drainer_schema",
])
def test_the_worker_role_has_no_ddl_and_nothing_beyond_the_queue(worker_url, statement):
    with connect(worker_url) as worker, pytest.raises(psycopg.errors.InsufficientPrivilege):
        worker.execute(statement)


# --- schedules and limits ------------------------------------------------------------


def test_the_worker_role_drains_a_queue_with_a_schedule(worker_url, conn, declared):
    hourly = Schedule("h", "hq", "@hourly")
    schedules.declare(hourly)
    with at(datetime(2026, 5, 1, 12, 30, tzinfo=UTC)), connect(worker_url) as worker:
        drain(worker, {"hq": lambda job: None}, Options(["hq"]))
    with at(datetime(2026, 5, 1, 13, 0, 1, tzinfo=UTC)), connect(worker_url) as worker:
        summary = drain(worker, {"hq": lambda job: None}, Options(["hq"]))
    assert summary.done == 1
    assert conn.execute("SELECT last_slot FROM drainer_schedules").fetchone() == (
        datetime(2026, 5, 1, 14, tzinfo=UTC),)


def test_the_worker_role_drains_other_queues_once_a_schedule_is_stored(
        worker_url, conn, declared):
    schedules.reconcile(conn, [Schedule("h", "hq", "@hourly")], ["hq"])  # by the owner
    conn.execute("ANALYZE drainer_schedules")  # the statistics say it held a row
    drainer.enqueue(conn, "plain", {})
    with connect(worker_url) as worker:
        summary = drain(worker, {"plain": lambda job: None}, Options(["plain"]))
    assert summary.done == 1


def test_the_worker_role_drains_a_queue_with_limits(worker_url, conn):
    from drainer.tasks import Task

    drainer.enqueue_many(conn, "lim", [{}] * 5, group="g")
    limited = Task(lambda job: None, "lim", concurrency=2, per_group=1, rate="100/second")
    with connect(worker_url) as worker:
        summary = drain(worker, {"lim": limited}, Options(["lim"], concurrency=2))
    assert summary.done == 5
    assert conn.execute("SELECT count(*) FROM drainer_starts").fetchone() == (5,)
