"""Through a real PgBouncer in transaction mode: `--no-prepare` / DRAINER_NO_PREPARE.

Behind a transaction pooler, consecutive statements of one client run on whatever
server connection is free, so named prepared statements break and the pooler
refuses startup parameters it does not know; the option avoids both.
"""

import json
import signal
import subprocess
import sys

import psycopg
import pytest

import drainer
from drainer.db import connect
from drainer.storage import roundtrip
from tests.claims import claimed_spec, refuse_claims
from tests.helpers import clean_env, count, listeners, run_cli, wait_until
from tests.pgbouncer import pooled

JOBS = 10_000


def test_four_drainers_through_pgbouncer_finish_10000_jobs_exactly_once(bouncer, db_url):
    url = pooled(bouncer, db_url)
    lines = "".join(json.dumps({"i": i}) + "\n" for i in range(JOBS))
    enq = run_cli("enqueue", "default", "--no-prepare", "--database-url", url, input=lines)
    assert enq.returncode == 0, enq.stderr
    env = clean_env(DRAINER_DATABASE_URL=url, DRAINER_NO_PREPARE="1", DRAINER_TASKS="noop")
    procs = [subprocess.Popen([sys.executable, "-m", "drainer", "drain"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err for _, err in outputs]
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert sum(s["done"] for s in summaries) == JOBS
    assert sum(s["lost"] + s["retried"] + s["failed"] for s in summaries) == 0
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT status, count(*), max(attempts) FROM jobs GROUP BY 1")
        assert {status: (n, top) for status, n, top in rows} == {"done": (JOBS, 1)}


@pytest.mark.parametrize("args", [
    ["migrate"], ["stats"], ["doctor"], ["reap"], ["archive"], ["requeue", "--queue", "default"],
    ["cancel", "1"], ["enqueue", "default", "{}"],
])
def test_every_command_works_through_pgbouncer(bouncer, db_url, args):
    proc = run_cli(*args, "--no-prepare", "--database-url", pooled(bouncer, db_url))
    # doctor 1: a problem found; cancel 1: there is no job 1, which its lookup found out
    expected = {"doctor": (0, 1), "cancel": (1,)}.get(args[0], (0,))
    assert proc.returncode in expected, proc.stderr
    assert args[0] != "cancel" or "no job 1 in" in proc.stderr


def test_the_always_on_worker_claims_through_pgbouncer_and_listens_directly(
        bouncer, conn, db_url, tmp_path):
    woken = tmp_path / "woken"
    env = clean_env(DRAINER_NO_PREPARE="1", DRAINER_LISTEN_URL=db_url)
    proc = subprocess.Popen([sys.executable, "-m", "drainer", "work", "--tasks", "behave",
                             "--poll-interval", "3600", "--database-url", pooled(bouncer, db_url)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: listeners(conn))
        drainer.enqueue(conn, "default", {"touch": str(woken)})
        wait_until(woken.exists)
        wait_until(lambda: count(conn, "status = 'done'") == 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["done"] == 1


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
def test_a_refused_claim_through_pgbouncer_leaves_its_write_back_and_an_idle_session(
        bouncer, conn, db_url, limited):
    """A claim that fails behind a transaction pooler (no prepared statements): the
    write-back is sent again and lands, and no server session is left in a transaction
    for the pool's next client."""
    with connect(pooled(bouncer, db_url), prepare=False) as pooled_conn:
        jobs, spec = claimed_spec(pooled_conn, limited, 4)
        refuse_claims(conn, "as_it_runs")
        drainer.enqueue(conn, "q", {})
        for _ in range(3):
            with pytest.raises(drainer.DrainerError, match="claims refused"):
                roundtrip.settle(pooled_conn, jobs[:2], [(jobs[2], "ValueError: no")], jobs[3:],
                                 claim_next=spec)
        assert pooled_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    conn.execute("DROP TRIGGER refuse_claims ON jobs")
    with connect(pooled(bouncer, db_url), prepare=False) as again:
        assert len(roundtrip.claim(again, spec.queues, 10, spec.lease, limited=spec.limited,
                                   take=10)) == 2
    assert conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1 ORDER BY 1"
                        ).fetchall() == [("done", 2), ("queued", 1), ("running", 2)]
    assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in%%'"
                        ).fetchone() == (0,)
