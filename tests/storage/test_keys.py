"""Unique keys on a real PostgreSQL: one job per key while it is queued or running,
whatever the concurrency; replace; the holder's row never locked by a caller; bulk
keys; requeue of a job whose key is taken; a table without keys says to migrate."""

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer import model
from drainer.storage import enqueue
from tests.helpers import HAND_MADE_TABLE, clean_env, count, enqueue_key, run_cli, wait_until

LEASE = timedelta(minutes=5)

PRODUCER = """
import json, pathlib, sys, time, psycopg, drainer
url, go, me = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
with psycopg.connect(url, autocommit=True) as conn:
    pathlib.Path(f"{go}.{me}").touch()
    while not go.exists():
        time.sleep(0.005)
    ids = [drainer.enqueue(conn, "mail", {"from": me}, key="welcome-42") for _ in range(1000)]
print(json.dumps(ids))
"""


def test_eight_processes_enqueue_one_key_a_thousand_times_each(conn, db_url, tmp_path):
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, db_url, str(go), str(i)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=clean_env()) for i in range(8)]
    wait_until(lambda: len(list(tmp_path.glob("go.*"))) == 8, timeout=60)
    go.touch()  # all eight at once
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [err for _, err in results]
    returned = [json.loads(out) for out, _ in results]
    [job] = conn.execute("SELECT id FROM jobs WHERE key = 'welcome-42'").fetchall()
    assert all(ids == [job[0]] * 1000 for ids in returned)  # every call got its id
    assert count(conn) == 1
    # Once the job is done, the key is free again.
    drainer.complete(conn, drainer.claim(conn, ["mail"], 10, LEASE))
    again = drainer.enqueue(conn, "mail", {}, key="welcome-42")
    assert again != job[0] and count(conn, "key = 'welcome-42'") == 2


def test_a_failed_or_cancelled_job_frees_its_key(conn):
    first = drainer.enqueue(conn, "mail", {}, key="k", max_attempts=1)
    [job] = drainer.claim(conn, ["mail"], 1, LEASE)
    drainer.fail(conn, [(job, "boom")])
    second = drainer.enqueue(conn, "mail", {}, key="k")
    drainer.cancel(conn, [second])
    third = drainer.enqueue(conn, "mail", {}, key="k")
    assert len({first, second, third}) == 3
    assert drainer.enqueue(conn, "other", {}, key="k") != third  # keys are per queue


def payload_of(conn: psycopg.Connection, job_id: int) -> tuple:
    return conn.execute("SELECT payload, priority, run_at > now() + interval '50 seconds' "
                        "FROM jobs WHERE id = %s", [job_id]).fetchone()


def test_replace_updates_a_queued_holder_and_keeps_a_running_one(conn):
    held = drainer.enqueue(conn, "mail", {"v": 1}, key="k")
    assert drainer.enqueue(conn, "mail", {"v": 2}, key="k") == held  # no replace: kept
    assert payload_of(conn, held) == ({"v": 1}, 0, False)
    replaced = enqueue.enqueue_keyed(conn, "mail", {"v": 3}, key="k", replace=True,
                                     priority=7, delay=60)
    assert replaced == (held, "replaced") and payload_of(conn, held) == ({"v": 3}, 7, True)
    conn.execute("UPDATE jobs SET run_at = now()")
    [job] = drainer.claim(conn, ["mail"], 1, LEASE)
    kept = enqueue.enqueue_keyed(conn, "mail", {"v": 4}, key="k", replace=True)
    assert kept == (held, "running") and payload_of(conn, held)[0] == {"v": 3}
    assert drainer.complete(conn, [job]) == {held} and count(conn) == 1


def blocked_on_a_lock(conn: psycopg.Connection, pid: int) -> bool:
    return conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                        [pid]).fetchone()[0]


def test_a_caller_transaction_never_holds_the_running_holder_locked(conn, db_url):
    """The worst moment: a claim takes the holder while the caller's replace waits for
    it. The caller's UPDATE then rechecks the row, finds it running and leaves it, but
    would keep it locked until the caller commits; the worker's write must not wait
    for that caller. The caller commits only after the write, so any wait for it lasts
    until the worker's lock_timeout ends it with an error: that error is the failure."""
    held = drainer.enqueue(conn, "mail", {"v": 1}, key="k")
    with psycopg.connect(db_url) as claimer, psycopg.connect(db_url) as caller, \
            psycopg.connect(db_url, autocommit=True) as worker:
        [job] = drainer.claim(claimer, ["mail"], 1, LEASE)  # not committed yet
        outcome: list[model.Enqueued] = []
        replacing = threading.Thread(target=lambda: outcome.append(enqueue.enqueue_keyed(
            caller, "mail", {"v": 2}, key="k", replace=True)))
        replacing.start()
        wait_until(lambda: blocked_on_a_lock(conn, caller.info.backend_pid))
        claimer.commit()
        replacing.join(timeout=30)
        assert outcome == [(held, "running")]
        # The caller's transaction is still open, with its enqueue in it.
        worker.execute("SET lock_timeout = '2s'")
        assert drainer.complete(worker, [job]) == {held}
        assert caller.execute("SELECT payload FROM jobs WHERE id = %s",
                              [held]).fetchone() == ({"v": 1},)
        caller.commit()


def test_an_open_transaction_that_enqueued_a_held_key_does_not_block_the_worker(conn, db_url):
    held = drainer.enqueue(conn, "mail", {}, key="k")
    [job] = drainer.claim(conn, ["mail"], 1, LEASE)
    with psycopg.connect(db_url) as caller, psycopg.connect(
            db_url, autocommit=True) as worker:
        assert drainer.enqueue(caller, "mail", {"v": 2}, key="k", replace=True) == held
        assert drainer.enqueue(caller, "mail", {"v": 3}, key="k") == held
        worker.execute("SET lock_timeout = '2s'")
        assert drainer.complete(worker, [job]) == {held}  # not waiting on the caller
        caller.commit()


def test_enqueue_many_with_keys_returns_each_payloads_job(conn):
    holder = drainer.enqueue(conn, "mail", {"old": True}, key="b")
    ids = drainer.enqueue_many(conn, "mail", [{"n": n} for n in range(5)],
                               keys=["a", "c", "a", "b", "d"], priority=5)
    assert len(ids) == 5 and ids[0] == ids[2] and ids[3] == holder
    assert len(set(ids)) == 4
    rows = dict(conn.execute("SELECT id, payload FROM jobs WHERE priority = 5").fetchall())
    assert [rows[i] for i in (ids[0], ids[1], ids[4])] == [
        {"n": 0}, {"n": 1}, {"n": 4}]  # the first payload of a repeated key
    assert count(conn) == 4
    # Again in one transaction: the first call's jobs hold their keys for the second.
    with conn.transaction():
        first = drainer.enqueue_many(conn, "mail", [{}, {}], keys=["x", "y"])
        second = drainer.enqueue_many(conn, "mail", [{}, {}], keys=["x", "z"])
    assert second[0] == first[0] and count(conn) == 7


def test_enqueue_many_with_keys_is_all_or_nothing(conn):
    for keys, why in ((["a"], "1 keys for 2 payloads"), (["a", None], "payload 2 has no key"),
                      (["a", "b", "c"], "3 keys for 2 payloads")):
        with pytest.raises(drainer.BadInput, match=why):
            drainer.enqueue_many(conn, "mail", [{}, {}], keys=keys)
    with pytest.raises(drainer.BadInput, match="payload 2"):
        drainer.enqueue_many(conn, "mail", [{}, {"x": "\x00"}], keys=["a", "b"])
    with pytest.raises(drainer.BadInput, match="payload 2"):  # its key's first payload is 1
        drainer.enqueue_many(conn, "mail", [{}, {"x": float("nan")}], keys=["a", "a"])
    assert count(conn) == 0


def test_enqueue_many_races_one_key_from_two_transactions(conn, db_url):
    """A key copied by another transaction after this one read the holders: the COPY
    waits for it, fails on the unique index, is undone to its savepoint, and the
    holder's id comes back; the caller's transaction goes on."""
    with psycopg.connect(db_url) as other, psycopg.connect(db_url) as caller:
        first = drainer.enqueue(other, "mail", {"by": "other"}, key="k")  # not committed
        result: list[list[int]] = []
        racing = threading.Thread(target=lambda: result.append(drainer.enqueue_many(
            caller, "mail", [{"by": "caller"}, {}], keys=["k", "j"])))
        racing.start()
        wait_until(lambda: blocked_on_a_lock(conn, caller.info.backend_pid))
        other.commit()
        racing.join(timeout=30)
        assert result and result[0][0] == first
        caller.commit()
    assert count(conn) == 2


def test_batches_of_the_same_keys_in_opposite_orders_never_deadlock(conn, db_url):
    """Eight transactions enqueue the same keys at once, half of them listing them the
    other way round: each call takes its keys' locks in one order, so none waits for
    another that waits for it. One job per key, every call answers every key's holder
    in the order it gave the keys, and no caller's transaction is rolled back."""
    keys = [f"k{n:04}" for n in range(1000)]
    start = threading.Barrier(8)

    def app(n: int) -> dict[str, int]:
        mine = keys if n % 2 else keys[::-1]
        with psycopg.connect(db_url) as caller:  # one transaction, committed at the end
            start.wait(timeout=60)
            ids = drainer.enqueue_many(caller, "mail", [{"by": n}] * len(mine), keys=mine)
        return dict(zip(mine, ids, strict=True))

    with ThreadPoolExecutor(8) as pool:
        answered = list(pool.map(app, range(8)))
    holders = dict(conn.execute("SELECT key, id FROM jobs"))
    assert len(holders) == len(keys) == count(conn)
    assert all(ids == holders for ids in answered)


@pytest.mark.parametrize("how", ["enqueue", "enqueue_many"])
@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_key_taken_after_the_snapshot_is_psycopgs_serialization_failure(
        conn, db_url, isolation, how):
    """A job holding the key committed after the caller's snapshot, which cannot see
    it: the enqueue fails as a serialization failure, psycopg's own error, which a
    retry loop knows; run again, the transaction gets the holder's id."""
    with psycopg.connect(db_url) as app:
        app.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        app.execute("SELECT 1")  # the snapshot
        holder = drainer.enqueue(conn, "mail", {}, key="k")
        with pytest.raises(psycopg.errors.SerializationFailure) as caught:
            enqueue_key(how, app, "k")
        assert not isinstance(caught.value, drainer.DrainerError)
        app.rollback()  # the retry loop's
        app.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        assert enqueue_key(how, app, "k") == holder
        app.commit()
    assert count(conn) == 1


def test_a_deadlock_across_a_transactions_statements_is_psycopgs_own_error(conn, db_url):
    """Two transactions each enqueue a key, then the other's: PostgreSQL fails one of
    them with psycopg's DeadlockDetected, which the caller's retry loop knows, and once
    it rolled back, the other goes on."""
    outcome: dict[int, object] = {}

    def second_key(n: int, app: psycopg.Connection, key: str) -> None:
        try:
            outcome[n] = drainer.enqueue(app, "mail", {}, key=key)
        except Exception as exc:  # noqa: BLE001 - kept for the assertions
            outcome[n] = exc
            app.rollback()

    with psycopg.connect(db_url) as one, psycopg.connect(db_url) as two:
        drainer.enqueue(one, "mail", {}, key="a")
        drainer.enqueue(two, "mail", {}, key="b")
        first = threading.Thread(target=second_key, args=(1, one, "b"))
        first.start()
        wait_until(lambda: blocked_on_a_lock(conn, one.info.backend_pid))
        second = threading.Thread(target=second_key, args=(2, two, "a"))
        second.start()
        first.join(timeout=60)
        second.join(timeout=60)
        one.commit()
        two.commit()
    failed = [e for e in outcome.values() if isinstance(e, BaseException)]
    assert len(outcome) == 2 and len(failed) == 1, outcome
    assert type(failed[0]) is psycopg.errors.DeadlockDetected
    assert count(conn) == 2  # the survivor's two keys


@pytest.mark.parametrize("key", ["nul\x00", "x" * 1001, 42])
def test_a_key_the_index_cannot_hold_is_bad_input(conn, key):
    with pytest.raises(drainer.BadInput, match="key"):
        drainer.enqueue(conn, "mail", {}, key=key)


def test_requeue_skips_a_failed_job_whose_key_is_held(conn):
    old = drainer.enqueue(conn, "mail", {}, key="k", max_attempts=1)
    twin = drainer.enqueue(conn, "mail", {}, key="t", max_attempts=1)
    drainer.fail(conn, [(job, "boom") for job in drainer.claim(conn, ["mail"], 2, LEASE)])
    newer = drainer.enqueue(conn, "mail", {}, key="k")
    other_twin = drainer.enqueue(conn, "mail", {}, key="t", max_attempts=1)
    jobs = drainer.claim(conn, ["mail"], 2, LEASE)
    drainer.fail(conn, [(job, "boom") for job in jobs if job.id == other_twin])
    drainer.release(conn, [job for job in jobs if job.id == newer])
    done = drainer.requeue(conn, queue="mail")
    # Two failed jobs with key t: the newest comes back, the other stays failed.
    assert done == [other_twin] and done.held == {old: newer, twin: other_twin}
    by_id = drainer.requeue(conn, ids=[old])
    assert by_id == [] and by_id.held == {old: newer}
    proc = run_cli("requeue", str(old), "--database-url", conn.info.dsn)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"requeued": 0, "ids": [],
                                       "held": [{"id": old, "holder": newer}]}
    assert f"job {old} not requeued: job {newer} holds its key" in proc.stderr


def test_the_cli_enqueues_with_a_key_and_a_priority(db_url, conn):
    def enqueue(*args: str) -> tuple[int, str]:
        proc = run_cli("enqueue", "mail", *args, "--database-url", db_url)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["id"], proc.stderr

    first, _ = enqueue('{"v": 1}', "--key", "k", "--priority", "9")
    again, said = enqueue('{"v": 2}', "--key", "k")
    assert again == first and f"job {first} (queued) holds key 'k'" in said
    assert enqueue('{"v": 3}', "--key", "k", "--replace")[0] == first
    assert payload_of(conn, first)[:2] == ({"v": 3}, 0)
    lines = run_cli("enqueue", "mail", "--priority", "-3", "--database-url", db_url,
                    input='{"a": 1}\n{"a": 2}\n')
    assert lines.returncode == 0 and count(conn, "priority = -3") == 2
    for bad, why in ((["--priority", "101"], "from -100 to 100"),
                     (["--replace"], "--replace needs --key")):
        proc = run_cli("enqueue", "mail", "{}", *bad, "--database-url", db_url)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    stdin = run_cli("enqueue", "mail", "--key", "k", "--database-url", db_url, input="{}\n")
    assert stdin.returncode == 2 and "not on stdin" in stdin.stderr


@pytest.fixture
def hand_made(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE, prepare=False)
    return empty_db_url


@pytest.mark.parametrize("options", [{"key": "k"}, {"priority": 5}])
def test_keys_and_priorities_on_a_table_without_them_say_to_migrate(hand_made, options):
    with psycopg.connect(hand_made) as conn:  # in the caller's own transaction
        drainer.enqueue(conn, "mail", {"n": 1})
        with pytest.raises(drainer.ConfigError, match="run `drainer migrate`"):
            drainer.enqueue(conn, "mail", {}, **options)
        with pytest.raises(drainer.ConfigError, match="run `drainer migrate`"):
            drainer.enqueue_many(conn, "mail", [{}], **(
                {"keys": ["k"]} if "key" in options else options))
        drainer.enqueue(conn, "mail", {"n": 2})  # the transaction was not aborted
        conn.commit()
        assert count(conn) == 2
    flag = ["--key", "k"] if "key" in options else ["--priority", "5"]
    proc = run_cli("enqueue", "mail", "{}", *flag, "--database-url", hand_made)
    assert proc.returncode == 2 and "drainer migrate" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
