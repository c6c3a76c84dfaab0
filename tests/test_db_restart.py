"""PostgreSQL restarts under a running drain (`pg_ctl restart -m fast`): the run
reconnects and sends its results again, and nothing is lost; a server down for longer
than the reconnects ends the run with code 3, one clear line and the summary of what
was done, and what it had claimed comes back when its leases expire. On a cluster of
its own, so restarting it disturbs no other test."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import drainer
from drainer.db import connect
from drainer.storage.schema import migrate
from tests.cluster import Cluster
from tests.helpers import clean_env, run_cli, summary_of, wait_until

LEASE = "2"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with Cluster(os.environ.get("DRAINER_TEST_PG_BIN") or None) as c:
        with connect(c.url()) as conn:
            migrate(conn)
        yield c


def states(url: str) -> dict[str, int]:
    with connect(url) as conn:
        return dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY 1").fetchall())


def start_drain(url: str, tmp_path, first_sleep: float) -> subprocess.Popen:
    """A drain whose first batch holds a job that signals its start, then sleeps."""
    touch = tmp_path / "started"
    with connect(url) as conn:
        conn.execute("TRUNCATE jobs")
        drainer.enqueue(conn, "default", {"touch": str(touch), "sleep": first_sleep})
        drainer.enqueue_many(conn, "default", [{"sleep": 0.05}] * 40)
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainer", "drain", "--database-url", url, "--tasks", "behave",
         "--lease", LEASE, "--batch-size", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    wait_until(touch.exists)
    return proc


@pytest.mark.parametrize("moment", ["while a handler runs", "while quick batches run"])
def test_a_restart_under_a_drain_is_ridden_out_and_nothing_is_lost(cluster, tmp_path, moment):
    url = cluster.url()
    proc = start_drain(url, tmp_path, 3 if moment == "while a handler runs" else 0)
    cluster.pg_ctl("restart", "-m", "fast")
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 0, err
    assert "database connection lost" in err and "Traceback" not in err
    s = summary_of(out)
    assert s["claimed"] == s["done"] + s["retried"] + s["failed"] + s["lost"]
    # A claim whose answer the restart swallowed is held by its lease: the next run
    # takes it back.
    time.sleep(float(LEASE) + 0.5)
    rerun = run_cli("drain", "--database-url", url, "--tasks", "behave")
    assert rerun.returncode == 0, rerun.stderr
    assert s["done"] + summary_of(rerun.stdout)["done"] == 41
    assert states(url) == {"done": 41}


def test_a_server_down_past_the_retries_ends_the_run_with_exit_3(cluster, tmp_path):
    url = cluster.url()
    proc = start_drain(url, tmp_path, 1)
    cluster.pg_ctl("stop", "-m", "fast")
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        cluster.pg_ctl("start")
    assert proc.returncode == 3, err
    [line] = err.splitlines()[-1:]
    assert line.startswith("drainer: error: database unavailable"), err
    assert "Traceback" not in err and len([x for x in err.splitlines() if "error" in x]) == 1
    assert summary_of(out)["claimed"] == 0  # what was done before the error: nothing landed
    left = states(url)
    assert sum(left.values()) == 41 and left["running"] >= 1  # held by leases, not lost

    time.sleep(float(LEASE) + 0.5)  # the dead run's leases run out
    rerun = run_cli("drain", "--database-url", url, "--tasks", "behave")
    assert rerun.returncode == 0, rerun.stderr
    assert summary_of(rerun.stdout)["reaped"] == left["running"]
    assert states(url) == {"done": 41}


def test_a_drain_started_while_the_server_is_down_exits_3(cluster):
    cluster.pg_ctl("stop", "-m", "fast")
    try:
        result = run_cli("drain", "--database-url", cluster.url(), "--tasks", "behave",
                         "--connect-timeout", "0")  # one attempt: no line saying it waits
    finally:
        cluster.pg_ctl("start")
    assert result.returncode == 3
    assert result.stderr.startswith("drainer: error: database unavailable")
    assert "Traceback" not in result.stderr
