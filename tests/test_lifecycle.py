"""The seed's lifecycle statements on a real PostgreSQL: claim, complete, fail, extend,
reap, release, archive, next_due, enqueue."""

import re
from datetime import datetime, timedelta

import psycopg
import pytest

import drainer
from drainer import model
from drainer.run import Options, drain
from drainer.storage import admin, claim, sql
from tests.helpers import count

LEASE = timedelta(minutes=5)


def one(conn: psycopg.Connection, sql: str, *params):
    return conn.execute(sql, params).fetchone()


def test_claim_takes_oldest_ready_first_and_sets_the_lease(conn, db_url):
    late = drainer.enqueue(conn, "default", {"n": "late"})
    long_ago = datetime(2020, 1, 1).astimezone()
    early = drainer.enqueue(conn, "default", {"n": "early"}, run_at=long_ago)
    drainer.enqueue(conn, "default", {"n": "future"}, delay=3600)
    drainer.enqueue(conn, "elsewhere", {"n": "other queue"})

    jobs = drainer.claim(conn, ["default"], 10, LEASE)

    assert [j.id for j in jobs] == [early, late]
    assert all(j.attempts == 1 for j in jobs)
    lease_left = one(conn, "SELECT locked_until - now() FROM jobs WHERE id = %s", early)[0]
    assert timedelta(minutes=4) < lease_left <= LEASE
    assert count(conn, "status = 'running'") == 2
    # Committed at once: another session already sees the claim (it would see the
    # rows still queued were the claim's transaction left open).
    with psycopg.connect(db_url, autocommit=True) as other:
        assert other.execute("SELECT id, status, attempts FROM jobs WHERE status = 'running' "
                             "ORDER BY id").fetchall() == sorted([(early, "running", 1),
                                                                  (late, "running", 1)])


def test_claim_respects_the_limit_and_several_queues(conn):
    for q in ["a", "b", "a", "b", "c"]:
        drainer.enqueue(conn, q, {})
    assert len(drainer.claim(conn, ["a", "b"], 3, LEASE)) == 3
    assert len(drainer.claim(conn, ["a", "b"], 3, LEASE)) == 1
    assert {j.queue for j in drainer.claim(conn, ["c"], 3, LEASE)} == {"c"}


def test_complete_is_guarded_by_attempts(conn):
    drainer.enqueue(conn, "default", {})
    [job] = drainer.claim(conn, ["default"], 1, LEASE)
    assert drainer.complete(conn, [job]) == {job.id}
    assert one(conn, "SELECT status, locked_until FROM jobs")== ("done", None)
    assert drainer.complete(conn, [job]) == set()  # already done: no longer running

    # Running again under a later claim: the same id and status, another attempt.
    later = drainer.enqueue(conn, "default", {})
    [old] = drainer.claim(conn, ["default"], 1, LEASE)
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second' WHERE id = %s",
                 (later,))
    assert drainer.reap(conn) == 1
    [new] = drainer.claim(conn, ["default"], 1, LEASE)
    assert (new.id, new.attempts) == (old.id, old.attempts + 1)
    assert drainer.complete(conn, [old]) == set()
    assert one(conn, "SELECT status, attempts FROM jobs WHERE id = %s", later) == (
        "running", new.attempts)
    assert drainer.complete(conn, [new]) == {later}


def test_backoff_schedule_then_failed(conn):
    drainer.enqueue(conn, "default", {})
    waits = []
    for _ in range(5):
        conn.execute("UPDATE jobs SET run_at = now()")  # skip the wait
        [job] = drainer.claim(conn, ["default"], 1, LEASE)
        assert drainer.fail(conn, [(job, "SMTP 451: try again later")])
        status, wait, error = one(
            conn, "SELECT status, run_at - now(), last_error FROM jobs")
        waits.append((status, round(wait.total_seconds())))
        assert error == "SMTP 451: try again later"
    # Failed for good, the job keeps the run_at of its last attempt (archiving judges
    # a failed job's age by it).
    assert waits == [("queued", 20), ("queued", 40), ("queued", 80), ("queued", 160),
                     ("failed", 0)]


def test_backoff_is_capped_at_one_hour(conn):
    drainer.enqueue(conn, "default", {}, max_attempts=20)
    conn.execute("UPDATE jobs SET attempts = 11")
    [job] = drainer.claim(conn, ["default"], 1, LEASE)
    assert drainer.fail(conn, [(job, "x")]) == {job.id: "queued"}
    wait = one(conn, "SELECT run_at - now() FROM jobs")[0]
    assert round(wait.total_seconds()) == 3600


def test_stale_completion_after_takeover_changes_nothing(conn):
    drainer.enqueue(conn, "default", {})
    [slow] = drainer.claim(conn, ["default"], 1, LEASE)
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 minute'")
    assert drainer.reap(conn) == 1
    [current] = drainer.claim(conn, ["default"], 1, LEASE)
    assert current.attempts == 2

    assert drainer.complete(conn, [slow]) == set()  # not ours
    assert drainer.fail(conn, [(slow, "late failure")]) == {}
    assert drainer.extend(conn, [slow], LEASE) == set()
    assert drainer.release(conn, [slow]) == set()
    assert one(conn, "SELECT status, attempts FROM jobs") == ("running", 2)
    assert drainer.complete(conn, [current]) == {current.id}


def test_reaper_requeues_expired_leases_and_fails_at_max_attempts(conn):
    a = drainer.enqueue(conn, "q1", {})
    b = drainer.enqueue(conn, "q2", {}, max_attempts=1)
    c = drainer.enqueue(conn, "q3", {})
    drainer.claim(conn, ["q1", "q2", "q3"], 10, LEASE)
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second' WHERE id <> %s",
                 (c,))

    assert drainer.reap(conn) == 2  # every queue, not only drained ones
    rows = dict((i, (s, e)) for i, s, e in conn.execute(
        "SELECT id, status, last_error FROM jobs"))
    assert rows[a] == ("queued", "lease expired")
    assert rows[b] == ("failed", "lease expired")
    assert rows[c] == ("running", None)


def test_reaper_keeps_an_earlier_error(conn):
    drainer.enqueue(conn, "default", {})
    [job] = drainer.claim(conn, ["default"], 1, LEASE)
    drainer.fail(conn, [(job, "first failure")])
    conn.execute("UPDATE jobs SET run_at = now()")
    drainer.claim(conn, ["default"], 1, LEASE)
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second'")
    drainer.reap(conn)
    assert one(conn, "SELECT last_error FROM jobs")[0] == "first failure"


def test_injected_now_drives_the_reaper_without_backdating(conn):
    drainer.enqueue(conn, "default", {})
    drainer.claim(conn, ["default"], 1, LEASE)
    assert drainer.reap(conn) == 0
    later = one(conn, "SELECT now() + interval '6 minutes'")[0]
    assert drainer.reap(conn, now=later) == 1


def test_extend_pushes_the_lease(conn):
    drainer.enqueue(conn, "default", {})
    [job] = drainer.claim(conn, ["default"], 1, timedelta(seconds=30))
    assert drainer.extend(conn, [job], timedelta(minutes=10)) == {job.id}
    left = one(conn, "SELECT locked_until - now() FROM jobs")[0]
    assert left > timedelta(minutes=9)


def test_release_gives_the_attempt_back(conn):
    drainer.enqueue(conn, "default", {})
    [job] = drainer.claim(conn, ["default"], 1, LEASE)
    assert drainer.release(conn, [job]) == {job.id}
    assert one(conn, "SELECT status, attempts, locked_until FROM jobs") == ("queued", 0, None)


def test_archive_moves_only_old_done_rows_in_bounded_batches(conn, monkeypatch):
    conn.execute("""
        INSERT INTO jobs (payload, status, created_at)
        SELECT '{}', s, now() - make_interval(days => d)
        FROM (VALUES ('done', 8), ('done', 8), ('done', 8), ('done', 8), ('done', 8),
                     ('failed', 8), ('queued', 8), ('done', 1)) AS t(s, d)""")
    statements = []
    original = sql.run
    sql.features(conn)  # what the schema has: read once per connection, as a drain does

    def spy(c, name, params=None):
        statements.append(name)
        return original(c, name, params)

    monkeypatch.setattr(sql, "run", spy)
    moved = drainer.archive(conn, timedelta(days=7), batch=2)
    monkeypatch.undo()
    assert moved == 5
    assert statements == ["archive_move"] * 3  # 2 + 2 + 1: stops on the short batch
    assert count(conn) == 3
    assert sorted(r[0] for r in conn.execute("SELECT status FROM jobs")) == [
        "done", "failed", "queued"]
    assert conn.execute("SELECT count(*) FROM jobs_archive").fetchone()[0] == 5


def test_archive_deletes_when_there_is_no_archive_table(conn):
    conn.execute("DROP TABLE jobs_archive")
    conn.execute("INSERT INTO jobs (payload, status, created_at) "
                 "VALUES ('{}', 'done', now() - interval '8 days')")
    assert drainer.archive(conn, timedelta(days=7), to_table=admin.has_archive(conn)) == 1
    assert count(conn) == 0


def test_next_due(conn):
    assert drainer.next_due(conn, ["default"]) is None
    drainer.enqueue(conn, "default", {}, delay=600)
    drainer.enqueue(conn, "elsewhere", {})
    due = drainer.next_due(conn, ["default"])
    in_ten = one(conn, "SELECT now() + interval '10 minutes'")[0]
    assert abs(due - in_ten) < timedelta(seconds=5)
    drainer.enqueue(conn, "default", {}, max_attempts=3)
    drainer.claim(conn, ["default"], 1, timedelta(seconds=60))
    lease_end = one(conn, "SELECT locked_until FROM jobs WHERE status = 'running'")[0]
    assert drainer.next_due(conn, ["default"]) == lease_end
    drainer.enqueue(conn, "default", {})
    now = one(conn, "SELECT now()")[0]
    assert drainer.next_due(conn, ["default"], now=now) == now  # ready work: the current time


def sources(due: model.Due) -> tuple:
    return due.next_due, due.run_at, due.lease_end


def test_due_tells_a_queued_run_at_from_a_lease_end(conn):
    assert sources(admin.due(conn, ["default"])) == (None, None, None)
    drainer.enqueue(conn, "default", {}, delay=600)
    run_at = one(conn, "SELECT run_at FROM jobs")[0]
    assert sources(admin.due(conn, ["default"])) == (run_at, run_at, None)
    drainer.enqueue(conn, "default", {})
    drainer.claim(conn, ["default"], 1, timedelta(seconds=60))
    lease_end = one(conn, "SELECT locked_until FROM jobs WHERE status = 'running'")[0]
    assert sources(admin.due(conn, ["default"])) == (lease_end, run_at, lease_end)
    later = run_at + timedelta(hours=1)  # both past: next_due is the current time
    assert sources(admin.due(conn, ["default"], now=later)) == (later, run_at, lease_end)
    assert sources(admin.due(conn, ["elsewhere"])) == (None, None, None)


def test_enqueue_rolls_back_with_the_callers_transaction(conn):
    with pytest.raises(RuntimeError), conn.transaction():
        drainer.enqueue(conn, "default", {"order": 1})
        raise RuntimeError("the caller's work failed")
    assert count(conn) == 0
    with conn.transaction():
        drainer.enqueue(conn, "default", {"order": 2})
    assert count(conn) == 1


def test_enqueue_options(conn):
    job = drainer.enqueue(conn, "default", {"x": [1, "é"]}, max_attempts=2,
                          delay=timedelta(seconds=90))
    payload, attempts, wait = one(
        conn, "SELECT payload, max_attempts, run_at - now() FROM jobs WHERE id = %s", job)
    assert payload == {"x": [1, "é"]} and attempts == 2
    assert timedelta(seconds=85) < wait <= timedelta(seconds=90)
    with pytest.raises(drainer.BadInput):
        drainer.enqueue(conn, "default", {}, delay=1, run_at=datetime.now().astimezone())


@pytest.mark.parametrize("payload", [{"s": "a\x00b"}, float("nan"), {1j: 2}, object()])
def test_enqueue_refuses_what_jsonb_cannot_store(conn, payload):
    with pytest.raises(drainer.BadInput):
        drainer.enqueue(conn, "default", payload)
    assert count(conn) == 0


@pytest.mark.parametrize("name", ["", "x" * 201, "a\x00b"])
def test_enqueue_refuses_bad_queue_names(conn, name):
    with pytest.raises(drainer.BadInput):
        drainer.enqueue(conn, name, {})


def test_bulk_enqueue_of_100k_rows(conn):
    n = drainer.enqueue_many(conn, "bulk", ({"i": i} for i in range(100_000)), delay=60)
    assert n == 100_000
    assert count(conn, "queue = 'bulk' AND run_at > now() + interval '50 seconds'") == 100_000
    assert one(conn, "SELECT count(DISTINCT payload->>'i') FROM jobs")[0] == 100_000


def test_bulk_enqueue_is_all_or_nothing(conn):
    payloads = [{"i": 1}, {"i": 2}, {"bad": "\x00"}, {"i": 4}]
    with pytest.raises(drainer.BadInput, match="payload 3"):
        drainer.enqueue_many(conn, "bulk", payloads)
    assert count(conn) == 0


def test_claim_plan_uses_the_partial_index(conn):
    drainer.enqueue_many(conn, "default", ({"i": i} for i in range(5000)))
    drainer.enqueue_many(conn, "other", ({"i": i} for i in range(5000)))
    conn.execute("ANALYZE jobs")
    plan = "\n".join(r[0] for r in conn.execute(
        "EXPLAIN (COSTS OFF) " + claim.claim_sql(10, *claim.claim_kind(conn)),
        {"queues": ["default"], "lease": LEASE, "now": None}))
    lines = [line.strip() for line in plan.splitlines()]
    at = next(i for i, line in enumerate(lines) if "LockRows" in line)
    assert "Limit" in lines[at - 1]
    # Every job at priority 0: the walk over priorities may take either ready index.
    assert re.search(r"Index Scan using jobs_(ready|priority)_idx on jobs", lines[at + 1])
    assert "Seq Scan on jobs" not in plan


def test_a_drain_sees_an_archive_table_created_since_its_connection_last_drained(conn, db_url):
    """What the schema has is learned once per connection, but read again at each
    drain's start: an always-on worker must not delete done rows because the archive
    table was missing when it connected."""
    conn.execute("DROP TABLE jobs_archive")
    options = Options(queues=["default"], archive_after=timedelta(0))
    drainer.enqueue(conn, "default", {"n": 1})
    drain(conn, {"default": lambda job: None}, options)
    assert count(conn) == 0 and not admin.has_archive(conn)
    with psycopg.connect(db_url, autocommit=True) as owner:  # another session's migration
        owner.execute(sql.MIGRATIONS[3])  # the archive table's
    drainer.enqueue(conn, "default", {"n": 2})
    drain(conn, {"default": lambda job: None}, options)
    assert count(conn) == 0
    assert conn.execute("SELECT payload FROM jobs_archive").fetchall() == [({"n": 2},)]


def test_a_heartbeat_does_not_fire_a_users_status_trigger(conn):
    """A heartbeat sets locked_until only: a user's `AFTER UPDATE OF status` trigger
    (an audit log of status changes) must not fire every lease/3."""
    conn.execute("""
        CREATE TABLE status_log (job_id bigint, old text, new text);
        CREATE FUNCTION log_status() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO status_log VALUES (NEW.id, OLD.status, NEW.status); RETURN NULL; END $$;
        CREATE TRIGGER log_status AFTER UPDATE OF status ON jobs
        FOR EACH ROW EXECUTE FUNCTION log_status();""")
    drainer.enqueue(conn, "q", {})
    [job] = drainer.claim(conn, ["q"], 1, timedelta(minutes=5))
    conn.execute("DELETE FROM status_log")
    assert drainer.extend(conn, [job], timedelta(minutes=5)) == {job.id}
    assert conn.execute("SELECT count(*) FROM status_log").fetchone()[0] == 0
