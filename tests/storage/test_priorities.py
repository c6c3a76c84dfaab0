"""Priorities on a real PostgreSQL: higher first across the queues of one drain, then
oldest run_at; the claim's plan; jobs due later at a high priority neither hide ready
work nor slow the claim; a table without priorities still drains."""

import json
from datetime import UTC, datetime, timedelta

import psycopg

import drainer
from drainer.db import connect
from drainer.run import Options, drain
from drainer.storage import admin, claim, sql
from tests.helpers import HAND_MADE_TABLE, run_cli

LEASE = timedelta(minutes=5)
QUEUES = ["mail", "sms", "push"]


def test_a_high_priority_job_enqueued_last_is_among_the_first_claimed(conn):
    for name in QUEUES:
        drainer.enqueue_many(conn, name, ({"n": n} for n in range(10_000 // len(QUEUES))))
    urgent = drainer.enqueue(conn, "sms", {"urgent": True}, priority=100)
    later = drainer.enqueue(conn, "push", {"urgent": False}, priority=50)
    conn.execute("ANALYZE jobs")
    ran: list[int] = []
    options = Options(queues=QUEUES, batch_size=10)
    drain(conn, {q: lambda job: ran.append(job.id) for q in QUEUES}, options)
    assert ran[:2] == [urgent, later] and len(ran) == 3 * (10_000 // 3) + 2


def test_equal_priorities_keep_run_at_order_across_queues(conn):
    base = datetime(2024, 1, 1, tzinfo=UTC)
    at = {name: [base + timedelta(minutes=m) for m in range(i, 30, len(QUEUES))]
          for i, name in enumerate(QUEUES)}
    ids = {drainer.enqueue(conn, name, {}, run_at=t, priority=3): t
           for name, times in at.items() for t in times}
    low = drainer.enqueue(conn, "mail", {}, run_at=base - timedelta(days=1), priority=-1)
    claimed = [job.id for _ in range(4) for job in drainer.claim(conn, QUEUES, 8, LEASE)]
    assert claimed == [*sorted(ids, key=ids.__getitem__), low]


def claim_plan(conn: psycopg.Connection) -> list[str]:
    text = "EXPLAIN (COSTS OFF) " + claim.claim_sql(10, *claim.claim_kind(conn))
    return [r[0].strip() for r in conn.execute(
        text, {"queues": QUEUES, "lease": LEASE, "now": None})]


def test_the_claim_walks_the_priority_index_one_priority_at_a_time(conn):
    for p in (-5, 0, 5):
        for name in QUEUES:
            drainer.enqueue_many(conn, name, ({} for _ in range(2000)), priority=p)
    conn.execute("ANALYZE jobs")
    lines = claim_plan(conn)
    at = next(i for i, line in enumerate(lines) if "LockRows" in line)
    assert "Limit" in lines[at - 1]
    assert "Index Scan using jobs_priority_idx on jobs" in lines[at + 1]
    cond = next(line for line in lines[at + 2:] if line.startswith("Index Cond"))
    assert "priority = " in cond and "run_at <= " in cond  # stops at the first future run_at
    probes = [line for line in lines if "Index Only Scan using jobs_priority_idx" in line]
    plan = "\n".join(lines)
    assert probes and "Seq Scan on jobs" not in plan and "Recursive Union" in plan


def test_high_priority_jobs_due_later_neither_hide_ready_work_nor_next_due(conn):
    conn.execute("""INSERT INTO jobs (queue, payload, priority, run_at)
                    SELECT 'mail', '{}', 100, now() + interval '1 day'
                    FROM generate_series(1, 20000)""")
    ready = drainer.enqueue(conn, "mail", {}, priority=-100)
    soon = drainer.enqueue(conn, "mail", {}, priority=7, delay=3600)
    conn.execute("ANALYZE jobs")
    [job] = drainer.claim(conn, ["mail"], 10, LEASE)
    assert job.id == ready
    due = admin.due(conn, ["mail"])
    assert due.run_at == conn.execute("SELECT run_at FROM jobs WHERE id = %s",
                                      [soon]).fetchone()[0]


def test_priority_is_checked_and_shown_by_stats(conn, db_url):
    for bad in (101, -101, 1.5, True, "1"):
        try:
            drainer.enqueue(conn, "mail", {}, priority=bad)
        except drainer.BadInput as exc:
            assert "from -100 to 100" in str(exc)
        else:
            raise AssertionError(f"priority {bad!r} was accepted")
    drainer.enqueue_many(conn, "mail", [{}] * 3, priority=9)
    drainer.enqueue(conn, "mail", {})
    drainer.enqueue(conn, "plain", {})
    proc = run_cli("stats", "--json", "--database-url", db_url)
    assert json.loads(proc.stdout)["priorities"] == [
        {"queue": "mail", "priority": 9, "status": "queued", "jobs": 3},
        {"queue": "mail", "priority": 0, "status": "queued", "jobs": 1}]
    text = run_cli("stats", "--database-url", db_url).stdout
    assert "by priority" in text and "plain" not in text.split("by priority")[1]


def test_a_hand_made_table_drains_oldest_first_without_priorities(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
        assert not sql.features(conn).priority
        ids = [drainer.enqueue(conn, q, {}) for q in ("b", "a", "b")]
        ran: list[int] = []
        summary = drain(conn, {q: lambda job: ran.append(job.id) for q in "ab"},
                        Options(queues=["a", "b"]))
        assert (summary.done, ran) == (3, ids)
        assert admin.next_due(conn, ["a", "b"]) is None
        stats = json.loads(run_cli("stats", "--json", "--database-url", empty_db_url).stdout)
        assert stats["priorities"] is None


def test_doctor_names_a_missing_priority_index(conn, db_url):
    conn.execute("DROP INDEX jobs_priority_idx")
    proc = run_cli("doctor", "--json", "--database-url", db_url)
    [finding] = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "claim_plan"]
    assert "jobs_priority_idx is missing" in finding["summary"]
    assert "(queue, priority DESC, run_at)" in finding["advice"]


def test_a_drains_claim_keeps_one_generic_plan_that_still_walks_the_priorities(db_url):
    """On drainer's own connection the claim is prepared at its first run; the server
    plans the first five runs for their values, then keeps a generic plan: the claim
    writes now() instead of a parameter, so the generic plan's estimates are the custom
    ones' and it is not rejected as dearer (else every claim is planned again)."""
    with connect(db_url) as conn:
        for p in (-10, 10, 20, 30):
            drainer.enqueue_many(conn, "mail", ({} for _ in range(5000)), priority=p)
        conn.execute("ANALYZE jobs")
        for _ in range(8):
            assert len(drainer.claim(conn, ["mail"], 500, LEASE)) == 500
        plans = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                             "WHERE statement LIKE 'WITH next AS%'").fetchall()
        assert plans == [(3, 5)]
        text = claim.claim_sql(10, True).replace("%(queues)s", "$1").replace("%(lease)s", "$2")
        assert "%(" not in text
        conn.execute(f"PREPARE generic_claim(text[], interval) AS {text}")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        lines = [r[0].strip() for r in conn.execute(
            "EXPLAIN (COSTS OFF) EXECUTE generic_claim('{mail,sms,push}', '5 minutes')")]
    at = next(i for i, line in enumerate(lines) if "LockRows" in line)
    assert "Limit" in lines[at - 1]
    assert "Index Scan using jobs_priority_idx on jobs" in lines[at + 1]
    cond = next(line for line in lines[at + 2:] if line.startswith("Index Cond"))
    assert "priority = " in cond and "run_at <= now()" in cond
    assert "Seq Scan" not in "\n".join(lines) and "Recursive Union" in "\n".join(lines)


def test_a_claim_given_a_time_claims_what_is_due_by_then(conn):
    base = conn.execute("SELECT now()").fetchone()[0]
    due = drainer.enqueue(conn, "mail", {}, priority=1, run_at=base + timedelta(hours=1))
    later = drainer.enqueue(conn, "mail", {}, priority=2, run_at=base + timedelta(hours=3))
    assert drainer.claim(conn, ["mail"], 10, LEASE) == []
    [job] = drainer.claim(conn, ["mail"], 10, LEASE, now=base + timedelta(hours=2))
    assert job.id == due
    assert conn.execute("SELECT locked_until FROM jobs WHERE id = %s", [due]).fetchone()[0] == (
        base + timedelta(hours=2) + LEASE)
    assert later not in {j.id for j in drainer.claim(conn, ["mail"], 10, LEASE)}
