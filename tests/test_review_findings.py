"""A hostile review of task policies, results, cancel, archiving failed jobs and
schedules: each test is one probe that failed before its fix (or a regression test of
a promise the probe found held), on a real PostgreSQL."""

import json
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import drainer
from drainer import model, schedules
from drainer.run import Options, drain
from drainer.schedules import Schedule
from drainer.storage import roundtrip, writeback
from tests.helpers import at, count, wait_until

LEASE = timedelta(minutes=5)






def add_job(conn: psycopg.Connection, queue_: str, meta: object) -> int:
    """A ready job as another producer wrote it, with this meta (jsonb, any shape)."""
    return conn.execute(
        "INSERT INTO jobs (queue, payload, run_at, meta) VALUES (%s, '{}', now(), %s::jsonb) "
        "RETURNING id", (queue_, json.dumps(meta))).fetchone()[0]


# --- schedules: a slot job's meta written by another producer ------------------------

ODD_METAS = [
    {"schedule": "x", "slot": "garbage"},
    {"schedule": "x", "slot": "2026-05-01T00:00:00"},  # no offset: naive
    {"schedule": "x", "slot": "9999-12-31T23:59:59.999999+00:00"},
    {"schedule": "x", "slot": "0001-01-01T00:00:00+00:00"},
    {"schedule": ["x"], "slot": "2026-05-01T00:00:00+00:00"},  # unhashable name
    {"schedule": {"x": 1}, "slot": "2026-05-01T00:00:00+00:00"},
    {"schedule": "x", "slot": 5},
    {"schedule": "x"},
    "a string",
    [1, 2],
]


@pytest.mark.parametrize("meta", ODD_METAS, ids=lambda m: json.dumps(m)[:40])
def test_an_odd_slot_meta_never_stops_the_drain_nor_its_batch(conn, declared, meta):
    schedules.declare(Schedule("x", "sx", "@daily"))
    odd = add_job(conn, "sx", meta)
    others = [add_job(conn, "sx", {"tenant": n}) for n in range(3)]
    seen: list = []

    with at(datetime(2026, 5, 1, 12, tzinfo=UTC)):
        conn.execute("UPDATE jobs SET run_at = %s", [datetime(2026, 5, 1, 11, tzinfo=UTC)])
        summary = drain(conn, {"sx": lambda job: seen.append(job.id)},
                        Options(["sx"], batch_size=2))
    assert sorted(seen) == sorted([odd, *others])
    assert summary.done == 4
    assert count(conn, "status = 'done'") == 4
    # The schedule's own next slot is queued, nothing else came of the odd one.
    assert count(conn, "status = 'queued'") == 1


def test_scheduled_for_is_none_for_a_slot_no_schedule_wrote(conn):
    def job(meta: object) -> model.Job:
        return model.Job(1, "q", {}, 1, 5, meta)

    assert job({"schedule": "x", "slot": "garbage"}).scheduled_for is None
    assert job({"schedule": "x", "slot": "2026-05-01T00:00:00"}).scheduled_for is None
    assert job({"schedule": "x", "slot": "2026-05-01T02:00:00+02:00"}).scheduled_for == (
        datetime(2026, 5, 1, tzinfo=UTC))


# --- schedules: two write-backs with slots of two schedules --------------------------


def lock_waiter(conn: psycopg.Connection, pid: int) -> bool:
    return conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                        [pid]).fetchone() == (True,)


def test_two_write_backs_taking_two_schedules_in_opposite_orders_do_not_deadlock(
        conn, db_url, declared):
    """A batch records its slot jobs' schedules (schedule_ran, schedule_enqueue) in the
    same implicit transaction as its completions: if two drainers lock two schedule
    rows in opposite orders, one deadlocks, and its whole write-back, completions
    included, rolls back: its jobs run again after their leases (done twice)."""
    one, two = Schedule("s1", "dl", "@hourly"), Schedule("s2", "dl", "@hourly")
    schedules.declare(one)
    schedules.declare(two)
    schedules.reconcile(conn, [one, two], ["dl"])
    conn.execute("DELETE FROM jobs")
    slot = "2026-01-01T00:00:00+00:00"
    for name in ("s1", "s2", "s1", "s2"):
        add_job(conn, "dl", {"schedule": name, "slot": slot})
    jobs = drainer.claim(conn, ["dl"], 4, LEASE)
    by = {(j.meta["schedule"], n): j for n, j in enumerate(jobs)}
    s1 = [j for j in jobs if j.meta["schedule"] == "s1"]
    s2 = [j for j in jobs if j.meta["schedule"] == "s2"]
    assert len(by) == 4 and len(s1) == len(s2) == 2
    first, second = [s1[0], s2[0]], [s2[1], s1[1]]  # their `ran` orders: opposite
    now = datetime.now(UTC)
    errors: list[BaseException] = []

    def write_back(ran: list[model.Job], c: psycopg.Connection) -> None:
        try:
            roundtrip.settle(c, ran, (), (), also=lambda cc: schedules.after_run(cc, ran, now))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    with psycopg.connect(db_url, autocommit=True) as holder, \
            psycopg.connect(db_url, autocommit=True) as a, \
            psycopg.connect(db_url, autocommit=True) as b:
        # `holder` keeps s1 locked until both write-backs wait: then the first takes
        # s1 and waits for s2, which the second took before it asked for s1.
        holder.execute("BEGIN")
        holder.execute("SELECT FROM drainer_schedules WHERE name = 's1' FOR UPDATE")
        ta = threading.Thread(target=write_back, args=(first, a))
        ta.start()
        wait_until(lambda: lock_waiter(conn, a.info.backend_pid))
        tb = threading.Thread(target=write_back, args=(second, b))
        tb.start()
        wait_until(lambda: lock_waiter(conn, b.info.backend_pid))
        holder.execute("COMMIT")
        ta.join(30)
        tb.join(30)
    assert count(conn, "status = 'done'") == 4  # before: 2, the other two still running
    assert errors == []


# --- schedules: declarations ---------------------------------------------------------


def test_a_schedule_name_that_is_not_valid_unicode_is_a_configuration_error(declared):
    with pytest.raises(drainer.ConfigError):
        Schedule("tick\ud800", "q", "@daily")


# --- archiving failed jobs: their retention starts when they fail -------------------


def test_a_job_that_waited_past_the_retention_is_not_archived_as_it_fails(conn):
    """A job due 40 days ago (a backlog, a job enqueued for a date past) that fails now
    must stay for the failed retention (30 days), not leave `jobs` in the same drain;
    without the archive table it would be deleted then."""
    job_id = drainer.enqueue(conn, "late", {}, run_at=datetime.now(UTC) - timedelta(days=40),
                             max_attempts=1)

    def handler(job):
        raise RuntimeError("boom")

    summary = drain(conn, {"late": handler}, Options(["late"]))
    assert (summary.failed, summary.archived) == (1, 0)
    assert count(conn, f"id = {job_id} AND status = 'failed'") == 1


def test_a_job_cancelled_after_waiting_past_the_retention_stays_for_it(conn):
    job_id = drainer.enqueue(conn, "late", {}, run_at=datetime.now(UTC) - timedelta(days=40))
    assert drainer.cancel(conn, [job_id]) == [job_id]
    assert drainer.archive(conn, timedelta(days=7)) == 0
    assert count(conn, f"id = {job_id} AND last_error = 'cancelled'") == 1


def test_a_lease_failed_for_good_by_the_reaper_stays_for_the_retention(conn):
    conn.execute("INSERT INTO jobs (payload, status, attempts, max_attempts, run_at, "
                 "locked_until) VALUES ('{}', 'running', 5, 5, now() - interval '40 days', "
                 "now() - interval '1 minute')")
    assert drainer.reap(conn) == 1
    assert drainer.archive(conn, timedelta(days=7)) == 0
    assert count(conn, "status = 'failed'") == 1


# --- snooze at the integer limit -----------------------------------------------------


def test_a_lost_write_back_recognises_a_snooze_at_the_largest_budget(conn):
    """max_attempts at 2147483647 cannot rise: a snooze that landed leaves it as it was,
    and must still be told from a write that did not land."""
    drainer.enqueue(conn, "z", {}, max_attempts=2147483647)
    [job] = drainer.claim(conn, ["z"], 1, LEASE)
    snooze = [(job, model.Setback("Snooze: later", "snooze", timedelta(seconds=5)))]
    first = roundtrip.settle(conn, (), snooze, ())
    assert first.failed[job.token].status == "queued"
    again = writeback.settle_again(conn, (), snooze)
    assert again.failed.get(job.token, (None,))[0] == "queued"


def test_a_snooze_at_the_integer_limit_ends_failed_saying_why_and_the_batch_goes_on(conn):
    """Snoozing for ever raises the budget to its cap, never attempts past the integer
    limit: the claim fails the job alone, saying why, and its batch goes on."""
    stuck = drainer.enqueue(conn, "zz", {"snooze": True}, max_attempts=2147483647)
    conn.execute("UPDATE jobs SET attempts = 2147483646 WHERE id = %s", [stuck])
    for _ in range(2):
        drainer.enqueue(conn, "zz", {})

    def handler(job):
        if job.payload.get("snooze"):
            raise drainer.Snooze(delay=0)

    first = drain(conn, {"zz": handler}, Options(["zz"]))
    assert first.done == 2
    assert conn.execute("SELECT status, attempts, max_attempts FROM jobs WHERE id = %s",
                        [stuck]).fetchone() == ("queued", 2147483647, 2147483647)
    conn.execute("UPDATE jobs SET run_at = now() WHERE id = %s", [stuck])
    more = drainer.enqueue(conn, "zz", {})
    second = drain(conn, {"zz": handler}, Options(["zz"]))
    assert second.done == 1 and count(conn, f"id = {more} AND status = 'done'") == 1
    status, error = conn.execute("SELECT status, last_error FROM jobs WHERE id = %s",
                                 [stuck]).fetchone()
    assert status == "failed" and "integer limit" in error
