"""Failed jobs (cancelled ones too) leave `jobs` after a retention of their own, judged
by run_at (set when a job fails), in the same bounded batches as done
jobs; the command line, its variable and the drain all honour --archive-failed-after."""

import json
import re
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import drainer
from drainer import clock
from drainer.run import Options, drain
from drainer.storage import admin, limits, sql
from tests.helpers import HAND_MADE_TABLE, clean_env, count, run_cli, summary_of, wait_until

NOW = datetime(2030, 6, 30, 12, tzinfo=UTC)  # the database clock, as `now=` pretends
WEEK = timedelta(days=7)


def days_ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def add(conn: psycopg.Connection, status: str, *, run_at: datetime, created_at: datetime,
        **columns: object) -> int:
    """One row as another producer or an old drain may have left it; its id."""
    names = ["payload", "status", "run_at", "created_at", *columns]
    values = [json.dumps({"status": status}), status, run_at, created_at,
              *(json.dumps(v) if k in ("meta", "result") else v for k, v in columns.items())]
    return conn.execute(f"INSERT INTO jobs ({', '.join(names)}) VALUES "
                        f"({', '.join(['%s'] * len(names))}) RETURNING id", values).fetchone()[0]


def ids_in(conn: psycopg.Connection, table: str) -> list[int]:
    return [r[0] for r in conn.execute(f"SELECT id FROM {table} ORDER BY id")]


def as_json(conn: psycopg.Connection, table: str, job_id: int) -> dict:
    return conn.execute(f"SELECT to_jsonb(t) FROM {table} t WHERE id = %s", [job_id]).fetchone()[0]


def test_old_failed_rows_move_with_every_column_and_the_rest_stay(conn):
    old = add(conn, "failed", run_at=days_ago(31), created_at=days_ago(40), attempts=5,
              last_error="RuntimeError: boom", key="k-1", priority=7,
              meta={"tenant": "acme"}, result={"partial": [1, 2]})
    # Created long ago, but its last attempt was due 29 days ago: not old enough.
    young = add(conn, "failed", run_at=days_ago(29), created_at=days_ago(90))
    queued = add(conn, "queued", run_at=days_ago(90), created_at=days_ago(90))
    running = add(conn, "running", run_at=days_ago(90), created_at=days_ago(90))
    done_young = add(conn, "done", run_at=days_ago(3), created_at=days_ago(3))
    before = as_json(conn, "jobs", old)

    assert drainer.archive(conn, WEEK, now=NOW) == 1  # the default retention: 30 days

    assert ids_in(conn, "jobs") == [young, queued, running, done_young]
    assert ids_in(conn, "jobs_archive") == [old]
    archived = as_json(conn, "jobs_archive", old)
    assert archived.pop("archived_at")
    assert archived == {name: before[name] for name in archived}
    assert set(archived) >= {"id", "queue", "payload", "status", "run_at", "attempts",
                             "max_attempts", "last_error", "created_at", "key", "priority",
                             "meta", "result", "done_at"}
    assert (archived["status"], archived["last_error"], archived["key"], archived["priority"],
            archived["meta"], archived["result"], archived["payload"]) == (
        "failed", "RuntimeError: boom", "k-1", 7, {"tenant": "acme"}, {"partial": [1, 2]},
        {"status": "failed"})


def test_the_failed_retention_is_its_own(conn):
    failed = add(conn, "failed", run_at=days_ago(10), created_at=days_ago(10))
    done = add(conn, "done", run_at=days_ago(10), created_at=days_ago(10))
    assert drainer.archive(conn, WEEK, failed_older_than=timedelta(days=11), now=NOW) == 1
    assert ids_in(conn, "jobs_archive") == [done]
    assert drainer.archive(conn, timedelta(days=30), failed_older_than=timedelta(days=9),
                           now=NOW) == 1
    assert ids_in(conn, "jobs_archive") == [failed, done] and count(conn) == 0


def test_cancelled_jobs_leave_after_the_retention_too(conn):
    queued = drainer.enqueue(conn, "default", {"n": 1})
    running = drainer.enqueue(conn, "default", {"n": 2})
    drainer.claim(conn, ["default"], 1, timedelta(minutes=5))
    kept = drainer.enqueue(conn, "default", {"n": 3})
    assert drainer.cancel(conn, [queued, running]) == [queued, running]
    db_now = conn.execute("SELECT now()").fetchone()[0]

    assert drainer.archive(conn, WEEK, now=db_now + timedelta(days=29)) == 0
    assert count(conn) == 3
    assert drainer.archive(conn, WEEK, now=db_now + timedelta(days=31)) == 2
    assert ids_in(conn, "jobs") == [kept]
    assert conn.execute("SELECT id, status, last_error FROM jobs_archive ORDER BY id"
                        ).fetchall() == [(queued, "failed", "cancelled"),
                                         (running, "failed", "cancelled")]


def test_batches_are_bounded_and_take_done_and_failed_rows_alike(conn, monkeypatch):
    done = [add(conn, "done", run_at=days_ago(9), created_at=days_ago(9)) for _ in range(6)]
    failed = [add(conn, "failed", run_at=days_ago(40), created_at=days_ago(40))
              for _ in range(4)]
    young = add(conn, "failed", run_at=days_ago(1), created_at=days_ago(40))
    moved: list[int] = []
    original = sql.run
    sql.features(conn)  # what the schema has: read once per connection, as a drain does

    def spy(c, name, params=None):
        cursor = original(c, name, params)
        assert name == "archive_move"
        moved.append(cursor.rowcount)
        return cursor

    monkeypatch.setattr(sql, "run", spy)
    assert drainer.archive(conn, WEEK, batch=3, now=NOW) == 10
    monkeypatch.undo()
    assert moved == [3, 3, 3, 1]  # stops on the short batch
    assert ids_in(conn, "jobs_archive") == done + failed
    assert ids_in(conn, "jobs") == [young]


def blocked_on_a_lock(conn: psycopg.Connection, pid: int) -> bool:
    return conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                        [pid]).fetchone()[0]


@pytest.mark.parametrize("to_table", [True, False])
def test_a_job_requeued_while_the_archive_picks_it_stays(conn, db_url, to_table):
    """The statement reads its rows, then deletes them: a failed job requeued in between
    (the requeue commits while the delete waits for its row) is queued again, and the
    delete must leave it, not archive a job that is about to run."""
    if not to_table:
        conn.execute("DROP TABLE jobs_archive")
    job = add(conn, "failed", run_at=days_ago(40), created_at=days_ago(40))
    with psycopg.connect(db_url) as requeuer, psycopg.connect(db_url,
                                                             autocommit=True) as archiver:
        assert drainer.requeue(requeuer, ids=[job]) == [job]  # not committed yet
        moved: list[int] = []
        archiving = threading.Thread(target=lambda: moved.append(
            drainer.archive(archiver, WEEK, to_table=to_table, now=NOW)))
        archiving.start()
        wait_until(lambda: blocked_on_a_lock(conn, archiver.info.backend_pid))
        requeuer.commit()
        archiving.join(timeout=30)
    assert moved == [0]
    assert conn.execute("SELECT id, status FROM jobs").fetchall() == [(job, "queued")]


def test_without_the_archive_table_old_rows_are_deleted(conn):
    conn.execute("DROP TABLE jobs_archive")
    old = add(conn, "failed", run_at=days_ago(31), created_at=days_ago(31))
    young = add(conn, "failed", run_at=days_ago(2), created_at=days_ago(31))
    add(conn, "done", run_at=days_ago(8), created_at=days_ago(8))
    assert not admin.has_archive(conn)
    assert drainer.archive(conn, WEEK, batch=1, to_table=False, now=NOW) == 2
    assert ids_in(conn, "jobs") == [young] and old != young


def test_a_hand_made_table_without_the_indexes_is_scanned(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
        old = add(conn, "failed", run_at=days_ago(31), created_at=days_ago(31))
        young = add(conn, "failed", run_at=days_ago(2), created_at=days_ago(31))
        plan = explain(conn, "archive_delete")
        assert "jobs_failed_idx" not in plan and "Seq Scan on jobs" in plan
        assert drainer.archive(conn, WEEK, to_table=admin.has_archive(conn), now=NOW) == 1
        assert ids_in(conn, "jobs") == [young] and old != young


def explain(conn: psycopg.Connection, name: str) -> str:
    params = {"older_than": WEEK, "failed_older_than": timedelta(days=30), "limit": 10_000,
              "now": None}
    text = sql.variant(name, **limits.swaps(sql.features(conn)))  # as this schema has it
    return "\n".join(r[0] for r in conn.execute(f"EXPLAIN (COSTS OFF) {text}", params))


@pytest.mark.parametrize("name", ["archive_move", "archive_delete"])
def test_each_part_of_the_statement_reads_its_partial_index(conn, name):
    """200,000 done and queued rows: the done rows are found through jobs_done_idx, the
    failed ones through jobs_failed_idx, the rows to delete through the primary key; no
    part reads the whole table."""
    conn.execute("""
        INSERT INTO jobs (payload, status, created_at, run_at)
        SELECT '{}', CASE WHEN i % 2 = 0 THEN 'done' ELSE 'queued' END,
               now() - (i % 10) * interval '1 day', now() - (i % 10) * interval '1 day'
        FROM generate_series(1, 200000) AS i""")
    conn.execute("""
        INSERT INTO jobs (payload, status, created_at, run_at)
        SELECT '{}', 'failed', now() - interval '90 days', now() - (i % 60) * interval '1 day'
        FROM generate_series(1, 2000) AS i""")
    conn.execute("ANALYZE jobs")
    plan = explain(conn, name)
    assert re.search(r"(Bitmap Index Scan on|Index Scan using) jobs_done_idx", plan), plan
    assert re.search(r"(Bitmap Index Scan on|Index Scan using) jobs_failed_idx", plan), plan
    assert re.search(r"Index Scan using jobs_pkey on jobs\b", plan), plan
    assert "Seq Scan" not in plan, plan


def test_a_drain_archives_failed_jobs_after_its_retention(conn, monkeypatch):
    failed = add(conn, "failed", run_at=days_ago(10), created_at=days_ago(10))
    kept = add(conn, "failed", run_at=days_ago(4), created_at=days_ago(10))
    monkeypatch.setattr(clock, "database_now", lambda: NOW)
    summary = drain(conn, {"default": lambda job: None},
                    Options(queues=["default"], archive_failed_after=timedelta(days=5)))
    assert summary.archived == 1
    assert ids_in(conn, "jobs_archive") == [failed] and ids_in(conn, "jobs") == [kept]


def test_the_command_line_honours_archive_failed_after(db_url):
    today = datetime.now(UTC)  # a process's drain: the database's own clock
    with psycopg.connect(db_url, autocommit=True) as conn:
        ten = add(conn, "failed", run_at=today - timedelta(days=10), created_at=today)
        three = add(conn, "failed", run_at=today - timedelta(days=3), created_at=today)
    url = ["--database-url", db_url]
    assert json.loads(run_cli("archive", *url).stdout) == {"archived": 0}  # 30 days
    result = run_cli("archive", "--archive-failed-after", "5", *url)
    assert json.loads(result.stdout) == {"archived": 1}, result.stderr
    result = run_cli("drain", "--tasks", "noop", *url,
                     env=clean_env(DRAINER_ARCHIVE_FAILED_AFTER="2.5"))
    assert summary_of(result.stdout)["archived"] == 1, result.stderr
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert ids_in(conn, "jobs_archive") == [ten, three] and count(conn) == 0


@pytest.mark.parametrize("args, env", [
    (["archive", "--archive-failed-after", "-1"], {}),
    (["archive", "--archive-failed-after", "soon"], {}),
    (["drain", "--tasks", "noop", "--archive-failed-after", "40000"], {}),
    (["archive"], {"DRAINER_ARCHIVE_FAILED_AFTER": "soon"}),
    (["work", "--tasks", "noop"], {"DRAINER_ARCHIVE_FAILED_AFTER": "-3"}),
])
def test_a_bad_retention_is_a_clear_error(db_url, args, env):
    with psycopg.connect(db_url, autocommit=True) as conn:
        add(conn, "failed", run_at=days_ago(3000), created_at=days_ago(3000))
    result = run_cli(*args, "--database-url", db_url, env=clean_env(**env))
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("drainer: error: ") and "number of days" in lines[0]
    if env:
        assert "DRAINER_ARCHIVE_FAILED_AFTER" in lines[0]
    else:
        assert "--archive-failed-after" in lines[0]
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert count(conn) == 1  # nothing was archived


# --- archiving failed jobs: their retention starts when they fail -------------------


def test_a_job_that_waited_past_the_retention_is_not_archived_as_it_fails(conn):
    """A job due 40 days ago (a backlog, a job enqueued for a date past) that fails now
    must stay for the failed retention (30 days), not leave `jobs` in the same drain;
    without the archive table it would be deleted then."""
    job_id = drainer.enqueue(conn, "late", {}, run_at=datetime.now(UTC) - timedelta(days=40),
                             max_attempts=1)

    def handler(job):
        raise RuntimeError("boom")

    summary = drain(conn, {"late": handler}, Options(["late"]))
    assert (summary.failed, summary.archived) == (1, 0)
    assert count(conn, f"id = {job_id} AND status = 'failed'") == 1


def test_a_job_cancelled_after_waiting_past_the_retention_stays_for_it(conn):
    job_id = drainer.enqueue(conn, "late", {}, run_at=datetime.now(UTC) - timedelta(days=40))
    assert drainer.cancel(conn, [job_id]) == [job_id]
    assert drainer.archive(conn, timedelta(days=7)) == 0
    assert count(conn, f"id = {job_id} AND last_error = 'cancelled'") == 1


def test_a_lease_failed_for_good_by_the_reaper_stays_for_the_retention(conn):
    conn.execute("INSERT INTO jobs (payload, status, attempts, max_attempts, run_at, "
                 "locked_until) VALUES ('{}', 'running', 5, 5, now() - interval '40 days', "
                 "now() - interval '1 minute')")
    assert drainer.reap(conn) == 1
    assert drainer.archive(conn, timedelta(days=7)) == 0
    assert count(conn, "status = 'failed'") == 1
