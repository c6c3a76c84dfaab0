"""Flow control across drainers, enforced in the claim: concurrency, per-group FIFO,
rate; checked from what real drainer processes recorded (tests/tasks/limited.py)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import drainer
from drainer import model
from drainer.storage import admin, claim, roundtrip, sql
from drainer.storage.claim import Claim
from drainer.storage.limits import Limits, limits
from tests.claims import claim_waiting_for_the_lock, limit_held
from tests.helpers import HAND_MADE_TABLE, clean_env, summary_of, wait_until
from tests.tasks.limited import RUNS

POOL = ThreadPoolExecutor(max_workers=1)
LEASE = timedelta(minutes=5)
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def drainers(db_url: str, count: int, *extra: str) -> list[subprocess.Popen]:
    env = clean_env(DRAINER_DATABASE_URL=db_url)
    return [subprocess.Popen([sys.executable, "-m", "drainer", "drain", "--tasks", "limited",
                              "--concurrency", "4", *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(count)]


def finish(procs: list[subprocess.Popen]) -> list[dict]:
    summaries = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        summaries.append(summary_of(out))
    return summaries


def drain_until_done(conn, db_url: str, queue_name: str, processes: int = 8) -> None:
    """Rounds of `processes` drainers, as a scheduler would start them, until every job
    of the queue is done."""
    for _ in range(20):
        finish(drainers(db_url, processes, "--queue", queue_name))
        conn.execute("UPDATE jobs SET run_at = now() WHERE status = 'queued'")
        left = conn.execute("SELECT count(*) FROM jobs WHERE queue = %s AND status <> 'done'",
                            (queue_name,)).fetchone()[0]
        if not left:
            return
    pytest.fail(f"{left} jobs of {queue_name} never finished")


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one moment."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                    key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


@pytest.fixture
def runs(conn):
    conn.execute(RUNS)
    return conn


GATE = """
CREATE FUNCTION gate_first_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NOT EXISTS (SELECT FROM jobs WHERE queue = NEW.queue AND status <> 'queued') THEN
    PERFORM pg_advisory_lock_shared(hashtext('tests.gate'), 0);
    PERFORM pg_advisory_unlock_shared(hashtext('tests.gate'), 0);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER gate_first_start BEFORE UPDATE ON jobs FOR EACH ROW
  WHEN (OLD.status = 'queued' AND NEW.status = 'running') EXECUTE FUNCTION gate_first_start();
"""


def two_claims_met(conn) -> bool:
    """Whether a second claim has begun while the first waits at the gate: waiting for
    the limits lock the first holds, or, not having waited for it, at the gate too."""
    at_gate, at_limits = conn.execute(
        "SELECT count(*) FILTER (WHERE classid = hashtext('tests.gate')::oid), "
        "count(*) FILTER (WHERE classid = hashtext('drainer.limit')::oid) FROM pg_locks "
        "WHERE locktype = 'advisory' AND NOT granted AND objsubid = 2").fetchone()
    return at_gate >= 2 or (at_gate >= 1 and at_limits >= 1)


@contextmanager
def second_claim_during_the_first(conn, db_url: str) -> Iterator[None]:
    """Within: a claim that starts its queue's first job waits before its commit until
    a second claim has begun: one waiting for the queue's limits lock, or one that
    did not and waits at the same place (a trigger holds them at a gate)."""
    conn.execute(GATE)
    with psycopg.connect(db_url, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(hashtext('tests.gate'), 0)")
        try:
            yield
            wait_until(lambda: two_claims_met(conn), timeout=120)
        finally:
            gate.execute("SELECT pg_advisory_unlock(hashtext('tests.gate'), 0)")


def test_eight_drainers_never_run_more_than_the_concurrency_limit(runs, db_url):
    """Eight drainers start together on a queue limited to 3 running jobs, the first
    claim held open until a second has begun: that one must wait for the first to
    commit, and count its jobs. Each handler runs until more than 3 run at once with
    it, or for a bounded time, so that jobs started past the limit would overlap."""
    drainer.enqueue_many(runs, "capped", [{"crowd": 3}] * 6)
    with second_claim_during_the_first(runs, db_url):
        procs = drainers(db_url, 8, "--queue", "capped")
    finish(procs)
    if runs.execute("SELECT count(*) FROM jobs WHERE status <> 'done'").fetchone()[0]:
        drain_until_done(runs, db_url, "capped")
    intervals = runs.execute("SELECT started, ended FROM limit_runs WHERE queue = 'capped'"
                             ).fetchall()
    assert len(intervals) == 6
    assert most_at_once(intervals) <= 3
    assert most_at_once(intervals) == 3  # and the limit was used, not a single file


def test_a_group_runs_one_job_at_a_time_in_enqueue_order_across_retries(runs, db_url):
    for n in range(400):
        drainer.enqueue(runs, "fifo", {"sleep": 0.002, "fail_first": n % 7 == 3},
                        group=f"customer-{n % 10}")
    drainer.enqueue_many(runs, "fifo", [{}] * 50)  # no group: free
    drain_until_done(runs, db_url, "fifo")
    by_group = defaultdict(list)
    for job_id, grp, started, ended, ok in runs.execute(
            "SELECT job_id, grp, started, ended, ok FROM limit_runs WHERE queue = 'fifo' "
            "AND grp IS NOT NULL ORDER BY started"):
        by_group[grp].append((job_id, started, ended, ok))
    assert len(by_group) == 10
    for grp, executions in by_group.items():
        assert most_at_once([(s, e) for _, s, e, _ in executions]) == 1, grp
        # In enqueue order: a job starts only once every earlier job of its group is
        # done, its failed first attempt and its retry included.
        ids = [job_id for job_id, *_ in executions]
        assert ids == sorted(ids), grp
        retried = [job_id for job_id, _, _, ok in executions if not ok]
        assert retried and all(ids.count(j) == 2 for j in retried)


def test_a_rate_limit_holds_in_every_window(runs, db_url):
    drainer.enqueue_many(runs, "rated", [{}] * 70)
    finish(drainers(db_url, 4, "--queue", "rated"))
    while runs.execute("SELECT count(*) FROM jobs WHERE queue = 'rated' AND status = 'queued'"
                       ).fetchone()[0]:
        finish(drainers(db_url, 4, "--queue", "rated"))
    claimed = sorted(t for (t,) in runs.execute(
        "SELECT claimed FROM limit_runs WHERE queue = 'rated'"))
    assert len(claimed) == 70
    # By the database's clock at each claim: no window of one second holds 21.
    assert all(claimed[i + 20] - claimed[i] >= 1.0 for i in range(len(claimed) - 20))


def test_a_drain_that_meets_only_throttled_jobs_stops_with_next_due_at_the_next_token(
        runs, db_url):
    drainer.enqueue_many(runs, "rated", [{}] * 25)
    [summary] = finish(drainers(db_url, 1, "--queue", "rated"))
    assert summary["done"] == 20 and summary["stopped"] == "empty"
    first = runs.execute("SELECT min(at) FROM drainer_starts").fetchone()[0]
    assert summary["next_due"] is not None
    due = datetime.fromisoformat(summary["next_due"])
    assert due == first + timedelta(seconds=1)  # when the oldest start leaves the window


def test_a_killed_drainers_job_holds_its_place_until_reaped(runs, db_url, tmp_path):
    release = tmp_path / "release"
    held = drainer.enqueue(runs, "single", {"wait_for": str(release)})
    waiting = drainer.enqueue(runs, "single", {})
    [first] = drainers(db_url, 1, "--queue", "single")
    wait_until(lambda: runs.execute("SELECT status FROM jobs WHERE id = %s", (held,)
                                    ).fetchone()[0] == "running")
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    [summary] = finish(drainers(db_url, 1, "--queue", "single"))
    assert summary["claimed"] == 0  # the dead worker's job still counts
    lease_end = runs.execute("SELECT locked_until FROM jobs WHERE id = %s", (held,)).fetchone()[0]
    assert datetime.fromisoformat(summary["next_due"]) == lease_end
    runs.execute("UPDATE jobs SET locked_until = now() - interval '1 second' WHERE id = %s",
                 (held,))  # its lease runs out
    release.write_text("")
    [summary] = finish(drainers(db_url, 1, "--queue", "single"))
    assert summary["reaped"] == 1 and summary["done"] == 2
    assert runs.execute("SELECT status FROM jobs WHERE id = %s", (waiting,)).fetchone() == (
        "done",)


def test_limits_are_checked_where_they_are_declared():
    for bad in ({"concurrency": 0}, {"per_group": -1}, {"concurrency": True},
                {"rate": "100/fortnight"}, {"rate": "0/second"}, {"rate": 100}):
        with pytest.raises(drainer.ConfigError):
            drainer.task("x", **bad)
    assert limits("q", None, None, "100/minute") == Limits("q", rate=100, per_seconds=60.0)
    assert limits("q", None, None, " 5 / hours ") == Limits("q", rate=5, per_seconds=3600.0)


def test_a_group_on_a_hand_made_table_says_to_migrate(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE)
        with pytest.raises(drainer.ConfigError, match="drainer migrate"):
            drainer.enqueue(conn, "fifo", {}, group="g")
        drainer.enqueue(conn, "capped", {})
        with pytest.raises(drainer.ConfigError, match="drainer migrate"):
            roundtrip.claim(conn, [], 10, timedelta(minutes=5),
                            limited=[Limits("capped", concurrency=3)], take=1)


def test_queues_without_limits_keep_the_plain_claim(conn):
    drainer.enqueue(conn, "plain", {})
    drainer.enqueue(conn, "capped", {})
    text = claim.claim_sql(10, *claim.claim_kind(conn))
    assert "drainer_starts" not in text and "advisory" not in text
    jobs = roundtrip.claim(conn, ["plain"], 10, timedelta(minutes=5),
                           limited=[Limits("capped", concurrency=1)], take=5)
    assert sorted(j.queue for j in jobs) == ["capped", "plain"]
    assert roundtrip.claim(conn, [], 10, timedelta(minutes=5),
                           limited=[Limits("capped", concurrency=1)], take=5) == []


def test_stats_and_doctor_show_each_limit_how_full_and_what_it_holds_back(conn):
    from drainer.commands import doctor
    from drainer.commands import stats as stats_command

    for n in range(5):
        drainer.enqueue(conn, "single", {}, group=f"g{n % 2}")
    capped, grouped = Limits("single", concurrency=1), Limits("grouped", per_group=1)
    for _ in range(3):
        drainer.enqueue(conn, "grouped", {}, group="same")
    admin.record_limits(conn, [capped, grouped], [])
    jobs = roundtrip.claim(conn, [], 10, timedelta(minutes=5), limited=[capped, grouped], take=5)
    assert sorted(j.queue for j in jobs) == ["grouped", "single"]  # one each: the limits
    data = stats_command.stats(conn)
    assert [(f["queue"], f["running"], f["ready"], f["held"]) for f in data["limits"]] == [
        ("grouped", 1, 2, 2), ("single", 1, 4, 4)]
    text = stats_command.format_stats(data)
    assert "single: concurrency 1/1 running; 4 ready, 4 held back" in text
    assert "grouped: 1 per group; 2 ready, 2 held back" in text
    notes = [f for f in doctor.diagnose(conn) if f.check == "limit"]
    assert [n.summary for n in notes] == ["grouped: 1 per group; 2 ready, 2 held back",
                                          "single: concurrency 1/1 running; 4 ready, 4 held back"]
    # A drain's code without those limits any more forgets them.
    admin.record_limits(conn, [capped], ["grouped"])
    assert [f["queue"] for f in stats_command.stats(conn)["limits"]] == ["single"]


def test_a_throttled_drain_arms_a_wake_up_for_its_next_token(runs, db_url):
    """next_due and the serverless run's decision, together: the run neither goes on
    (which would spin on throttled jobs) nor stops for good."""
    from datetime import datetime

    from drainer import wake
    from drainer.run import Summary

    drainer.enqueue_many(runs, "rated", [{}] * 25)
    [summary] = finish(drainers(db_url, 1, "--queue", "rated"))
    due = datetime.fromisoformat(summary["next_due"])
    now = runs.execute("SELECT now()").fetchone()[0]
    decided = wake.after_run(Summary(claimed=summary["claimed"], next_due=due, next_run_at=due),
                             now=now, depth=0, max_depth=3, remaining=timedelta(minutes=10))
    assert decided.action in ("wait", "wake") and decided.at is not None
    assert decided.at >= due  # not before the token


def read_from_jobs(plan: dict) -> int:
    """Rows the plan's nodes on `jobs` read: returned, or read and filtered out."""
    node = plan.get("Plan", plan)
    own = 0
    if node.get("Relation Name") == "jobs":
        own = node["Actual Loops"] * (node["Actual Rows"] + node.get("Rows Removed by Filter", 0))
    return own + sum(read_from_jobs(child) for child in node.get("Plans", []))


def test_a_held_back_group_backlog_costs_the_claim_only_its_heads(conn):
    """50,000 queued jobs in 5 groups, their heads running: a claim reads a bounded
    number of rows, not the backlog (reading every ready job took seconds a claim at
    200,000; checking each with one count of running or earlier jobs was a BitmapOr
    over its group)."""
    for group in range(5):
        drainer.enqueue_many(conn, "fifo", [{}] * 10_000, group=f"g{group}")
    conn.execute("ANALYZE jobs")
    grouped = Limits("fifo", per_group=1)
    first = roundtrip.claim(conn, [], 10, timedelta(minutes=5), limited=[grouped], take=10)
    assert len(first) == 5  # one head per group
    with conn.transaction(force_rollback=True):
        [(plan,)] = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim.limited_sql(True), {
            "limits": json.dumps([grouped.row(10)]), "rated": [], "take": 10,
            "lease": timedelta(minutes=5), "now": None}).fetchall()
    assert 0 < read_from_jobs(plan[0]) < 10_000  # of 50,000 (it read them all, 8 times)
    assert roundtrip.claim(conn, [], 10, timedelta(minutes=5), limited=[grouped], take=10) == []


def test_a_group_behind_a_long_held_back_backlog_still_starts(conn):
    drainer.enqueue_many(conn, "fifo", [{}] * 600, group="busy")
    [(head,)] = conn.execute("SELECT min(id) FROM jobs").fetchall()
    late = drainer.enqueue(conn, "fifo", {}, group="late")
    grouped = Limits("fifo", per_group=1)
    jobs = roundtrip.claim(conn, [], 10, timedelta(minutes=5), limited=[grouped], take=10)
    # late is not among the first 500 ready jobs, but heads its group.
    assert sorted(j.id for j in jobs) == [head, late]
    assert admin.due(conn, [], limited=[grouped]).run_at is None  # nothing else may start


def test_groups_compare_as_text_and_a_null_group_is_none(conn):
    """Another producer's group written as a number, or as null."""
    conn.execute("""INSERT INTO jobs (queue, payload, meta) VALUES
        ('fifo', '{}', '{"group": "7"}'), ('fifo', '{}', '{"group": 7}'),
        ('fifo', '{}', '{"group": null}'), ('fifo', '{}', '{"group": null}')""")
    jobs = roundtrip.claim(conn, [], 10, timedelta(minutes=5),
                           limited=[Limits("fifo", per_group=1)], take=10)
    ids = [i for (i,) in conn.execute("SELECT id FROM jobs ORDER BY id")]
    assert sorted(j.id for j in jobs) == [ids[0], ids[2], ids[3]]


def behind_a_held_back_backlog(conn, name: str) -> Limits:
    """Queue `name`, one job at a time per group, whose first 500 ready jobs (of
    priority 10) belong to a group whose head runs: none of them may start, so its
    claim looks for jobs among the groups' heads."""
    grouped = Limits(name, per_group=1)
    drainer.enqueue(conn, name, {}, group="busy")
    assert len(roundtrip.claim(conn, [], 1, LEASE, limited=[grouped], take=1)) == 1
    drainer.enqueue_many(conn, name, [{}] * 500, priority=10, group="busy")
    return grouped


def claimed_ids(conn, take: int, *limited: Limits) -> list[int]:
    return [job.id for job in roundtrip.claim(conn, [], 100, LEASE, limited=limited, take=take)]


@pytest.mark.parametrize("limited", [Limits("q", concurrency=1), Limits("q", rate=1,
                                                                       per_seconds=60.0)],
                         ids=["concurrency", "rate"])
def test_a_limited_claim_takes_higher_priority_first(conn, limited):
    """A limited queue with room for one job takes its highest priority, not its
    oldest; and of several limited queues, the free handler slots go to the highest
    priorities first, whichever queue they are in."""
    drainer.enqueue(conn, "q", {}, run_at=LONG_AGO)
    urgent = drainer.enqueue(conn, "q", {}, priority=5)
    assert claimed_ids(conn, 10, limited) == [urgent]

    drainer.enqueue(conn, "a", {}, run_at=LONG_AGO)
    urgent = drainer.enqueue(conn, "b", {}, priority=5)
    assert claimed_ids(conn, 1, Limits("a", concurrency=5), Limits("b", concurrency=5)) == [
        urgent]


def test_a_group_limited_claim_takes_higher_priority_first(conn):
    """A per-group queue takes its highest priority first: among the jobs whose group
    lets them start, among its first 500 ready jobs (more than 500 older ones of a
    lower priority wait), and among the groups' heads when none of those may start."""
    drainer.enqueue(conn, "first", {}, group="x", run_at=LONG_AGO)
    urgent = drainer.enqueue(conn, "first", {}, group="y", priority=5)
    assert claimed_ids(conn, 1, Limits("first", per_group=1)) == [urgent]

    drainer.enqueue_many(conn, "ready", [{}] * 500, run_at=LONG_AGO)
    urgent = drainer.enqueue(conn, "ready", {}, priority=5)
    assert claimed_ids(conn, 1, Limits("ready", per_group=1)) == [urgent]

    grouped = behind_a_held_back_backlog(conn, "heads")
    drainer.enqueue(conn, "heads", {}, group="old", run_at=LONG_AGO)
    urgent = drainer.enqueue(conn, "heads", {}, group="new", priority=5)
    assert claimed_ids(conn, 1, grouped) == [urgent]


@pytest.mark.parametrize(("limited", "backlog"), [
    (Limits("q", concurrency=20), False), (Limits("q", rate=20, per_seconds=60.0), False),
    (Limits("q", per_group=1), False), (Limits("q", per_group=1), True),
], ids=["concurrency", "rate", "per_group", "per_group_heads"])
def test_a_limited_claim_skips_locked_rows(conn, db_url, limited, backlog):
    """Another session holds three ready jobs locked in an open transaction (as a
    drainer mid-claim does): a limited claim takes the others at once and leaves those
    three. One that waited for them instead would wait with the queue's limits lock
    held, and every drainer of the queue with it: here it meets the claiming session's
    lock_timeout, and fails. (Behind a backlog, the jobs are found among the groups'
    heads.)"""
    if backlog:
        behind_a_held_back_backlog(conn, "q")
    ids = [drainer.enqueue(conn, "q", {}, group=f"g{n}" if limited.per_group else None)
           for n in range(10)]
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as claimer:
        holder.execute("SELECT FROM jobs WHERE id = ANY(%s) FOR UPDATE", (ids[:3],))
        claimer.execute("SET lock_timeout = '2s'")
        assert sorted(claimed_ids(claimer, 20, limited)) == ids[3:]
    assert conn.execute("SELECT count(*) FROM jobs WHERE id = ANY(%s) AND status = 'queued'",
                        (ids[:3],)).fetchone() == (3,)


def test_a_claim_that_waited_for_the_lock_dates_its_starts_after_the_wait(conn, db_url):
    """A rate's window must hold the starts' real times: dated when the claim's
    transaction began, before it waited, they would leave the window early and
    their tokens be taken again."""
    drainer.enqueue_many(conn, "rated", [{}] * 3)
    with (limit_held(db_url, "rated") as holder,
          psycopg.connect(db_url, autocommit=True) as claimer):
        claiming = claim_waiting_for_the_lock(conn, claimer,
                                              Limits("rated", rate=10, per_seconds=60.0))
        [(released,)] = holder.execute("SELECT clock_timestamp()").fetchall()
        holder.commit()
        assert len(claiming.result(timeout=30)) == 3
    starts = [at for (at,) in conn.execute("SELECT at FROM drainer_starts")]
    assert len(starts) == 3 and min(starts) >= released
    [(leased,)] = conn.execute("SELECT min(locked_until) FROM jobs").fetchall()
    assert leased >= released + timedelta(minutes=5)


def test_a_claim_sees_what_committed_while_it_waited_even_under_repeatable_read(conn, db_url):
    """A database or role whose default isolation is repeatable read would give the
    claim the snapshot of its transaction's first statement, the wait for the lock:
    it would not see the jobs another drainer started meanwhile."""
    drainer.enqueue_many(conn, "capped", [{}] * 6)
    with (limit_held(db_url, "capped") as holder,
          psycopg.connect(db_url, autocommit=True) as claimer):
        claimer.execute("SET default_transaction_isolation = 'repeatable read'")
        claiming = claim_waiting_for_the_lock(conn, claimer,
                                              Limits("capped", concurrency=3))
        holder.execute("""UPDATE jobs SET status = 'running', attempts = 1,
                          locked_until = now() + interval '5 minutes'
                          WHERE id IN (SELECT id FROM jobs ORDER BY id LIMIT 3)""")
        holder.commit()
        assert claiming.result(timeout=30) == []
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone() == (3,)


def test_next_due_of_a_per_group_queue_reads_no_delayed_backlog(conn):
    """30,000 jobs delayed by a day, one group each (a reminder per customer): nothing
    is ready, and next_due reads no group's head to learn it (it read every one, 2 s a
    drain at 100,000)."""
    conn.execute("""INSERT INTO jobs (queue, payload, run_at, meta)
        SELECT 'fifo', '{}', now() + interval '1 day', jsonb_build_object('group', 'c' || i)
        FROM generate_series(1, 30000) i""")
    conn.execute("ANALYZE jobs")
    grouped = Limits("fifo", per_group=1)
    with conn.transaction(force_rollback=True):
        [(plan,)] = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.variant("due_limited"),
                                 {"limits": json.dumps([asdict(grouped)]), "now": None}
                                 ).fetchall()
    assert read_from_jobs(plan[0]) < 5_000
    [(first,)] = conn.execute("SELECT min(run_at) FROM jobs").fetchall()
    assert admin.due(conn, [], limited=[grouped]).run_at == first


def test_limited_claims_take_no_more_than_the_free_slots_across_their_queues(conn):
    """`take` is the process's free handler slots, for all its limited queues together:
    a job claimed beyond them would wait in the batch, holding a place (and a token)
    another drainer's free slot could use."""
    for name in ("a", "b", "a", "b"):
        drainer.enqueue(conn, name, {})
    capped = [Limits("a", concurrency=5), Limits("b", concurrency=5)]
    jobs = roundtrip.claim(conn, ["plain"], 10, timedelta(minutes=5), take=1, limited=capped)
    assert [j.queue for j in jobs] == ["a"]  # the oldest of both
    jobs = roundtrip.claim(conn, [], 10, timedelta(minutes=5), take=2, limited=capped)
    assert sorted(j.queue for j in jobs) == ["a", "b"]


def test_a_drain_starts_its_limited_jobs_first_never_holding_them_in_the_batch(runs, db_url):
    """One handler slot (--concurrency 1), a plain job of 1 s claimed with a job of a
    queue limited to 1: the limited job starts first, not after the other."""
    drainer.enqueue(runs, "capped", {"sleep": 1.0})  # concurrency=3: limited too
    drainer.enqueue(runs, "single", {})
    env = clean_env(DRAINER_DATABASE_URL=db_url)
    proc = subprocess.run([sys.executable, "-m", "drainer", "drain", "--tasks", "limited",
                           "--concurrency", "1", "--queue", "capped", "--queue", "single"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    waits = dict(runs.execute("SELECT queue, started - claimed FROM limit_runs").fetchall())
    assert max(waits.values()) < 0.5, waits


def test_limited_statements_run_without_jit(conn):
    """The planner sees the limits' rows as 100 and each queue's scan as its whole
    table's: a claim of 20,000 jobs was costed past jit_above_cost, and compiled at
    every claim (120 ms on PostgreSQL 15 with LLVM), under the queues' locks."""
    conn.execute("SET jit = on")
    with roundtrip.transaction(conn, no_jit=True):
        cursor = conn.execute("SHOW jit")
    assert cursor.fetchall() == [("off",)]
    assert conn.execute("SHOW jit").fetchall() == [("on",)]  # for that transaction only


def test_a_limit_beyond_the_databases_int_is_refused_where_declared():
    for bad in ({"concurrency": 2**31}, {"per_group": 2**31}, {"rate": "3000000000/hour"}):
        with pytest.raises(drainer.ConfigError, match="2147483647"):
            drainer.task("big", **bad)
    assert limits("q", 2**31 - 1, None, None).concurrency == 2**31 - 1


@pytest.mark.parametrize("slots", [2**31, 2**63 - 1])
def test_a_limited_queue_drains_at_any_concurrency_the_option_takes(runs, slots):
    """--concurrency goes up to the database's bigint; a limited claim's `take` (free
    handler slots) beyond its int was refused by the database and failed the drain."""
    drainer.enqueue_many(runs, "capped", [{}] * 3)
    summary = drainer.drain(runs, {"capped": lambda job: None},
                            drainer.Options(queues=["capped"], concurrency=slots))
    assert (summary.claimed, summary.done) == (3, 3)
    assert roundtrip.claim(runs, [], 10, timedelta(minutes=5), take=slots,
                           limited=[Limits("capped", concurrency=3)]) == []


def test_one_claim_serves_a_grouped_queue_and_a_capped_one_together(conn):
    """A claim with no per-group queue leaves out the per-group arm (a tenth of its
    time); with one, both arms run, each for its own queues."""
    drainer.enqueue(conn, "capped", {})
    drainer.enqueue(conn, "grouped", {}, group="g")
    drainer.enqueue(conn, "grouped", {}, group="g")  # behind the first of its group
    spec = [Limits("capped", concurrency=5), Limits("grouped", per_group=1)]
    jobs = roundtrip.claim(conn, [], 10, timedelta(minutes=5), take=10, limited=spec)
    assert sorted(j.queue for j in jobs) == ["capped", "grouped"]
    drainer.enqueue(conn, "capped", {})
    jobs = roundtrip.claim(conn, [], 10, timedelta(minutes=5), take=10, limited=spec[:1])
    assert [j.queue for j in jobs] == ["capped"]
    assert "meta ->> 'group'" not in claim.limited_sql(False, grouped=False)


def test_a_limited_claim_that_fails_still_writes_its_batch_back(conn, db_url):
    """A batch is written back in the limited claim's transaction (one round trip): a
    claim that fails there (here the role's lock_timeout, while another drainer holds
    the queue's lock) rolls that write-back back too. It is sent again on its own
    before the error is raised, so the jobs that ran are not run again after their
    lease, and the one never started is queued again."""
    drainer.enqueue_many(conn, "capped", [{}] * 4)
    capped = Limits("capped", concurrency=10)
    with psycopg.connect(db_url, autocommit=True) as drain:
        jobs = roundtrip.claim(drain, [], 10, timedelta(minutes=5), take=10, limited=[capped])
        drain.execute("SET lock_timeout = '100ms'")
        with limit_held(db_url, "capped"), pytest.raises(drainer.DrainerError):
            roundtrip.settle(drain, jobs[:2], [(jobs[2], "ValueError: no")], jobs[3:],
                             claim_next=Claim([], 10, timedelta(minutes=5), [capped], 10))
        statuses = drain.execute("SELECT status, attempts, locked_until IS NULL FROM jobs "
                                 "ORDER BY id").fetchall()
    assert statuses == [("done", 1, True), ("done", 1, True), ("queued", 1, True),
                        ("queued", 0, True)]


def test_a_write_back_frees_the_room_its_own_limited_claim_counts(conn):
    """The write-back and the limited claim share a transaction: the claim sees the
    jobs its write-back just ended as no longer running."""
    drainer.enqueue_many(conn, "capped", [{}] * 4)
    capped = [Limits("capped", concurrency=2)]
    lease = timedelta(minutes=5)
    first = roundtrip.claim(conn, [], 10, lease, take=10, limited=capped)
    assert len(first) == 2
    settled = roundtrip.settle(conn, first, [], [],
                               claim_next=Claim([], 10, lease, capped, 10))
    assert settled.done == {j.token for j in first} and len(settled.claimed) == 2
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone() == (2,)


def test_ctrl_c_while_the_claim_waits_for_the_limits_lock_keeps_the_write_back(conn, db_url):
    """Ctrl-C (a drain run from a script) while the limited claim waits for another
    drainer's lock: psycopg cancels the statement and raises KeyboardInterrupt, the
    transaction is rolled back with the write-back in it, and the write-back is sent
    again on its own: the jobs that ran are not left running, to be run again."""
    drainer.enqueue_many(conn, "capped", [{}] * 3)
    capped = [Limits("capped", concurrency=10)]
    with psycopg.connect(db_url, autocommit=True) as drain:
        jobs = roundtrip.claim(drain, [], 10, timedelta(minutes=5), limited=capped, take=10)
        pid = drain.info.backend_pid
        main = threading.main_thread().ident
        assert main is not None

        def interrupt_once_waiting() -> None:
            wait_until(lambda: conn.execute("SELECT wait_event FROM pg_stat_activity "
                                            "WHERE pid = %s", (pid,)).fetchone()
                       == ("advisory",))
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, to the main thread

        # Ctrl-C's own handler, as a script has it: an in-process `drainer drain` of an
        # earlier test leaves SIGINT ignored (the CLI does so once its work is written).
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            with limit_held(db_url, "capped"):
                threading.Thread(target=interrupt_once_waiting, daemon=True).start()
                with pytest.raises(KeyboardInterrupt):
                    roundtrip.settle(drain, jobs[:2], [(jobs[2], "ValueError: no")], [],
                                     claim_next=Claim([], 10, timedelta(minutes=5), capped,
                                                            10))
        finally:
            signal.signal(signal.SIGINT, previous)
        assert drain.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SELECT status FROM jobs ORDER BY id").fetchall() == [
        ("done",), ("done",), ("queued",)]


def test_a_limited_batch_is_refilled_as_its_slots_free_up(runs, db_url):
    """A limited queue's slots do not wait for the batch's slowest job: as handler slots
    free up, what finished is written back and as many jobs claimed as slots are free,
    while the slow one runs on. Never more than the free slots: no claimed job waits in
    the batch (counted: never more than 3 jobs claimed and not yet ended at once, by
    the claim's database time and the handler's end), and the limit holds."""
    drainer.enqueue(runs, "capped", {"sleep": 1.0})  # concurrency=3
    drainer.enqueue_many(runs, "capped", [{"sleep": 0.05}] * 12)
    env = clean_env(DRAINER_DATABASE_URL=db_url)
    proc = subprocess.run([sys.executable, "-m", "drainer", "drain", "--tasks", "limited",
                           "--concurrency", "3", "--queue", "capped"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert summary_of(proc.stdout)["done"] == 13
    rows = runs.execute("SELECT started, ended, claimed FROM limit_runs "
                        "ORDER BY ended - started DESC").fetchall()
    (_, slow_end, _), short = rows[0], rows[1:]
    assert all(started < slow_end for started, _, _ in short)
    assert most_at_once([(started, ended) for started, ended, _ in rows]) <= 3
    assert most_at_once([(claimed, ended) for _, ended, claimed in rows]) <= 3


def test_a_refills_limited_claim_takes_no_more_than_the_deadline_leaves_time_for():
    """A refill's limited claim takes no more than its batch's free slots, nor more
    than the claim's size, which near a deadline is what can finish: a job given back
    unstarted does not return its rate's token."""
    from types import SimpleNamespace

    from drainer.engine.drain import Drain
    from drainer.run import Options
    steps = SimpleNamespace(plain=[], limited=[Limits("rated", rate=10, per_seconds=60.0)],
                            options=Options(queues=["rated"], concurrency=50))
    assert Drain.claim(steps, 2, 10).take == 2  # type: ignore[arg-type]
    assert Drain.claim(steps, 500, 10).take == 10  # type: ignore[arg-type]
    assert Drain.claim(steps, 500).take == 50  # type: ignore[arg-type]


def test_a_limited_batch_is_still_refilled_when_its_refills_jobs_start_at_once(conn, declared):
    """A refill's jobs may all start before the refill has done its bookkeeping (a
    failure's log line, a hook): none of them could ask for the next refill then, and
    the batch was never refilled again, its free slots idle until its slowest job ended."""
    started: dict[int, float] = {}

    def handler(job: model.Job) -> None:
        started[job.id] = time.monotonic()
        time.sleep(job.payload["sleep"])
        if job.payload["sleep"] < 1:
            raise ValueError("short jobs fail, for good")

    hooked = drainer.task("hooked", concurrency=3, retry_on=KeyError,
                          on_failure=lambda job, error: time.sleep(0.05))(handler)
    slow = drainer.enqueue(conn, "hooked", {"sleep": 3.0})
    drainer.enqueue_many(conn, "hooked", [{"sleep": 0.05}] * 40)
    summary = drainer.drain(conn, {"hooked": hooked},
                            drainer.Options(queues=["hooked"], concurrency=3))
    assert (summary.done, summary.failed) == (1, 40)
    late = [i for i, at in started.items() if i != slow and at >= started[slow] + 3.0]
    assert late == []


def _drain(db_url: str, *queues: str) -> subprocess.Popen:
    args = [a for q in queues for a in ("--queue", q)]
    return subprocess.Popen([sys.executable, "-m", "drainer", "drain", "--tasks", "limited",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=clean_env(DRAINER_DATABASE_URL=db_url))


def _waiting_on_limits(conn, count: int) -> bool:
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND wait_event_type = 'Lock' "
                        "AND query LIKE '%%drainer_limits%%'").fetchone()[0] >= count


def test_two_drainers_naming_the_same_limited_queues_in_another_order_do_not_deadlock(
        conn, db_url):
    """`record_limits` upserts one row per limited queue, in the order of --queue: two
    drainers started together with `--queue capped --queue single` and `--queue single
    --queue capped` lock the two rows in opposite orders. (The test holds capped's row
    for a moment, as a third drainer's upsert would, so that both meet in the middle.)"""
    admin.record_limits(conn, [Limits("capped", concurrency=3), Limits("single", concurrency=1)],
                        [])
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT FROM drainer_limits WHERE queue = 'capped' FOR UPDATE")
        first = _drain(db_url, "capped", "single")  # waits for capped, holding nothing
        wait_until(lambda: _waiting_on_limits(conn, 1))
        second = _drain(db_url, "single", "capped")  # takes single, waits for capped
        wait_until(lambda: _waiting_on_limits(conn, 2))
        holder.commit()  # first takes capped, then waits for single: a cycle
    outs = [p.communicate(timeout=120) for p in (first, second)]
    errors = [err for p, (_, err) in zip((first, second), outs, strict=True) if p.returncode]
    assert errors == [], errors


def test_a_queue_named_twice_runs_each_job_once_and_within_its_limit(conn, db_url):
    """`--queue capped --queue capped` (or DRAINER_QUEUES=capped,capped, or a script's
    Options(queues=[...]) built from two lists): the queue is in the claim twice, and
    each of its laterals takes the same rows (SKIP LOCKED does not skip the claim's own
    locks), so every job comes back twice and its handler runs twice."""
    conn.execute(RUNS)
    drainer.enqueue_many(conn, "capped", [{"sleep": 0.2}] * 6)
    proc = _drain(db_url, "capped", "capped")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    runs = conn.execute("SELECT job_id, count(*) FROM limit_runs GROUP BY job_id "
                        "ORDER BY job_id").fetchall()
    assert [n for _, n in runs] == [1] * 6, runs  # each job once


def test_a_plain_queue_named_twice_runs_each_job_once(conn):
    """The same through the API, on the plain claim: Options(queues=["plain", "plain"])."""
    drainer.enqueue_many(conn, "plain", [{}] * 3)
    seen: Counter[int] = Counter()
    summary = drainer.drain(conn, {"plain": lambda job: seen.update([job.id])},
                            drainer.Options(queues=["plain", "plain"]))
    assert sorted(seen.values()) == [1, 1, 1] and summary.claimed == 3, (seen, summary)


def test_a_claim_naming_a_queue_twice_takes_each_job_once(conn):
    drainer.enqueue_many(conn, "capped", [{}] * 10)
    drainer.enqueue_many(conn, "plain", [{}] * 3)
    capped = Limits("capped", concurrency=3)
    jobs = roundtrip.claim(conn, ["plain", "plain"], 10, timedelta(minutes=5),
                           limited=[capped, capped], take=10)
    ids = [j.id for j in jobs]
    assert len(ids) == len(set(ids)) == 6, ids


BIG_TEXT = {
    # 4 MB each, stored compressed (a few kB).
    "long strings": "SELECT jsonb_build_object('blob', repeat('x', 4000000))",
    # A number is stored as a numeric and printed digit by digit: another producer's
    # '1e100000' is a few stored bytes and 100 kB of text (3 MB for 30 of them).
    "numbers that print long": "SELECT jsonb_agg('1e100000'::jsonb) "
                               "FROM generate_series(1, 30)",
}


@pytest.mark.parametrize("payload", BIG_TEXT.values(), ids=BIG_TEXT.keys())
def test_a_paused_drainer_never_holds_a_limits_lock_against_every_other_drainer(
        conn, db_url, payload):
    """A drainer paused (SIGSTOP, a GC pause, a sleeping laptop) while its limited
    claim's answer is on the way: the server wrote the answer before the COMMIT, and
    with big payloads it blocked, the socket full, while the transaction held the
    queue's limits lock: every other drainer's claim of that queue waited for as long as
    the worker was paused (its lease does not help: nothing of it had committed). Now
    payloads past 64 kB of text are read after the COMMIT."""
    conn.execute(RUNS)
    conn.execute(f"INSERT INTO jobs (queue, payload) SELECT 'capped', ({payload}) "
                 "FROM generate_series(1, 3)")
    me = conn.info.backend_pid

    def advisory_waiter() -> int | None:
        row = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = "
                           "current_database() AND wait_event = 'advisory' AND pid <> %s",
                           (me,)).fetchone()
        return row and row[0]

    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('drainer.limit'), "
                       "hashtext('capped'))")
        worker = subprocess.Popen(
            [sys.executable, "-m", "drainer", "drain", "--tasks", "limited", "--queue",
             "capped", "--concurrency", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=clean_env(DRAINER_DATABASE_URL=db_url))
        try:
            wait_until(advisory_waiter)
            worker.send_signal(signal.SIGSTOP)
            holder.commit()  # the paused worker's claim gets the lock now
            time.sleep(2)
            with psycopg.connect(db_url, autocommit=True) as other:
                other.execute("SET lock_timeout = '3s'")
                try:
                    roundtrip.claim(other, [], 10, timedelta(minutes=5),
                                    limited=[Limits("capped", concurrency=3)], take=3)
                    blocked = None
                except drainer.DrainerError as exc:
                    blocked = str(exc)
        finally:
            worker.send_signal(signal.SIGCONT)
            worker.communicate(timeout=120)
    assert blocked is None, blocked


def test_a_limited_claim_reads_big_payloads_after_its_commit_whole_and_in_order(
        conn, monkeypatch):
    """Payloads past the answer's first 64 kB, and JSON nulls, are read once the claim
    committed: every job still comes with its own payload, in claim order."""
    read: list[list[int]] = []
    run = sql.run

    def spied(target, name, params=None):
        if name == "claimed_payloads":
            read.append(params["ids"])
        return run(target, name, params)

    monkeypatch.setattr(sql, "run", spied)
    big = {"blob": os.urandom(20_000).hex()}  # 40 kB that compression leaves as it is
    payloads = [{"n": 0}, big, None, {"n": 3}, {**big, "n": 4}, {"n": 5}]
    drainer.enqueue_many(conn, "capped", payloads)
    jobs = roundtrip.claim(conn, [], 10, timedelta(minutes=5),
                           limited=[Limits("capped", concurrency=10)], take=10)
    assert [job.payload for job in jobs] == payloads
    ids = [job.id for job in jobs]
    # Read after the commit: the JSON null (None, as a payload left out), and all past
    # the first 64 kB (the second 40 kB one, and the small one after it).
    assert read == [[ids[2], ids[4], ids[5]]]


@pytest.fixture
def failing_read(conn, db_url, monkeypatch) -> list[model.Job]:
    """The read of a limited claim's big payloads, once it committed, fails (a
    statement timeout behind another session's lock; a cancel does the same), and just
    before it another drainer claims the queue `plain`: what it took."""
    conn.execute("SET statement_timeout = '500ms'")
    other_claim: list[model.Job] = []
    run = sql.run

    def at_the_read(target, name, params=None):
        if name != "claimed_payloads":
            return run(target, name, params)
        with psycopg.connect(db_url, autocommit=True) as other:
            other_claim.extend(roundtrip.claim(other, ["plain"], 1, timedelta(minutes=5)))
        with psycopg.connect(db_url) as holder:  # e.g. a migration's ALTER TABLE
            holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
            try:
                return run(target, name, params)
            finally:
                holder.rollback()

    monkeypatch.setattr(sql, "run", at_the_read)
    return other_claim


def test_a_failed_payload_read_after_the_commit_does_not_send_the_release_again(
        conn, failing_read):
    """settle() wrote a batch back (job `u` released unstarted) with a limited claim
    whose big payload is read once the transaction committed, and that read failed.
    The write-back had landed, but settle took the error for a rolled-back transaction
    and sent it all again, release included: by then another drainer had claimed `u`
    (the same token: a release gives its attempt back), and the second release took it
    from under that drainer's running handler, for a third to run it again."""
    drainer.enqueue(conn, "capped", {"blob": "x" * 100_000})
    drainer.enqueue(conn, "plain", {"n": 1})
    [u] = roundtrip.claim(conn, ["plain"], 1, timedelta(minutes=5))
    with pytest.raises(drainer.DrainerError):
        roundtrip.settle(conn, [], (), [u], claim_next=Claim(
            [], 10, timedelta(minutes=5), [Limits("capped", concurrency=3)], take=3))
    assert [j.token for j in failing_read] == [u.token]  # the other drainer holds u
    assert conn.execute("SELECT status, attempts FROM jobs WHERE id = %s",
                        (u.id,)).fetchone() == ("running", u.attempts)


def test_jobs_whose_payload_read_failed_after_the_commit_are_given_back(conn, failing_read):
    """The same failed read in roundtrip.claim(): the claim committed, the caller gets an
    error and no job, and the jobs stayed 'running', an attempt spent, holding their
    limit's places until their lease ran out (with max_attempts=1, failed for good by
    the reaper, never run). They are given back."""
    drainer.enqueue(conn, "capped", {"blob": "x" * 100_000}, max_attempts=1)
    with pytest.raises(drainer.DrainerError):
        roundtrip.claim(conn, [], 10, timedelta(minutes=5),
                        limited=[Limits("capped", concurrency=3)], take=3)
    assert conn.execute("SELECT status, attempts FROM jobs").fetchall() == [("queued", 0)]


def test_a_limited_queues_lease_end_of_minus_infinity_does_not_break_next_due(conn):
    """Another producer's lease end of '-infinity' (as the stats commit allows):
    next_due clamps it to now, but due_limited's lease end went to Python as is, and
    psycopg cannot load a timestamp before year 1: the drain's end raised."""
    drainer.enqueue(conn, "lim", {})
    conn.execute("UPDATE jobs SET status = 'running', attempts = 1, "
                 "locked_until = '-infinity'")
    due = admin.due(conn, [], limited=[Limits("lim", concurrency=2)])
    assert due.next_due == due.now and due.lease_end == due.now, due
