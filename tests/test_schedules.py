"""Schedules on a real PostgreSQL: slots across daylight-saving changes and month ends,
the catch-up modes after a gap, changed and removed schedules, concurrent drainers
around one slot. Time is frozen by freezegun, and the database is told the same
time (`drainer.clock.database_now`, the seam every statement's `now` comes from)."""

import json
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import psycopg
import pytest

import drainer
from drainer import clock, model, schedules, tasks
from drainer.model import Job
from drainer.run import Options, drain
from drainer.schedules import Schedule
from drainer.storage import roundtrip
from tests.helpers import at, clean_env, count, run_cli, summary_of, wait_until

PARIS, NEW_YORK = ZoneInfo("Europe/Paris"), ZoneInfo("America/New_York")


def slot_jobs(conn: psycopg.Connection, name: str | None = None) -> list[tuple]:
    """(status, slot as the job's meta says, run_at in UTC) of each slot job, in order."""
    return conn.execute(
        "SELECT status, meta ->> 'slot', run_at FROM jobs WHERE meta ? 'schedule' "
        "AND (%s::text IS NULL OR meta ->> 'schedule' = %s) ORDER BY run_at, id",
        (name, name)).fetchall()


def run_slots(conn, schedule: Schedule, start: datetime, count: int, seen: list) -> None:
    """Drain at each queued slot's time in turn, `count` times, recording the slots
    the handler saw (`job.scheduled_for`)."""
    @drainer.task(schedule.queue)
    def handler(job):
        seen.append(job.scheduled_for)

    schedules.declare(schedule)
    with at(start):
        drain(conn, {schedule.queue: handler}, Options([schedule.queue]))
    for _ in range(count):
        (due,) = conn.execute("SELECT min(run_at) FROM jobs WHERE status = 'queued'").fetchone()
        with at(due):
            drain(conn, {schedule.queue: handler}, Options([schedule.queue]))


@pytest.mark.parametrize(("cron", "tz", "start", "expected"), [
    # Paris, clocks forward on 2026-03-29 at 02:00: the 02:30 slot runs at 03:00.
    ("30 2 * * *", "Europe/Paris", datetime(2026, 3, 27, 12, tzinfo=PARIS),
     ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00",
      "2026-03-30T02:30:00+02:00"]),
    # Paris, clocks back on 2026-10-25 at 03:00: the 02:30 slot runs once.
    ("30 2 * * *", "Europe/Paris", datetime(2026, 10, 23, 12, tzinfo=PARIS),
     ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00",
      "2026-10-26T02:30:00+01:00"]),
    # New York, forward on 2026-03-08 and back on 2026-11-01, every 30 minutes (a
    # minute field starting with *): the wall clock's own times, so none in the hour
    # that is skipped, and both folds of the one that repeats.
    ("*/30 1-2 * * *", "America/New_York", datetime(2026, 3, 8, 0, 45, tzinfo=NEW_YORK),
     ["2026-03-08T01:00:00-05:00", "2026-03-08T01:30:00-05:00",
      "2026-03-09T01:00:00-04:00", "2026-03-09T01:30:00-04:00"]),
    ("*/30 1 * * *", "America/New_York", datetime(2026, 11, 1, 0, 45, tzinfo=NEW_YORK),
     ["2026-11-01T01:00:00-04:00", "2026-11-01T01:30:00-04:00",
      "2026-11-01T01:00:00-05:00", "2026-11-01T01:30:00-05:00"]),
    # Month ends: the 31st skips the months without one; @monthly is the 1st at 00:00.
    ("0 12 31 * *", "UTC", datetime(2026, 1, 15, tzinfo=UTC),
     ["2026-01-31T12:00:00+00:00", "2026-03-31T12:00:00+00:00",
      "2026-05-31T12:00:00+00:00"]),
    ("@monthly", "UTC", datetime(2026, 1, 31, 23, 59, tzinfo=UTC),
     ["2026-02-01T00:00:00+00:00", "2026-03-01T00:00:00+00:00"]),
    ("@hourly", "Europe/Paris", datetime(2026, 3, 29, 0, 30, tzinfo=PARIS),
     ["2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00",
      "2026-03-29T04:00:00+02:00"]),
])
def test_slots_follow_the_clock_of_their_zone(conn, declared, cron, tz, start, expected):
    seen: list = []
    run_slots(conn, Schedule("s", "s", cron, tz), start, len(expected), seen)
    assert [slot.isoformat() for slot in seen] == expected
    # Each slot ran at its moment, once, and the next is queued.
    assert [row[1] for row in slot_jobs(conn)[:len(expected)]] == expected
    assert [row[0] for row in slot_jobs(conn)] == ["done"] * len(expected) + ["queued"]


@pytest.mark.parametrize(("catch_up", "ran"), [
    ("latest", ["2026-05-02T09:00:00+00:00"]),
    ("all", [f"2026-05-{d:02d}T{h:02d}:00:00+00:00" for d, h in (
        (1, 15), (1, 18), (1, 21), (2, 0), (2, 3), (2, 6), (2, 9))]),
    ("none", []),
])
def test_each_catch_up_mode_after_a_day_with_nothing_running(conn, declared, catch_up, ran):
    every3h = Schedule("c", "c", "0 */3 * * *", catch_up=catch_up)
    seen: list = []

    @drainer.task("c")
    def handler(job):
        seen.append(job.scheduled_for.isoformat())

    schedules.declare(every3h)
    with at(datetime(2026, 5, 1, 10, tzinfo=UTC)):
        drain(conn, {"c": handler}, Options(["c"]))  # queues 12:00
    conn.execute("DELETE FROM jobs")  # the slot's job is lost: nothing runs for a day
    with at(datetime(2026, 5, 2, 10, 30, tzinfo=UTC)):
        drain(conn, {"c": handler}, Options(["c"]))
    assert seen == ran
    assert slot_jobs(conn)[-1][:2] == ("queued", "2026-05-02T12:00:00+00:00")


def test_catch_up_all_is_bounded(conn, declared):
    minutely = Schedule("m", "m", "* * * * *", catch_up="all")
    schedules.declare(minutely)
    with at(datetime(2026, 5, 1, tzinfo=UTC)):
        schedules.reconcile(conn, [minutely], ["m"], now=clock.database_now())
        conn.execute("DELETE FROM jobs")
    with at(datetime(2026, 5, 2, tzinfo=UTC)):
        schedules.reconcile(conn, [minutely], ["m"], now=clock.database_now())
    jobs = slot_jobs(conn)
    assert len(jobs) == schedules.MAX_CATCH_UP + 1  # the latest 100 missed, and the next
    assert jobs[-2][1] == "2026-05-02T00:00:00+00:00"
    assert jobs[-1][1] == "2026-05-02T00:01:00+00:00"


def test_a_slot_runs_once_however_often_it_is_seen_even_after_archiving(conn, declared):
    daily = Schedule("d", "d", "@daily")
    with at(datetime(2026, 6, 1, 12, tzinfo=UTC)):
        for _ in range(3):
            schedules.reconcile(conn, [daily], ["d"], now=clock.database_now())
    assert [r[1] for r in slot_jobs(conn)] == ["2026-06-02T00:00:00+00:00"]
    with at(datetime(2026, 6, 2, 0, 0, 5, tzinfo=UTC)):
        drain(conn, {"d": lambda job: None}, Options(["d"]))
        conn.execute("DELETE FROM jobs WHERE status = 'done'")  # archived: its key free
        for _ in range(3):
            schedules.reconcile(conn, [daily], ["d"], now=clock.database_now())
    assert [r[1] for r in slot_jobs(conn)] == ["2026-06-03T00:00:00+00:00"]


def test_a_changed_schedule_moves_and_a_removed_one_goes(conn, declared):
    old = Schedule("r", "r", "0 3 * * *")
    with at(datetime(2026, 7, 1, 12, tzinfo=UTC)):
        schedules.reconcile(conn, [old], ["r"], now=clock.database_now())
        assert [r[1] for r in slot_jobs(conn)] == ["2026-07-02T03:00:00+00:00"]
        new = Schedule("r", "r", "0 5 * * *", tz="Europe/Paris")
        schedules.reconcile(conn, [new], ["r"], now=clock.database_now())
        assert [r[1] for r in slot_jobs(conn)] == ["2026-07-02T05:00:00+02:00"]
        # Older code still running during the deploy leaves the new definition alone.
        schedules.reconcile(conn, [old], ["r"], now=clock.database_now())
        assert [r[1] for r in slot_jobs(conn)] == ["2026-07-02T05:00:00+02:00"]
        # A drain of another queue withdraws nothing; one of its queue does.
        schedules.reconcile(conn, [], ["other"], withdraw=["other"], now=clock.database_now())
        assert len(slot_jobs(conn)) == 1
        schedules.reconcile(conn, [], ["r"], withdraw=["r"], now=clock.database_now())
        assert slot_jobs(conn) == []
        # Code that still declares it (an older deploy) does not bring it back ...
        schedules.reconcile(conn, [new], ["r"], now=clock.database_now())
        assert slot_jobs(conn) == []
        # ... a new definition does, and `--sync` (force) brings back an old one.
        schedules.reconcile(conn, [Schedule("r", "r", "0 6 * * *")], ["r"],
                            now=clock.database_now())
        assert [r[1] for r in slot_jobs(conn)] == ["2026-07-02T06:00:00+00:00"]
        schedules.reconcile(conn, [old], ["r"], force=True, now=clock.database_now())
        assert [r[1] for r in slot_jobs(conn)] == ["2026-07-02T03:00:00+00:00"]


def test_a_drain_without_the_queues_module_never_withdraws(conn, declared):
    kept = Schedule("k", "k", "@hourly")
    with at(datetime(2026, 7, 1, 12, tzinfo=UTC)):
        schedules.reconcile(conn, [kept], ["k"], now=clock.database_now())
        # drain() with a plain function for the queue: no task module was loaded.
        drain(conn, {"k": lambda job: None}, Options(["k"]))
    assert len(slot_jobs(conn)) == 1


def test_bad_declarations_are_configuration_errors(declared):
    for bad in ({"cron": "61 * * * *"}, {"cron": "@fortnightly"}, {"tz": "Mars/Olympus"},
                {"tz": "Europe"}, {"catch_up": "some"}, {"cron": "* * *"}):
        options = {"cron": "@daily", **bad}
        with pytest.raises(drainer.ConfigError):
            drainer.schedule("x", "x", options.pop("cron"), **options)
    with pytest.raises(drainer.BadInput):
        drainer.schedule("x", "x", "@daily", payload={1, 2})


def test_a_cron_of_six_fields_is_refused_where_it_is_declared(declared):
    # cronsim reads a sixth field as seconds: "*/5 * * * * *" would run every 5 seconds.
    six = "*/5 * * * * *"
    with pytest.raises(drainer.ConfigError, match=r"'\*/5 \* \* \* \* \*' \(6 fields"):
        drainer.schedule("often", "often", six)
    with pytest.raises(drainer.ConfigError, match=r"schedule 'often'.*6 fields"):
        drainer.task("often", cron=six)
    assert schedules.declared() == {} and tasks.registered() == {}


def test_a_task_with_cron_declares_its_own_schedule(conn, declared):
    @drainer.task("nightly", cron="0 3 * * *", tz="Europe/Paris", max_attempts=2)
    def nightly(job):
        return job.scheduled_for

    assert schedules.declared()["nightly"].cron == "0 3 * * *"
    with at(datetime(2026, 12, 3, 12, tzinfo=UTC)):
        drain(conn, {"nightly": nightly}, Options(["nightly"]))
    assert conn.execute("SELECT run_at, max_attempts, key, payload FROM jobs").fetchone() == (
        datetime(2026, 12, 4, 2, tzinfo=UTC), 2,
        "schedule:nightly@2026-12-04T02:00:00+00:00", {})


def test_schedules_on_a_table_without_migration_8_say_to_migrate(empty_db_url, declared):
    from tests.helpers import HAND_MADE_TABLE

    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE)
        drainer.schedule("h", "h", "@daily")
        with pytest.raises(drainer.ConfigError, match="drainer migrate"):
            drain(conn, {"h": lambda job: None}, Options(["h"]))


CONCURRENT = """
import sys
from datetime import datetime, UTC
import psycopg
from drainer import clock, schedules, tasks
clock.database_now = lambda: datetime(2026, 8, 1, 11, 59, 59, tzinfo=UTC)
daily = schedules.schedule("noon", "noon", "0 12 * * *")
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    sys.stdin.readline()  # all start together
    for _ in range(20):
        schedules.reconcile(conn, [daily], ["noon"], now=clock.database_now())
"""


def test_eight_drainers_around_one_slot_enqueue_it_once(conn, db_url):
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, db_url], stdin=subprocess.PIPE,
                              env=clean_env(), text=True) for _ in range(8)]
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    assert [proc.wait(60) for proc in procs] == [0] * 8
    assert [r[1] for r in slot_jobs(conn)] == ["2026-08-01T12:00:00+00:00"]


def test_the_slot_advance_refuses_a_stale_read(conn):
    """Two drainers read the same last slot and each sends the slot after it: the
    second's compare-and-set finds last_slot moved on and enqueues nothing. By then
    the first's job has run, so its key is free: nothing but the compare-and-set
    stands between that slot and a second job."""
    hourly = Schedule("h", "h", "@hourly")
    schedules.reconcile(conn, [hourly], ["h"], now=datetime(2026, 6, 1, 12, 30, tzinfo=UTC))
    later = datetime(2026, 6, 1, 13, 30, tzinfo=UTC)
    readers = [schedules.read(conn, ["h"], later)[1]["h"] for _ in range(2)]
    slots = [hourly.due(read.last_slot, later) for read in readers]
    assert slots == [[datetime(2026, 6, 1, 14, tzinfo=UTC)]] * 2

    assert len(schedules.enqueue(conn, hourly, slots[0]).fetchall()) == 1
    ran = drainer.claim(conn, ["h"], 10, timedelta(minutes=5), now=slots[0][0])
    assert drainer.complete(conn, ran) == {job.id for job in ran} and len(ran) == 2
    assert schedules.enqueue(conn, hourly, slots[1]).fetchall() == []
    assert [r[:2] for r in slot_jobs(conn)] == [("done", "2026-06-01T13:00:00+00:00"),
                                               ("done", "2026-06-01T14:00:00+00:00")]
    assert schedules.read(conn, ["h"], later)[1]["h"].last_slot == slots[0][0]


def test_the_cli_lists_and_syncs_schedules(conn, db_url):
    synced = run_cli("schedules", "--sync", "--tasks", "scheduled", "--database-url", db_url)
    assert synced.returncode == 0, synced.stderr
    listed = run_cli("schedules", "--json", "--database-url", db_url)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["schedules"]
    assert [(r["name"], r["queue"], r["cron"], r["tz"]) for r in rows] == [
        ("report", "report", "0 3 * * *", "Europe/Paris"),
        ("tick", "ticks", "*/5 * * * *", "UTC")]
    assert all(r["next_slot"] and r["last_job"] is None for r in rows)
    conn.execute("UPDATE jobs SET run_at = now()")
    drained = run_cli("drain", "--tasks", "scheduled", "--database-url", db_url)
    assert summary_of(drained.stdout)["done"] == 2, drained.stderr
    rows = json.loads(run_cli("schedules", "--json", "--database-url", db_url).stdout)[
        "schedules"]
    assert [r["last_status"] for r in rows] == ["done", "done"]
    shown = run_cli("schedules", "--database-url", db_url)
    assert "report" in shown.stdout and "Europe/Paris" in shown.stdout


def test_the_next_slot_is_next_due(conn, declared):
    every5 = Schedule("five", "five", "*/5 * * * *")
    schedules.declare(every5)
    with at(datetime(2026, 9, 1, 10, 1, tzinfo=UTC)):
        summary = drain(conn, {"five": lambda job: None}, Options(["five"]))
    assert summary.next_due == datetime(2026, 9, 1, 10, 5, tzinfo=UTC)
    with at(datetime(2026, 9, 1, 10, 5, 1, tzinfo=UTC)):
        summary = drain(conn, {"five": lambda job: None}, Options(["five"]))
    assert (summary.done, summary.next_due) == (1, datetime(2026, 9, 1, 10, 10, tzinfo=UTC))


@pytest.mark.parametrize(("odd", "slots"), [
    ("infinity", []),  # a last slot still to come: nothing more until redefined
    ("-infinity", ["2026-06-01T12:00:00+00:00", "2026-06-01T13:00:00+00:00"]),  # long past
])
def test_a_last_slot_set_to_an_infinity_by_hand_breaks_no_drain(conn, declared, odd, slots):
    hourly = Schedule("h", "h", "@hourly")
    with at(datetime(2026, 6, 1, 12, 30, tzinfo=UTC)):
        schedules.reconcile(conn, [hourly], ["h"], now=clock.database_now())
        conn.execute("DELETE FROM jobs")
        conn.execute("UPDATE drainer_schedules SET last_slot = %s::timestamptz", (odd,))
        schedules.declare(hourly)
        summary = drain(conn, {"h": lambda job: None}, Options(["h"]))
        [shown] = schedules.listed(conn)
    assert summary.stopped == "empty" and summary.done == len(slots[:1])
    assert [r[1] for r in slot_jobs(conn)] == slots
    assert shown["name"] == "h"


def test_scheduled_for_is_in_the_schedules_zone_across_a_daylight_saving_change(
        conn, declared):
    """`scheduled_for` carries the schedule's ZoneInfo, not the slot's fixed offset:
    a day later by local arithmetic is the same wall time, clocks changed or not."""
    seen: list = []
    noon = Schedule("noon", "noon", "0 12 * * *", "Europe/Paris")
    run_slots(conn, noon, datetime(2026, 3, 28, 9, tzinfo=UTC), 1, seen)
    [slot] = seen  # 2026-03-28 12:00 in Paris, the day before clocks go forward
    assert slot.tzinfo is PARIS
    next_day = slot + timedelta(days=1)
    assert next_day.isoformat() == "2026-03-29T12:00:00+02:00"
    assert next_day.astimezone(UTC) == datetime(2026, 3, 29, 10, tzinfo=UTC)


@pytest.mark.parametrize("zone", [None, 3, "", "Mars/Olympus", "Europe", "../etc", "a\x00b"])
def test_a_slot_whose_zone_no_schedule_wrote_keeps_its_offset(zone):
    """Another producer's meta: a zone that is missing or not one keeps the slot's own
    fixed offset, never an error."""
    meta = {"schedule": "x", "slot": "2026-05-01T02:00:00+02:00", "tz": zone}
    slot = Job(1, "q", {}, 1, 5, meta).scheduled_for
    assert slot is not None and slot.utcoffset() == timedelta(hours=2)
    assert slot == datetime(2026, 5, 1, tzinfo=UTC)


@pytest.mark.parametrize("catch_up", ["latest", "all"])
def test_a_slot_run_late_in_the_repeated_hour_catches_up_the_slot_it_overran(
        conn, declared, catch_up):
    """Every 30 minutes in Paris on 2026-10-25, as clocks go back at 03:00 CEST: the
    02:30 CEST slot's job (00:30 UTC), claimed by a drain that began before it was due,
    runs for 40 minutes, past the 02:00 CET slot (01:00 UTC). As on any other day, its
    write-back queues the slot it overran as its catch-up says, and the next. Judged in
    the schedule's zone, 02:00 CET looked earlier than 02:30 CEST (wall times of one
    zone compare without their pass) and was skipped for good."""
    half = Schedule("half", "half", "*/30 * * * *", "Europe/Paris", catch_up=catch_up)
    schedules.declare(half)
    with at(datetime(2026, 10, 25, 0, 20, tzinfo=UTC)):
        drain(conn, {"half": lambda job: None}, Options(["half"]))  # queues 02:30 CEST
    [job] = drainer.claim(conn, ["half"], 1, timedelta(hours=2))
    assert job.scheduled_for.astimezone(UTC) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    ended = datetime(2026, 10, 25, 1, 10, tzinfo=UTC)  # the database clock as it ends
    roundtrip.settle(conn, [job], (), (),
                     same_transaction=lambda c: schedules.after_run(c, [job], ended))
    assert [row[:2] for row in slot_jobs(conn)] == [
        ("done", "2026-10-25T02:30:00+02:00"), ("queued", "2026-10-25T02:00:00+01:00"),
        ("queued", "2026-10-25T02:30:00+01:00")]


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
            roundtrip.settle(c, ran, (), (),
                             same_transaction=lambda cc: schedules.after_run(cc, ran, now))
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
