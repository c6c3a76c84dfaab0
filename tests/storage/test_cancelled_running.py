"""The fifth state, a job cancelled while running, across the upgrade that gave it a
column of its own (migration 11, cancelled_running_until): a row a release before it
cancelled (its claim's lease kept on the failed row) is backfilled, and keeps its
places throughout; what a drainer of such a release writes meanwhile is read as that
state; the column alone is enough; a schema without the migration works as before."""

from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer.model import Job
from drainer.storage import admin, roundtrip, schema, writeback
from drainer.storage.limits import Limits
from tests.helpers import schema_at

LEASE = timedelta(minutes=5)
FIFO = Limits("fifo", per_group=1)

# What a release before migration 11 sends to cancel a job, to extend the lease of a
# cancelled claim whose handler runs on, and to let it go (its statements, verbatim).
OLD_CANCEL = """
UPDATE jobs
SET status = 'failed', last_error = 'cancelled', run_at = now(),
    locked_until = CASE WHEN status = 'running' AND locked_until > now()
                             AND locked_until < '9999-01-01' THEN locked_until END
WHERE status IN ('queued', 'running') AND id = ANY(%(ids)s::bigint[])
RETURNING id"""
OLD_HOLD = """
UPDATE jobs j
SET locked_until = coalesce(%(now)s, now()) + %(lease)s
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS t(id, attempts)
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = t.id AND j.attempts = t.attempts
  AND j.status = 'failed' AND j.locked_until IS NOT NULL
  AND j.locked_until < '9999-01-01'"""


def claimed(conn: psycopg.Connection) -> list[int]:
    return [j.id for j in roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)]


def head_and_next(conn: psycopg.Connection) -> tuple[Job, int]:
    """Group g's head claimed (running) and the job queued behind it."""
    drainer.enqueue(conn, "fifo", {}, group="g")
    behind = drainer.enqueue(conn, "fifo", {}, group="g")
    [head] = roundtrip.claim(conn, [], 10, LEASE, limited=[FIFO], take=10)
    return head, behind


def forms(conn: psycopg.Connection, job_id: int) -> tuple:
    """The row's status, and whether each form of the state holds: the column's end
    ahead (None without the column), the kept lease ahead."""
    column = conn.execute("SELECT 'cancelled_running_until' = ANY(array_agg(attname::text)) "
                          "FROM pg_attribute WHERE attrelid = 'jobs'::regclass").fetchone()[0]
    mark = "cancelled_running_until > now()" if column else "NULL::bool"
    return conn.execute(f"SELECT status, {mark}, locked_until > now() FROM jobs WHERE id = %s",
                        (job_id,)).fetchone()


def archived_now(conn: psycopg.Connection) -> int:
    """Archive every failed row, whatever its age, but for those in the state."""
    later = conn.execute("SELECT now() + interval '1 second'").fetchone()[0]
    return admin.archive(conn, timedelta(0), failed_older_than=timedelta(0), now=later)


def keeps_its_places(conn: psycopg.Connection, job: Job) -> None:
    """The job is cancelled_running for every statement that reads the state: the
    group's next job waits, requeue waits, archiving leaves it."""
    assert claimed(conn) == []
    assert admin.requeue(conn, ids=[job.id]).waiting.keys() == {job.id}
    assert archived_now(conn) == 0


def test_a_row_cancelled_in_the_old_form_is_backfilled_and_keeps_its_places(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        schema_at(conn, 10)
        head, behind = head_and_next(conn)
        assert conn.execute(OLD_CANCEL, {"ids": [head.id]}).fetchall() == [(head.id,)]
        [(lease_end,)] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s",
                                      (head.id,)).fetchall()
        assert forms(conn, head.id) == ("failed", None, True)
        keeps_its_places(conn, head)

        assert schema.migrate(conn)[0] == 11  # and any later ones
        assert conn.execute("SELECT cancelled_running_until FROM jobs WHERE id = %s",
                            (head.id,)).fetchone() == (lease_end,)
        assert forms(conn, head.id) == ("failed", True, True)
        keeps_its_places(conn, head)
        assert admin.due(conn, [], limited=[FIFO]).lease_end == lease_end
        assert writeback.end_cancelled(conn, [head]) == 1  # its handler ended
        assert forms(conn, head.id) == ("failed", None, None)
        assert claimed(conn) == [behind]


def test_a_job_another_producer_left_failed_with_a_lease_is_not_backfilled_past_it(
        empty_db_url):
    """Only a live, finite kept lease is the old form: an ended one, or one no time
    ends, is no mark, before the migration or after it."""
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        schema_at(conn, 10)
        ids = [drainer.enqueue(conn, "fifo", {}, group=g) for g in ("a", "b", "c")]
        for job_id, lease in zip(ids, ("now() - interval '1 second'", "'infinity'", "NULL"),
                                 strict=True):
            conn.execute(f"UPDATE jobs SET status = 'failed', locked_until = {lease} "
                         "WHERE id = %s", (job_id,))
        schema.migrate(conn)
        assert conn.execute("SELECT count(*) FROM jobs WHERE cancelled_running_until IS NOT NULL"
                            ).fetchone() == (0,)
        assert sorted(admin.requeue(conn, ids=ids)) == ids


def test_an_old_drainers_writes_are_read_as_cancelled_running(conn):
    """During a rolling deploy a drainer of an older release cancels a running job (the
    lease kept, no column set) and extends that lease while its handler runs: the new
    claim, requeue and archiving read it as cancelled running; the new heartbeat moves
    it to both forms, and end_cancelled frees it."""
    head, behind = head_and_next(conn)
    conn.execute(OLD_CANCEL, {"ids": [head.id]})
    assert forms(conn, head.id) == ("failed", None, True)
    keeps_its_places(conn, head)
    conn.execute(OLD_HOLD, {"ids": [head.id], "attempts": [head.attempts], "now": None,
                            "lease": timedelta(hours=1)})
    [(extended,)] = conn.execute("SELECT locked_until FROM jobs WHERE id = %s", (head.id,))
    assert admin.due(conn, [], limited=[FIFO]).lease_end == extended
    keeps_its_places(conn, head)

    assert writeback.extend_cancelled(conn, [head], LEASE) == 1
    assert forms(conn, head.id) == ("failed", True, True)
    assert writeback.end_cancelled(conn, [head]) == 1
    assert claimed(conn) == [behind]


def test_the_column_alone_keeps_the_places_until_its_time(conn):
    """A row with no lease kept, in the form the release after this one writes:
    cancelled_running_until alone keeps the job's places, until that time passes."""
    head, behind = head_and_next(conn)
    assert admin.cancel(conn, [head.id]) == [head.id]
    assert forms(conn, head.id) == ("failed", True, True)
    conn.execute("UPDATE jobs SET locked_until = NULL WHERE id = %s", (head.id,))
    keeps_its_places(conn, head)
    [(end,)] = conn.execute("SELECT cancelled_running_until FROM jobs WHERE id = %s",
                            (head.id,))
    assert admin.due(conn, [], limited=[FIFO]).lease_end == end
    assert writeback.extend_cancelled(conn, [head], LEASE) == 1
    conn.execute("UPDATE jobs SET locked_until = NULL, cancelled_running_until = now() "
                 "WHERE id = %s", (head.id,))  # its time passed
    assert claimed(conn) == [behind]
    assert writeback.extend_cancelled(conn, [head], LEASE) == 0  # ended: not revived


@pytest.mark.parametrize("version", [9, 10])
def test_a_schema_without_the_migration_keeps_working_as_before(empty_db_url, version):
    """At migration 10 the kept lease marks the state as before: cancel keeps it, the
    limits count it, the heartbeat extends it, end_cancelled frees it. At 9 (no index of
    them) a cancel frees the place in the limits at once, but requeue still waits for
    the handler. No statement names the column the schema lacks."""
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        schema_at(conn, version)
        head, behind = head_and_next(conn)
        assert admin.cancel(conn, [head.id]) == [head.id]
        assert forms(conn, head.id) == ("failed", None, True)
        assert admin.requeue(conn, ids=[head.id]).waiting.keys() == {head.id}
        assert archived_now(conn) == 0
        assert writeback.extend_cancelled(conn, [head], LEASE) == 1
        if version == 10:
            assert claimed(conn) == []
            assert writeback.end_cancelled(conn, [head]) == 1
            assert claimed(conn) == [behind]
        else:  # not counted: the next job starts at once
            assert claimed(conn) == [behind]
            assert writeback.end_cancelled(conn, [head]) == 1
        assert forms(conn, head.id) == ("failed", None, None)
        assert admin.requeue(conn, ids=[head.id]) == [head.id]
