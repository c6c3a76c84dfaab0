"""`stats`: the rate of done jobs over the last hour (migration 5's done_at, set by
drainer's write-back, and by a trigger for other writers) and the text chart of queue
depth."""

import json
import re
from datetime import timedelta

import psycopg

import drainer
from drainer.commands import stats as stats_command
from drainer.db import connect
from drainer.storage import fleets
from tests.helpers import HAND_MADE_TABLE, run_cli

LEASE = timedelta(minutes=5)


def drain_some(conn: psycopg.Connection, queue: str, n: int) -> None:
    drainer.enqueue_many(conn, queue, [{}] * n)
    summary = drainer.drain(conn, {queue: lambda job: None}, drainer.Options(queues=[queue]))
    assert summary.done == n


def test_done_at_is_set_at_completion_only(conn):
    drainer.enqueue(conn, "default", {})
    [job] = drainer.claim(conn, ["default"], 1, LEASE)
    drainer.extend(conn, [job], LEASE)
    assert conn.execute("SELECT done_at FROM jobs").fetchone()[0] is None
    drainer.complete(conn, [job])
    fresh = conn.execute("SELECT done_at BETWEEN now() - interval '1 minute' AND now() "
                         "FROM jobs").fetchone()[0]
    assert fresh


def test_the_write_back_sets_done_at_and_the_trigger_serves_other_writers(conn):
    """The trigger's function, made to count its calls: a drain's write-back sets
    done_at itself and never calls it (it cost a tenth of the server's time per no-op
    job); an UPDATE that marks a job done and leaves done_at as it was (a hand-written
    one, a release before this one) still gets it set, once."""
    conn.execute("CREATE TABLE done_at_calls (id bigint)")
    conn.execute("""CREATE OR REPLACE FUNCTION jobs_done_at() RETURNS trigger
                    LANGUAGE plpgsql AS $$
                    BEGIN
                      INSERT INTO done_at_calls VALUES (NEW.id);
                      NEW.done_at := now();
                      RETURN NEW;
                    END; $$""")
    drain_some(conn, "mail", 20)
    assert conn.execute("SELECT count(*) FROM done_at_calls").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM jobs WHERE done_at BETWEEN "
                        "now() - interval '1 minute' AND now()").fetchone()[0] == 20
    by_hand = drainer.enqueue(conn, "mail", {})
    conn.execute("UPDATE jobs SET status = 'done' WHERE id = %s", [by_hand])
    assert conn.execute("SELECT count(*), min(j.done_at) IS NOT NULL FROM done_at_calls c "
                        "JOIN jobs j USING (id)").fetchone() == (1, True)


def test_done_in_the_last_hour_per_queue(conn, db_url):
    drain_some(conn, "mail", 30)
    drain_some(conn, "sms", 5)
    conn.execute("UPDATE jobs SET done_at = now() - interval '2 hours' WHERE id <= 10")
    drainer.enqueue_many(conn, "mail", [{}] * 7)  # queued: depth, not done
    data = json.loads(run_cli("stats", "--json", "--database-url", db_url).stdout)
    assert data["done_last_hour"] == {"mail": 20, "sms": 5}
    text = run_cli("stats", "--database-url", db_url).stdout
    assert "done in the last hour: 25 (0.01/s), mail 20, sms 5" in text


def test_a_hand_made_table_drains_and_says_the_rate_is_unknown(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
        drain_some(conn, "default", 3)
        data = stats_command.stats(conn)
    assert data["done_last_hour"] is None
    assert "unknown (run `drainer migrate`" in stats_command.format_stats(data)


def test_the_depth_chart_scales_bars_by_status_per_queue():
    rows = [{"queue": q, "status": s, "jobs": n, "oldest_ready_seconds": None,
             "expired_leases": 0}
            for q, s, n in [("a", "done", 9000), ("a", "queued", 400), ("a", "running", 10),
                            ("bb", "failed", 200), ("bb", "queued", 4)]]
    data = {"queues": rows, "done_last_hour": {}, "table": {
        "n_live_tup": 0, "n_dead_tup": 0, "last_autovacuum": None, "last_vacuum": None}}
    chart = stats_command.format_stats(data).split("queue depth")[1].splitlines()[1:5]
    assert chart == [
        "a   queued   400  " + "#" * 40,
        "    running   10  #",
        "bb  queued     4  #",
        "    failed   200  " + "#" * 20,
    ]


def _strict(constant: str) -> float:
    raise ValueError(f"{constant} is not JSON")


def test_times_of_minus_infinity_from_another_producer_give_ages_json_can_hold(conn, db_url):
    """Another producer's run_at and lease end of '-infinity': the ages run from the
    jobs' creation, and `stats --json` and `doctor --json` stay JSON
    (Python's json would print Infinity, which no other parser reads)."""
    drainer.enqueue(conn, "odd", {})
    drainer.enqueue(conn, "odd", {})
    conn.execute("UPDATE jobs SET run_at = '-infinity', created_at = now() - interval '1 hour'"
                 " WHERE id = 1")
    conn.execute("UPDATE jobs SET status = 'running', locked_until = '-infinity', "
                 "created_at = now() - interval '2 hours' WHERE id = 2")
    stats = json.loads(run_cli("stats", "--json", "--database-url", db_url).stdout,
                       parse_constant=_strict)
    [ready] = [q for q in stats["queues"] if q["status"] == "queued"]
    assert 3600 <= ready["oldest_ready_seconds"] < 3700
    doctor = run_cli("doctor", "--json", "--database-url", db_url)
    found = json.loads(doctor.stdout, parse_constant=_strict)
    [expired] = [f for f in found["findings"] if f["check"] == "expired_leases"]
    seconds = re.search(r"the oldest (\d+)s ago", expired["summary"])
    assert seconds and 7200 <= int(seconds[1]) < 7300, expired["summary"]


def test_a_creation_time_of_minus_infinity_gives_an_age_json_can_hold(conn, db_url):
    """A producer that writes '-infinity' for "as early as can be" may write it in
    created_at too: the age of such a job runs from now."""
    drainer.enqueue(conn, "odd", {})
    conn.execute("UPDATE jobs SET run_at = '-infinity', created_at = '-infinity'")
    stats = json.loads(run_cli("stats", "--json", "--database-url", db_url).stdout,
                       parse_constant=_strict)
    assert [q["oldest_ready_seconds"] for q in stats["queues"]] == [0.0]
    doctor = run_cli("doctor", "--json", "--database-url", db_url)
    json.loads(doctor.stdout, parse_constant=_strict)


# --- stats after a burst ----------------------------------------------------------------

def test_stats_counts_the_rows_and_labels_the_vacuum_statistics_as_an_estimate(db_url):
    lines = "".join(json.dumps({"i": i}) + "\n" for i in range(305))
    assert run_cli("enqueue", "burst", "--database-url", db_url, input=lines).returncode == 0
    with connect(db_url) as conn:
        conn.execute("UPDATE jobs SET status = 'done' WHERE id % 5 = 0")
    text = run_cli("stats", "--database-url", db_url).stdout
    assert "jobs table: 305 rows" in text.splitlines()
    [health] = [line for line in text.splitlines() if "dead tuples" in line]
    assert health.startswith("vacuum statistics (PostgreSQL's estimate, updated lazily): ")
    assert re.search(r": \d+ live, \d+ dead tuples; last autovacuum .+, last vacuum ", health)


def test_stats_shows_each_fleet_its_members_and_target(conn, db_url):
    assert stats_command.stats(conn)["fleets"] == []  # no drain has widened here
    fleets.change(conn, "mail", lambda f: f.joined("gone", -1))  # its lease is over
    fleets.change(conn, "mail", lambda f: f.joined("a", 300))
    fleets.change(conn, "mail", lambda f: f.joined("b", 300).widened(1, 60)[0])
    data = json.loads(run_cli("stats", "--json", "--database-url", db_url).stdout)
    assert data["fleets"] == [{"fleet": "mail", "running": 2, "starting": 1, "target": 3,
                               "peak": 2}]
    text = run_cli("stats", "--database-url", db_url).stdout
    assert "  mail: 2 running, 1 starting, target width 3 (most at once: 2)" in text
