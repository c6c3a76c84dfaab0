"""PostgreSQL restarts under a running drain (`pg_ctl restart -m fast`): the run exits
with code 3 and one clear line, what it had claimed comes back when its leases expire,
and the next run finishes the work. On a cluster of its own, so restarting it
disturbs no other test."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import drainer
from drainer.cluster import Cluster
from drainer.db import connect
from drainer.schema import migrate
from tests.conftest import clean_env, run_cli
from tests.test_processes import summary_of, wait_for

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


@pytest.mark.parametrize("moment", ["while a handler runs", "while quick batches run"])
def test_a_restart_ends_the_run_with_exit_3_and_the_next_run_finishes(cluster, tmp_path,
                                                                       moment):
    url = cluster.url()
    touch = tmp_path / "started"
    with connect(url) as conn:
        conn.execute("TRUNCATE jobs")
        # The first batch holds a long job (restart while it runs) or only quick ones,
        # then more batches follow (restart between claims).
        first = {"touch": str(touch), "sleep": 3 if moment == "while a handler runs" else 0}
        drainer.enqueue(conn, "default", first)
        drainer.enqueue_many(conn, "default", [{"sleep": 0.05}] * 40)
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainer", "drain", "--database-url", url, "--tasks", "behave",
         "--lease", LEASE, "--batch-size", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    wait_for(touch)
    cluster.pg_ctl("restart", "-m", "fast")
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 3, err
    assert out == ""  # no summary: the run did not finish
    [line] = err.splitlines()[-1:]
    assert line.startswith("drainer: error: database unavailable"), err
    assert "Traceback" not in err and len([x for x in err.splitlines() if "error" in x]) == 1
    left = states(url)
    assert sum(left.values()) == 41  # nothing lost; what was claimed is held by leases
    if moment == "while a handler runs":
        assert left["running"] >= 1

    time.sleep(float(LEASE) + 0.5)  # the dead run's leases run out
    rerun = run_cli("drain", "--database-url", url, "--tasks", "behave")
    assert rerun.returncode == 0, rerun.stderr
    s = summary_of(rerun.stdout)
    assert s["reaped"] == left.get("running", 0)
    assert states(url) == {"done": 41}


def test_a_drain_started_while_the_server_is_down_exits_3(cluster):
    cluster.pg_ctl("stop", "-m", "fast")
    try:
        result = run_cli("drain", "--database-url", cluster.url(), "--tasks", "behave")
    finally:
        cluster.pg_ctl("start")
    assert result.returncode == 3
    assert result.stderr.startswith("drainer: error: database unavailable")
    assert "Traceback" not in result.stderr
