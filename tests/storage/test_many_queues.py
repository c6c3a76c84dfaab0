"""A claim of many queues on a real PostgreSQL: it locks no more rows than a claim of
one queue however many queues it names, takes the same jobs in the same order, is
never compiled by JIT, and still takes a batch when other claims hold a queue's rows.
Counted from the plans auto_explain reports (rows locked, JIT), never timed."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import drainer
from drainer.storage import roundtrip
from tests.helpers import HAND_MADE_TABLE

LEASE = timedelta(minutes=5)
BATCH = 50
QUEUES = [f"q{n:03d}" for n in range(200)]


@contextmanager
def plans(conn: psycopg.Connection) -> Iterator[list[dict[str, Any]]]:
    """The plans (JSON, with their actual rows) of the statements `conn` runs within,
    as auto_explain reports them to the client."""
    found: list[dict[str, Any]] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if "plan:" in text:
            found.append(json.loads(text.split("plan:", 1)[1]))

    conn.execute("LOAD 'auto_explain'")
    for setting in ("log_analyze = on", "log_timing = off", "log_format = json",
                    "log_level = notice", "log_min_duration = 0"):
        conn.execute(f"SET auto_explain.{setting}")
    conn.add_notice_handler(heard)
    try:
        yield found
    finally:
        conn.remove_notice_handler(heard)
        conn.execute("SET auto_explain.log_min_duration = -1")


def locked(node: dict[str, Any]) -> int:
    """Rows the plan's LockRows nodes locked (FOR UPDATE SKIP LOCKED)."""
    own = node["Actual Rows"] * node["Actual Loops"] if node["Node Type"] == "LockRows" else 0
    return own + sum(locked(child) for child in node.get("Plans", []))


def claim(conn: psycopg.Connection, queues: list[str]) -> tuple[list[int], int]:
    """The ids a claim of BATCH took, and the rows its statement locked."""
    with plans(conn) as seen:
        jobs = roundtrip.claim(conn, queues, BATCH, LEASE)
    return [job.id for job in jobs], sum(locked(p["Plan"]) for p in seen)


def spread(conn: psycopg.Connection) -> None:
    """2,000 jobs over the 200 QUEUES, enqueued together (one run_at), analyzed."""
    conn.execute("INSERT INTO jobs (queue, payload) SELECT (%s::text[])[1 + g %% 200], '{}' "
                 "FROM generate_series(0, 1999) AS g", [QUEUES])
    conn.execute("ANALYZE jobs")


@pytest.fixture(params=["migrated", "hand-made"])
def table(request: pytest.FixtureRequest) -> psycopg.Connection:
    """A connection to the migrated schema (the claim by priority) or to the classic
    table alone (the claim oldest first), holding 2,000 jobs in one queue and 2,000
    spread over 200 queues."""
    conn: psycopg.Connection = request.getfixturevalue("conn")
    if request.param == "hand-made":
        url = request.getfixturevalue("empty_db_url")
        conn = psycopg.connect(url, autocommit=True)
        request.addfinalizer(conn.close)
        conn.execute(HAND_MADE_TABLE, prepare=False)
    conn.execute("INSERT INTO jobs (queue, payload) SELECT 'solo', '{}' "
                 "FROM generate_series(1, 2000)")
    spread(conn)
    return conn


def test_a_claim_of_many_queues_locks_no_more_rows_than_a_claim_of_one(table):
    """Each of 200 queues locked its first rows up to a whole batch, 2,000 rows for a
    batch of 50 (a claim of 1,000 queues of 20 jobs: 20,000 at each claim); each now
    locks its share of the batch, and the batch is the same: the oldest jobs of all
    the queues, in order."""
    one, one_locked = claim(table, ["solo"])
    many, many_locked = claim(table, QUEUES)
    oldest = [row[0] for row in table.execute(
        "SELECT id FROM jobs WHERE queue <> 'solo' ORDER BY run_at, id LIMIT %s", [BATCH])]
    assert len(one) == len(many) == BATCH and one_locked == BATCH
    assert many == oldest  # taken (and returned) oldest first across the queues
    assert many_locked <= one_locked, f"{many_locked} rows locked for {BATCH} jobs"


def test_a_claim_of_many_queues_is_never_compiled_by_jit(conn):
    """The planner costs a claim of 1,000 queues past jit_above_cost; a server with JIT
    (PostgreSQL where it has LLVM, the default on most) compiled it at every claim,
    most of a drain's time. Any cost here: the setting is lowered to 0."""
    if not conn.execute("SELECT pg_jit_available()").fetchone()[0]:
        pytest.skip("this server has no JIT")
    spread(conn)
    conn.execute("SET jit = on")
    conn.execute("SET jit_above_cost = 0")
    with plans(conn) as seen:
        assert len(roundtrip.claim(conn, QUEUES, BATCH, LEASE)) == BATCH
    claims = [p for p in seen if p["Query Text"].startswith("WITH next AS")]
    assert claims and [p["JIT"] for p in claims if "JIT" in p] == []


def test_a_claim_of_many_queues_passes_over_a_queue_other_claims_hold(conn, db_url):
    """The shares count rows other drainers' claims hold locked: a queue whose ready
    rows they all hold gives none, and the claim takes the other queues' instead of
    nothing (a drain stops at a claim that takes nothing)."""
    for name in ("held", "free"):  # the held queue's jobs first: the oldest
        drainer.enqueue_many(conn, name, [{}] * 5)
    free = [row[0] for row in conn.execute("SELECT id FROM jobs WHERE queue = 'free'")]
    with psycopg.connect(db_url) as other:  # a transaction, as another claim's
        other.execute("SELECT id FROM jobs WHERE queue = 'held' FOR UPDATE")
        jobs = roundtrip.claim(conn, ["held", "free", *QUEUES], 5, LEASE)
    assert sorted(job.id for job in jobs) == sorted(free)


def test_a_claim_of_many_queues_takes_the_highest_priority_first(conn):
    """The shares follow the claim's order, priority first: ten queues holding one
    urgent job each, enqueued after every other, get their places in the batch."""
    spread(conn)
    hot = [f"hot{n}" for n in range(10)]
    urgent = {drainer.enqueue(conn, name, {}, priority=10) for name in hot}
    taken = [job.id for job in roundtrip.claim(conn, [*QUEUES, *hot], BATCH, LEASE)]
    assert set(taken[:10]) == urgent and len(taken) == BATCH
