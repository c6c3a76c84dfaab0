"""`drainer pause` and `resume`: what they print and refuse, how `stats` and `doctor`
show a paused queue, and a running `work` that notices a pause at its next claim and
is woken by the resume. Real processes on a real PostgreSQL."""

import json

import psycopg

import drainer
from drainer.commands import doctor, stats
from drainer.storage import pauses
from tests.commands.test_worker import idle_worker, stop, worker
from tests.helpers import HAND_MADE_TABLE, count, run_cli, wait_until


def cli(db_url: str, *args: str) -> tuple[int, dict | None, str]:
    proc = run_cli(*args, "--database-url", db_url)
    out = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, out, proc.stderr


def test_pause_and_resume_print_what_changed(conn, db_url):
    drainer.enqueue_many(conn, "mail", [{}] * 2)
    assert cli(db_url, "pause", "mail")[:2] == (0, {"queue": "mail", "paused": True,
                                                   "changed": True})
    code, out, err = cli(db_url, "pause", "mail")
    assert (code, out["changed"]) == (0, False) and "paused already" in err
    assert "no ready job" not in err
    code, out, err = cli(db_url, "pause", "mial")  # a typo: paused, and said to be empty
    assert (code, out["changed"]) == (0, True) and "'mial' has no ready job" in err
    pauses.resume(conn, "mial")
    assert [p.queue for p in pauses.paused(conn)] == ["mail"]
    assert cli(db_url, "resume", "mail")[:2] == (0, {"queue": "mail", "paused": False,
                                                    "changed": True})
    code, out, err = cli(db_url, "resume", "mail")
    assert (code, out["changed"]) == (0, False) and "was not paused" in err
    assert pauses.paused(conn) == []


def test_a_bad_queue_name_is_a_usage_error(db_url):
    for command in ("pause", "resume"):
        code, out, err = cli(db_url, command, "")
        assert (code, out) == (2, None) and "a queue name must be a non-empty string" in err


def test_pause_on_a_table_without_the_migration_exits_2_saying_to_migrate(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE)
    for command in ("pause", "resume"):
        code, out, err = cli(empty_db_url, command, "mail")
        assert (code, out) == (2, None) and "run `drainer migrate`" in err, err


def test_stats_and_doctor_show_a_paused_queue(conn, db_url):
    drainer.enqueue_many(conn, "mail", [{}] * 3)
    conn.execute("UPDATE jobs SET run_at = now() - interval '2 hours'")
    pauses.pause(conn, "mail")
    [paused] = stats.stats(conn)["paused"]
    assert (paused["queue"], paused["ready"]) == ("mail", 3)
    text = run_cli("stats", "--database-url", db_url).stdout
    assert "paused queues" in text and "mail: paused since" in text
    assert "3 ready job(s) wait (`drainer resume mail`)" in text
    found = {f.check: f for f in doctor.diagnose(conn, max_ready_age=60)}
    assert found["paused"].severity == "note" and "mail" in found["paused"].summary
    assert "oldest_ready" not in found  # its jobs wait as meant
    pauses.resume(conn, "mail")
    found = {f.check: f for f in doctor.diagnose(conn, max_ready_age=60)}
    assert "paused" not in found and "oldest_ready" in found
    assert stats.stats(conn)["paused"] == []


def test_a_running_worker_notices_a_pause_at_its_next_claim_and_a_resume_wakes_it(
        conn, db_url, tmp_path):
    first, gate, second = (tmp_path / name for name in ("first", "gate", "second"))
    with worker(db_url, "--poll-interval", "3600", "--batch-size", "1",
                "--concurrency", "1") as proc:  # only a notification can wake it
        idle_worker(conn, tmp_path)
        drainer.enqueue(conn, "default", {"touch": str(first), "wait_for": str(gate)})
        wait_until(first.exists)  # its handler runs: the worker claims next once it ends
        drainer.enqueue(conn, "default", {"touch": str(second)})
        pauses.pause(conn, "default")
        gate.touch()
        # the first job's write-back and the next claim are one transaction
        wait_until(lambda: count(conn, "status = 'done'") == 2)
        assert count(conn, "status = 'queued'") == 1 and not second.exists()
        assert run_cli("resume", "default", "--database-url", db_url).returncode == 0
        wait_until(second.exists)
        wait_until(lambda: count(conn, "status = 'done'") == 3)
        totals, _ = stop(proc)
    assert totals["done"] == 3
