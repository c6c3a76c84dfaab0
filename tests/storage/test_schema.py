"""`migrate`: idempotent, concurrent-safe, accepts a hand-made table."""

import subprocess
import sys

import psycopg
import pytest

import drainer
from drainer.storage import schema
from drainer.storage.sql import LATEST_VERSION, MIGRATIONS
from tests.helpers import HAND_MADE_TABLE


def catalog(url: str) -> list[tuple]:
    """Columns, indexes, triggers and functions of the public schema, for comparison."""
    with psycopg.connect(url) as c:
        cols = c.execute("""
            SELECT table_name, column_name, data_type, is_nullable, column_default, is_identity
            FROM information_schema.columns WHERE table_schema = 'public'
            ORDER BY 1, 2""").fetchall()
        idx = c.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' "
                        "ORDER BY 1").fetchall()
        trg = c.execute("SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                        "WHERE NOT tgisinternal ORDER BY 1").fetchall()
        chk = c.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                        "WHERE connamespace = 'public'::regnamespace ORDER BY 1").fetchall()
    return [*cols, *idx, *trg, *chk]


def test_migrate_is_idempotent_and_records_the_version(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert schema.version(conn) == 0
        assert schema.migrate(conn) == sorted(MIGRATIONS)
        assert schema.migrate(conn) == []
        assert schema.version(conn) == LATEST_VERSION


def test_migrate_accepts_a_hand_made_table(empty_db_url, db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
        conn.execute("INSERT INTO jobs (payload) SELECT jsonb_build_object('email_id', g) "
                     "FROM generate_series(1, 10) AS g")
        schema.migrate(conn)
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 10
    assert catalog(empty_db_url) == catalog(db_url)  # same as a fresh migrate


def test_a_hand_made_table_drains_without_migrate(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
        drainer.enqueue(conn, "default", {"n": 1})
        summary = drainer.drain(conn, {"default": lambda job: None},
                                drainer.Options(queues=["default"]))
        assert (summary.done, summary.stopped) == (1, "empty")
        conn.execute("UPDATE jobs SET created_at = now() - interval '8 days'")
        assert drainer.archive(conn, drainer.defaults.ARCHIVE_AFTER, to_table=False) == 1


MIGRATE = """
import sys, psycopg
from drainer.storage.schema import migrate
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    print(migrate(conn))
"""


def test_concurrent_migrate_from_four_processes(empty_db_url):
    procs = [subprocess.Popen([sys.executable, "-c", MIGRATE, empty_db_url],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], results
    applied = sorted((out.strip() for out, _ in results), key=len)
    assert applied == ["[]", "[]", "[]", str(sorted(MIGRATIONS))]  # one did the work


def test_drain_on_a_missing_schema_says_to_migrate(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn, pytest.raises(
            drainer.SchemaMissing, match="drainer migrate"):
        drainer.drain(conn, {"default": lambda job: None}, drainer.Options(queues=["default"]))


def test_notify_trigger_sends_the_queue_name_once_per_statement(conn, db_url):
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN jobs")
        drainer.enqueue_many(conn, "mail", [{}] * 500)
        drainer.enqueue(conn, "sms", {})
        got = [n.payload for n in listener.notifies(timeout=1, stop_after=3)]
    assert got == ["mail", "sms"]


@pytest.mark.parametrize("options", [{}, {"priority": 1}, {"key": "k"}])
def test_enqueue_with_no_jobs_table_names_the_table_as_missing(empty_db_url, options):
    with psycopg.connect(empty_db_url, autocommit=True) as conn, pytest.raises(
            drainer.SchemaMissing, match="this database has no jobs table: run `drainer migrate`"):
        drainer.enqueue(conn, "default", {}, **options)


def test_migrate_runs_its_steps_on_psycopg_2_as_well(empty_db_url, db_url):
    """The migrations as a Django migration applies them: through another driver's
    connection, in that connection's open transaction, up to a given version."""
    from drainer.storage.adapters import Psycopg2
    from drainer.storage.drivers import blocking
    from tests.helpers import require_module

    psycopg2 = require_module("psycopg2", "drivers")
    pg2 = psycopg2.connect(empty_db_url)
    try:
        assert blocking(schema.upgrade(Psycopg2(pg2), 3)) == [1, 2, 3]
        pg2.rollback()  # the transaction's: nothing stays
        assert blocking(schema.upgrade(Psycopg2(pg2), 3)) == [1, 2, 3]
        pg2.commit()
        assert blocking(schema.upgrade(Psycopg2(pg2))) == [v for v in MIGRATIONS if v > 3]
        pg2.commit()
    finally:
        pg2.close()
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert schema.version(conn) == LATEST_VERSION
    assert catalog(empty_db_url) == catalog(db_url)
