"""The seed's experiment: 8 processes, 10,000 jobs, 1,250 claims each.

The naive `WHERE id = (SELECT ... LIMIT 1)` claim re-checks only `id = 1` after
waiting on a row lock, so workers take the same job again; our claim (CTE +
FOR UPDATE SKIP LOCKED) gives each job to exactly one of them. And a drain is not held
up by rows another session has locked: it skips them and takes the rest.
"""

import subprocess
import sys
import time
from datetime import datetime, timedelta

import pytest

import drainer
from drainer.db import connect
from drainer.run import Options, drain
from tests.helpers import HAND_MADE_TABLE

NAIVE = """
UPDATE jobs SET status = 'done', attempts = attempts + 1
WHERE id = (SELECT id FROM jobs WHERE status = 'queued' ORDER BY run_at LIMIT 1)
RETURNING id, attempts
"""

WORKER = """
import sys, time, pathlib, psycopg
from datetime import timedelta
import drainer
from drainer.db import connect
url, mode, go = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
naive = sys.argv[4]
with psycopg.connect(url, autocommit=True) as conn:
    pathlib.Path(f"{go}.{sys.argv[5]}").touch()
    while not go.exists():
        time.sleep(0.005)
    for _ in range(1250):
        if mode == "naive":
            conn.execute(naive)
        else:
            drainer.complete(conn, drainer.claim(conn, ["default"], 1, timedelta(minutes=5)))
"""


def race(db_url: str, mode: str, tmp_path) -> dict:
    with connect(db_url) as conn:
        drainer.enqueue_many(conn, "default", ({"email_id": i} for i in range(10_000)))
    go = tmp_path / f"go-{mode}"
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, db_url, mode, str(go), NAIVE,
                               str(i)]) for i in range(8)]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob(f"go-{mode}.*"))) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # start all eight at once
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    with connect(db_url) as conn:
        rows = conn.execute("SELECT status, count(*), max(attempts) FROM jobs GROUP BY 1")
        return {status: (n, top) for status, n, top in rows}


def test_the_naive_claim_loses_and_duplicates_work(db_url, tmp_path):
    result = race(db_url, "naive", tmp_path)
    done, most_claims = result["done"]
    assert done < 8_000  # 10,000 claims finished far fewer jobs (the seed saw ~2,100)
    assert most_claims > 1  # some jobs were claimed by several workers
    assert result["queued"][0] == 10_000 - done


def test_our_claim_gives_each_job_to_exactly_one_worker(db_url, tmp_path):
    assert race(db_url, "ours", tmp_path) == {"done": (10_000, 1)}


@pytest.fixture(params=["migrated", "hand_made"])
def table_url(request: pytest.FixtureRequest) -> str:
    """A migrated database (the claim walks the priorities), or one with the hand-made
    table alone (no priorities: the claim takes the oldest rows)."""
    if request.param == "migrated":
        return request.getfixturevalue("db_url")
    url = request.getfixturevalue("empty_db_url")
    with connect(url) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
    return url


def test_a_drain_skips_rows_another_session_holds_locked(table_url):
    """Another session keeps the three oldest ready rows locked in an open transaction
    (as a drainer mid-claim does); a drain takes the other seven at once and leaves the
    three queued. A claim that waited on the locks instead (FOR UPDATE without SKIP
    LOCKED) hits the drain connection's 5 s statement timeout and the test fails: it
    cannot hang. Both forms of the claim: with priorities and without."""
    with connect(table_url) as conn:
        oldest = [drainer.enqueue(conn, "default", {"n": n},
                                  run_at=datetime(2020, 1, 1 + n).astimezone())
                  for n in range(3)]
        drainer.enqueue_many(conn, "default", ({"n": n} for n in range(3, 10)))
        ran = []
        with connect(table_url) as holder, holder.transaction():
            locked = holder.execute("SELECT id FROM jobs WHERE status = 'queued' "
                                    "ORDER BY run_at, id LIMIT 3 FOR UPDATE").fetchall()
            assert sorted(r[0] for r in locked) == oldest
            with connect(table_url, statement_timeout=timedelta(seconds=5)) as drains:
                s = drain(drains, {"default": lambda job: ran.append(job.payload["n"])},
                          Options(queues=["default"]))
            assert (s.done, s.claimed, s.stopped) == (7, 7, "empty")
            assert sorted(ran) == list(range(3, 10))
            # The holder's own reads: the locked rows are untouched, still queued.
            assert holder.execute("SELECT id, status, attempts FROM jobs WHERE id = ANY(%s) "
                                  "ORDER BY id", (oldest,)).fetchall() == [
                (i, "queued", 0) for i in oldest]
        assert dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall()
                    ) == {"done": 7, "queued": 3}
