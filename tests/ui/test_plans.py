"""No statement of the dashboard reads the whole table: on a table of 1,000,000 jobs
(mostly done, as a busy queue's table is between archivings), each page's statements
are run under EXPLAIN ANALYZE, and none scans `jobs` sequentially or reads more than a
tenth of its rows."""

import json

import psycopg
import pytest

from drainer.storage import sql
from drainer.storage.limits import swaps
from drainer.storage.schema import migrate
from drainer.ui import reads

ROWS = 1_000_000
MOST = ROWS // 10  # rows a statement may read at most


@pytest.fixture(scope="module")
def big_url(server):
    """A migrated database of its own with 1,000,000 jobs in 8 queues: 1% failed (20
    errors), 1% queued (half not due yet), 0.1% running, the rest done."""
    name = server.create_database()
    url = server.url(name)
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        conn.execute("""
            INSERT INTO jobs (queue, payload, status, run_at, attempts, last_error,
                              locked_until, created_at, done_at, key, meta)
            SELECT 'q' || (i % 8), jsonb_build_object('n', i), s.status,
                   now() + CASE WHEN s.status = 'queued' AND i % 2 = 0
                                THEN interval '1 day' ELSE interval '0' END
                         - make_interval(secs => (ROWS - i) / 10.0),
                   1, CASE WHEN s.status = 'failed' THEN 'Error ' || (i % 20) END,
                   CASE WHEN s.status = 'running' THEN now() + interval '1 minute' END,
                   now() - make_interval(secs => (ROWS - i) / 10.0),
                   CASE WHEN s.status = 'done'
                        THEN now() - make_interval(secs => (ROWS - i) / 10.0) END,
                   'k' || i, jsonb_build_object('group', 'g' || (i % 50))
            FROM generate_series(1, ROWS) AS i
            CROSS JOIN LATERAL (SELECT CASE WHEN i % 100 = 0 THEN 'failed'
                                            WHEN i % 100 = 1 THEN 'queued'
                                            WHEN i % 1000 = 2 THEN 'running'
                                            ELSE 'done' END AS status) AS s
        """.replace("ROWS", str(ROWS)))
        conn.execute("INSERT INTO drainer_limits (queue, concurrency) VALUES ('q1', 5)")
        conn.execute("VACUUM ANALYZE jobs")
    yield url
    server.drop_database(name)


def scans(plan: dict) -> list[tuple[str, str, float]]:
    """(node type, relation, rows it read) of each scan node of `plan` on a table."""
    found = []
    if "Relation Name" in plan:
        read = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0) + plan.get(
            "Rows Removed by Index Recheck", 0)
        found.append((plan["Node Type"], plan["Relation Name"], read * plan.get("Actual Loops", 1)))
    for child in plan.get("Plans", []):
        found += scans(child)
    return found


def explained(conn: psycopg.Connection, text: str, params: dict) -> list[tuple[str, str, float]]:
    [[plan]] = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}", params).fetchone()
    return scans(plan["Plan"])


JOBS = {"status": None, "cancelled": None, "queue": None, "key": None, "error": None,
        "before": None, "cap": reads.CAP, "limit": reads.PAGE + 1, "now": None}
STATEMENTS = [
    ("ui_queues", {"cap": reads.CAP}),
    ("ui_failed_groups", {"cap": reads.CAP, "groups": reads.GROUPS}),
    ("ui_failed_group", {"cap": reads.CAP, "queue": "q0", "error": "Error 0"}),
    ("ui_jobs", JOBS),
    ("ui_jobs", {**JOBS, "before": 1000}),
    ("ui_jobs", {**JOBS, "status": "failed", "cancelled": False}),
    ("ui_jobs", {**JOBS, "status": "failed", "cancelled": True}),
    ("ui_jobs", {**JOBS, "status": "queued", "queue": "q3"}),
    ("ui_jobs", {**JOBS, "status": "running"}),
    ("ui_jobs", {**JOBS, "status": "done", "before": 500_000}),
    ("ui_jobs", {**JOBS, "error": "no such error", "key": "k1"}),
    ("ui_job_state", {"id": 500_000, "now": None}),
    ("show_job", {"id": 500_000}),
    ("schedules_list", {}),
    ("next_due", {"queues": [], "known": ["q0"], "now": None}),  # the queues with no task
    ("doctor_jobs", {}),
]


@pytest.mark.parametrize(("name", "params"), STATEMENTS,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(STATEMENTS)])
def test_no_page_reads_the_whole_table(big_url, name, params):
    with psycopg.connect(big_url, autocommit=True) as conn:
        found = explained(conn, sql.QUERIES[name], params)
    on_jobs = [(kind, rows) for kind, table, rows in found if table == "jobs"]
    assert not [kind for kind, _ in on_jobs if kind == "Seq Scan"], on_jobs
    assert sum(rows for _, rows in on_jobs) <= MOST, json.dumps(on_jobs)


def test_the_limits_fill_reads_no_whole_table(big_url):
    with psycopg.connect(big_url, autocommit=True) as conn:
        text = sql.variant("stats_limits", **swaps(sql.features(conn)))
        found = explained(conn, text, {"now": None})
    assert not [f for f in found if f[0] == "Seq Scan" and f[1] == "jobs"], found
    assert sum(rows for _, table, rows in found if table == "jobs") <= MOST
