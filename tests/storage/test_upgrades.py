"""A schema that is behind drains, and upgrades in place: the claim of CHANGELOG.md's
upgrade notes. At each migration's version (as `migrate` of that time left it, its
version recorded), a drain of this release runs the jobs and archives the old ones,
moving them once the archive table exists and deleting them before; `migrate` then
applies the rest, and the same jobs and drains go on."""

import psycopg
import pytest

import drainer
from drainer.storage import schema
from drainer.storage.sql import LATEST_VERSION, MIGRATIONS
from tests.helpers import schema_at


def drain_two(conn: psycopg.Connection) -> drainer.Summary:
    """Two plain jobs enqueued and drained; their rows then made old enough to archive,
    which the next drain does at its end."""
    done: list[int] = []
    for n in (1, 2):
        drainer.enqueue(conn, "default", {"n": n})
    summary = drainer.drain(conn, {"default": lambda job: done.append(job.payload["n"])},
                            drainer.Options(queues=["default"]))
    assert (summary.done, summary.stopped, sorted(done)) == (2, "empty", [1, 2])
    conn.execute("UPDATE jobs SET created_at = now() - interval '8 days' WHERE status = 'done'")
    return drainer.drain(conn, {"default": lambda job: None}, drainer.Options(queues=["default"]))


def archived(conn: psycopg.Connection) -> int:
    found = conn.execute("SELECT to_regclass('jobs_archive') IS NOT NULL").fetchone()[0]
    return conn.execute("SELECT count(*) FROM jobs_archive").fetchone()[0] if found else 0


@pytest.mark.parametrize("version", sorted(MIGRATIONS)[:-1])
def test_a_schema_behind_drains_then_migrates(empty_db_url, version):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        schema_at(conn, version)
        assert schema.version(conn) == version
        assert drain_two(conn).archived == 2
        assert archived(conn) == (2 if version >= 3 else 0)  # moved, else deleted

        assert schema.migrate(conn) == [v for v in sorted(MIGRATIONS) if v > version]
        assert schema.version(conn) == LATEST_VERSION
        assert drain_two(conn).archived == 2
        assert archived(conn) == (4 if version >= 3 else 2)
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == 0
