"""Paused queues: no claim takes their jobs (plain, of many queues, limited), next_due
leaves them out, resuming lets them go; their schedules' slots, the reaper and
archiving go on."""

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import drainer
from drainer import clock, schedules
from drainer.errors import BadInput, ConfigError
from drainer.run import Options, drain
from drainer.schedules import Schedule
from drainer.storage import admin, pauses, roundtrip
from drainer.storage.claim import MANY_QUEUES
from drainer.storage.limits import Limits
from tests.helpers import HAND_MADE_TABLE, at, count

LEASE = timedelta(minutes=5)
MANY = [f"q{n}" for n in range(MANY_QUEUES + 1)]


def queues_claimed(conn: psycopg.Connection, queues: list[str]) -> set[str]:
    return {job.queue for job in roundtrip.claim(conn, queues, 100, LEASE)}


@pytest.mark.parametrize("queues", [["mail", "sms"], ["mail", "sms", *MANY]],
                         ids=["few queues", "many queues"])
def test_a_paused_queue_is_not_claimed_until_resumed(conn, queues):
    for queue in queues:
        drainer.enqueue_many(conn, queue, [{}] * 3)
    assert pauses.pause(conn, "mail") is True
    assert queues_claimed(conn, queues) == set(queues) - {"mail"}
    assert queues_claimed(conn, queues) == set()  # mail's jobs wait
    assert count(conn, "queue = 'mail' AND status = 'queued'") == 3
    assert pauses.resume(conn, "mail") is True
    assert queues_claimed(conn, queues) == {"mail"}


def test_pausing_twice_or_resuming_a_queue_not_paused_changes_nothing(conn):
    assert pauses.pause(conn, "mail") is True
    assert pauses.pause(conn, "mail") is False
    assert [p.queue for p in pauses.paused(conn)] == ["mail"]
    assert pauses.resume(conn, "mail") is True
    assert pauses.resume(conn, "mail") is False
    assert pauses.resume(conn, "never-paused") is False
    assert pauses.paused(conn) == []


def test_a_paused_limited_queue_takes_nothing(conn):
    drainer.enqueue_many(conn, "g", [{}] * 3)
    limited = [Limits("g", concurrency=5)]
    pauses.pause(conn, "g")
    assert roundtrip.claim(conn, [], 10, LEASE, limited=limited, take=5) == []
    assert admin.due(conn, [], limited=limited).next_due is None
    pauses.resume(conn, "g")
    assert len(roundtrip.claim(conn, [], 10, LEASE, limited=limited, take=5)) == 3


def test_next_due_leaves_a_paused_queue_out(conn):
    drainer.enqueue(conn, "mail", {})
    drainer.enqueue(conn, "sms", {})
    assert queues_claimed(conn, ["sms"]) == {"sms"}  # running: its lease end is a source
    drainer.enqueue(conn, "later", {}, delay=3600)
    for queue in ("mail", "sms", "later"):
        pauses.pause(conn, queue)
    due = admin.due(conn, ["mail", "sms", "later"])
    assert (due.next_due, due.run_at, due.lease_end) == (None, None, None)
    pauses.resume(conn, "mail")
    due = admin.due(conn, ["mail", "sms", "later"])
    assert due.next_due == due.now and due.lease_end is None


def test_a_running_drain_notices_at_its_next_claim(conn, db_url):
    drainer.enqueue_many(conn, "mail", [{}] * 5)
    ran = []

    def handler(job):
        if not ran:  # another session pauses the queue while the first batch runs
            with psycopg.connect(db_url, autocommit=True) as other:
                pauses.pause(other, "mail")
        ran.append(job.id)

    summary = drain(conn, {"mail": handler}, Options(["mail"], batch_size=1))
    assert (summary.done, len(ran), summary.next_due) == (1, 1, None)
    assert count(conn, "status = 'queued'") == 4


def test_a_paused_queues_schedule_still_queues_its_slots_which_wait(conn, declared):
    daily = Schedule("d", "d", "@daily")
    schedules.declare(daily)
    pauses.pause(conn, "d")
    with at(datetime(2026, 6, 2, 0, 0, 5, tzinfo=UTC)):
        schedules.reconcile(conn, [daily], ["d"], now=clock.database_now())
    with at(datetime(2026, 6, 3, 0, 0, 5, tzinfo=UTC)):  # the slot is due: it waits
        summary = drain(conn, {"d": lambda job: None}, Options(["d"]))
        schedules.reconcile(conn, [daily], ["d"], now=clock.database_now())
    assert summary.done == 0 and summary.next_due is None
    slots = conn.execute("SELECT run_at FROM jobs WHERE queue = 'd' AND status = 'queued' "
                         "ORDER BY run_at").fetchall()
    assert slots == [(datetime(2026, 6, 3, tzinfo=UTC),), (datetime(2026, 6, 4, tzinfo=UTC),)]


def test_the_reaper_and_archiving_go_on_for_a_paused_queue(conn):
    stale, old = drainer.enqueue(conn, "mail", {}), drainer.enqueue(conn, "mail", {})
    roundtrip.claim(conn, ["mail"], 2, LEASE)
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 minute' WHERE id = %s",
                 [stale])
    conn.execute("UPDATE jobs SET status = 'done', locked_until = NULL, "
                 "created_at = now() - interval '30 days' WHERE id = %s", [old])
    pauses.pause(conn, "mail")
    assert admin.reap(conn) == 1
    assert admin.archive(conn, timedelta(days=7)) == 1
    assert conn.execute("SELECT id, status FROM jobs").fetchall() == [(stale, "queued")]


def test_pause_names_the_queue_it_refuses(conn):
    with pytest.raises(BadInput, match="non-empty"):
        pauses.pause(conn, "")
    with pytest.raises(BadInput, match="at most"):
        pauses.resume(conn, "q" * 1000)


def test_on_a_table_without_the_migration_pause_says_to_migrate(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE)
        drainer.enqueue(conn, "mail", {})
        with pytest.raises(ConfigError, match="drainer migrate"):
            pauses.pause(conn, "mail")
        assert pauses.paused(conn) == []
        assert queues_claimed(conn, ["mail"]) == {"mail"}  # the claim works as before
