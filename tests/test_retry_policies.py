"""Retry policies per task, `Retry` and `Snooze`, task objects and kept results, on a
real PostgreSQL: each delay is checked against the run_at the database wrote."""

import math
import re
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from freezegun import freeze_time

import drainer
from drainer import model
from drainer.retry import MAX_DELAY, MIN_SNOOZE, clamp
from drainer.run import Options, drain
from drainer.storage import roundtrip, writeback
from drainer.tasks import Task
from tests.helpers import HAND_MADE_TABLE, at, count, run_cli, summary_of


def row(conn: psycopg.Connection, job_id: int) -> dict:
    found = conn.execute(
        "SELECT status, attempts, max_attempts, last_error, "
        "extract(epoch FROM run_at - now())::float8 AS wait, result FROM jobs WHERE id = %s",
        (job_id,)).fetchone()
    assert found is not None
    return dict(zip(("status", "attempts", "max_attempts", "last_error", "wait", "result"),
                    found, strict=True))


def run(conn: psycopg.Connection, task: Task, payload: object = None, **options) -> tuple[
        int, drainer.Summary]:
    """Enqueue one job through the task object and drain its queue once."""
    job_id = task.enqueue(conn, payload if payload is not None else {}, **options)
    summary = drain(conn, {task.queue: task}, Options([task.queue]))
    return job_id, summary


def again(conn: psycopg.Connection, job_id: int) -> None:
    """Make a queued job due now (its wait already checked)."""
    conn.execute("UPDATE jobs SET run_at = now() WHERE id = %s", (job_id,))


def failing(exc: BaseException):
    def handler(job):
        raise exc
    return handler


# --- backoff policies ----------------------------------------------------------------


@pytest.mark.parametrize(("backoff", "waits"), [
    (None, [20, 40, 80]),  # the database's classic backoff
    (drainer.Constant(30), [30, 30, 30]),
    (drainer.Exponential(base=5, factor=3, cap=100), [15, 45, 100]),
    (lambda attempt: timedelta(minutes=attempt), [60, 120, 180]),
])
def test_each_backoff_policy_writes_its_delay(conn, backoff, waits):
    task = Task(failing(RuntimeError("down")), "p", backoff=backoff, max_attempts=4)
    job_id, _ = run(conn, task)
    seen = [round(row(conn, job_id)["wait"])]
    for _ in range(2):
        again(conn, job_id)
        drain(conn, {"p": task}, Options(["p"]))
        seen.append(round(row(conn, job_id)["wait"]))
    assert seen == waits
    again(conn, job_id)
    drain(conn, {"p": task}, Options(["p"]))
    assert row(conn, job_id)["status"] == "failed"  # max_attempts still ends it


def test_jitter_takes_up_to_its_share_off_the_delay(conn):
    task = Task(failing(RuntimeError("down")), "j", backoff=drainer.Exponential(jitter=0.5))
    ids = task.enqueue_many(conn, [{}] * 40)
    failed_at = datetime.now(UTC) + timedelta(hours=1)  # the database's now, for the drain
    with at(failed_at):
        drain(conn, {"j": task}, Options(["j"]))
    waits = [w for (w,) in conn.execute(
        "SELECT extract(epoch FROM run_at - %s)::float8 FROM jobs WHERE status = 'queued'",
        [failed_at])]
    assert len(waits) == ids
    assert all(10 <= w <= 20 for w in waits)  # 20 s, less up to half of it
    assert max(waits) - min(waits) > 1  # not one delay for all


@pytest.mark.parametrize(("returned", "wait"), [
    (-5, 0), (math.nan, 0), (-math.inf, 0), (1e12, MAX_DELAY.total_seconds()),
    (math.inf, MAX_DELAY.total_seconds()), (timedelta(days=-1), 0),
    (timedelta(days=10_000), MAX_DELAY.total_seconds()),
    ("soon", 20), (None, 20),  # not a delay: the default backoff, logged
])
def test_a_policys_odd_delay_is_clamped_per_row(conn, returned, wait):
    def once(job):  # a delay of 0 brings the job back in the same drain: it then succeeds
        if job.attempts == 1:
            raise RuntimeError("down")

    task = Task(once, "c", backoff=lambda attempt: returned)
    ok = Task(once, "d", backoff=drainer.Constant(7))
    odd = task.enqueue(conn, {})
    fine = ok.enqueue(conn, {})
    summary = drain(conn, {"c": task, "d": ok}, Options(["c", "d"]))
    assert summary.retried == 2
    assert round(row(conn, odd)["wait"]) == round(wait)
    assert round(row(conn, fine)["wait"]) == 7  # the batch's other rows keep theirs


def test_a_backoff_that_raises_falls_back_to_the_default(conn, caplog):
    def broken(attempt):
        raise ZeroDivisionError("oops")

    job_id, summary = run(conn, Task(failing(RuntimeError("down")), "b", backoff=broken))
    assert summary.retried == 1
    assert round(row(conn, job_id)["wait"]) == 20
    assert "the task's backoff failed (ZeroDivisionError: oops)" in caplog.text


def test_run_at_comes_from_the_database_clock_whatever_pythons_says(conn):
    task = Task(failing(RuntimeError("down")), "t", backoff=drainer.Constant(90))
    with freeze_time("2001-01-01"):
        job_id, _ = run(conn, task)
    assert round(row(conn, job_id)["wait"]) == 90


def test_clamp_bounds():
    assert clamp(3) == timedelta(seconds=3)
    assert clamp(-1) == clamp(math.nan) == timedelta(0)
    assert clamp(10**30) == MAX_DELAY
    with pytest.raises(TypeError):
        clamp("3")
    with pytest.raises(TypeError):
        clamp(True)


# --- retry_on ------------------------------------------------------------------------


class Transient(Exception):
    pass


def test_retry_on_retries_only_the_named_exceptions(conn, caplog):
    handler = Task(lambda job: (_ for _ in ()).throw(
        Transient("503") if job.payload["transient"] else ValueError("400 bad request")),
        "r", retry_on=(Transient,), max_attempts=5)
    retried = handler.enqueue(conn, {"transient": True})
    failed = handler.enqueue(conn, {"transient": False})
    summary = drain(conn, {"r": handler}, Options(["r"]))
    assert (summary.retried, summary.failed) == (1, 1)
    assert row(conn, retried)["status"] == "queued"
    gone = row(conn, failed)
    assert (gone["status"], gone["attempts"], gone["last_error"]) == (
        "failed", 1, "ValueError: 400 bad request")
    assert gone["wait"] <= 0  # failed for good: run_at is when it failed
    assert "failed for good (its task's retry_on does not name this exception)" in caplog.text


def test_retry_on_takes_one_class_and_judges_a_timeout_too(conn):
    def slow(job):
        import time
        time.sleep(3)

    task = Task(slow, "slow", timeout=0.3, retry_on=ConnectionError)
    job_id, summary = run(conn, task)
    assert summary.failed == 1
    assert row(conn, job_id)["last_error"].startswith("TimeoutError: ")


@pytest.mark.parametrize("bad", [ValueError("x"), "ValueError", [int]])
def test_retry_on_must_name_exception_classes(bad):
    with pytest.raises(drainer.ConfigError, match="retry_on"):
        drainer.task("q", retry_on=bad)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_max_attempts_must_be_a_whole_number_from_one(bad):
    with pytest.raises(drainer.ConfigError, match="max_attempts"):
        drainer.task("q", max_attempts=bad)


def test_backoff_must_be_callable():
    with pytest.raises(drainer.ConfigError, match="backoff"):
        drainer.task("q", backoff=30)


# --- Retry and Snooze ----------------------------------------------------------------


def test_retry_asks_for_its_delay_whatever_retry_on_says_and_counts(conn):
    task = Task(failing(drainer.Retry("rate limited", delay=7)), "x", retry_on=(KeyError,),
                max_attempts=2)
    job_id, summary = run(conn, task)
    first = row(conn, job_id)
    assert (summary.retried, first["status"], first["attempts"]) == (1, "queued", 1)
    assert round(first["wait"]) == 7
    assert first["last_error"] == "Retry: rate limited"
    again(conn, job_id)
    summary = drain(conn, {"x": task}, Options(["x"]))
    assert summary.failed == 1
    assert row(conn, job_id)["status"] == "failed"  # it counted: failed at max_attempts


def test_retry_without_a_delay_uses_the_tasks_backoff(conn):
    task = Task(failing(drainer.Retry()), "y", backoff=drainer.Constant(42))
    job_id, _ = run(conn, task)
    assert round(row(conn, job_id)["wait"]) == 42
    assert row(conn, job_id)["last_error"] == "Retry: retry requested"


def test_retry_delay_may_be_a_timedelta_and_is_clamped(conn):
    job_id, _ = run(conn, Task(failing(drainer.Retry(delay=timedelta(minutes=2))), "z"))
    assert round(row(conn, job_id)["wait"]) == 120
    other, _ = run(conn, Task(failing(drainer.Retry(delay=-30)), "w"))
    assert round(row(conn, other)["wait"]) == 0


def test_snooze_puts_the_job_back_without_counting_the_attempt(conn):
    calls = []

    def handler(job):
        calls.append(job.attempts)
        if len(calls) < 4:
            raise drainer.Snooze("waiting for the export", delay=60)

    task = Task(handler, "s", max_attempts=2)
    job_id = task.enqueue(conn, {})
    conn.execute("UPDATE jobs SET last_error = 'earlier' WHERE id = %s", (job_id,))
    for n in range(1, 4):
        summary = drain(conn, {"s": task}, Options(["s"]))
        snoozed = row(conn, job_id)
        assert (snoozed["status"], snoozed["attempts"], snoozed["max_attempts"]) == (
            "queued", n, 2 + n)  # the budget rises; attempts, the token, never falls
        assert round(snoozed["wait"]) == 60
        assert snoozed["last_error"] == "earlier"  # a snooze is no error
        assert (summary.retried, summary.failed) == (1, 0)
        again(conn, job_id)
    drain(conn, {"s": task}, Options(["s"]))
    assert row(conn, job_id)["status"] == "done"  # 4 runs with max_attempts 2 at the start
    assert calls == [1, 2, 3, 4]


def test_a_snooze_under_a_second_counts_as_one(conn):
    calls = []

    def handler(job):
        calls.append(1)
        raise drainer.Snooze(delay=0)

    job_id, summary = run(conn, Task(handler, "n"))
    assert calls == [1]  # not claimed again by the same drain
    assert row(conn, job_id)["wait"] == pytest.approx(MIN_SNOOZE.total_seconds(), abs=0.5)
    assert summary.next_due is not None


def test_a_lost_write_back_recognises_its_snoozes_and_failures(conn):
    """settle_again after a session lost with the first answer: what had landed is ours."""
    for _ in range(3):
        drainer.enqueue(conn, "l", {})
    jobs = drainer.claim(conn, ["l"], 3, timedelta(minutes=5))
    failures = [(jobs[0], model.Setback("Snooze: later", "snooze", timedelta(seconds=5))),
                (jobs[1], model.Setback("ValueError: no", "failed")),
                (jobs[2], model.Setback("OSError: again", "retry", timedelta(seconds=9)))]
    first = roundtrip.settle(conn, (), failures, ())
    assert {i: f.status for i, f in first.failed.items()} == {
        jobs[0].token: "queued", jobs[1].token: "failed", jobs[2].token: "queued"}
    landed = writeback.settle_again(conn, (), failures)
    assert {i: f.status for i, f in landed.failed.items()} == {
        i: f.status for i, f in first.failed.items()}


# --- task objects --------------------------------------------------------------------


def test_a_task_object_is_still_the_function_and_enqueues_with_its_defaults(conn):
    @drainer.task("mail", max_attempts=9)
    def send(job):
        """Send one email."""
        return "sent"

    assert isinstance(send, drainer.Task)
    assert send(None) == "sent"
    assert (send.__name__, send.__doc__, send.queue) == ("send", "Send one email.", "mail")
    first = send.enqueue(conn, {"to": "a@example.com"})
    second = send.enqueue(conn, {"to": "b@example.com"}, max_attempts=2, priority=5)
    assert send.enqueue_many(conn, [{}, {}]) == 2
    assert conn.execute("SELECT queue, max_attempts, priority FROM jobs ORDER BY id"
                        ).fetchall() == [("mail", 9, 0), ("mail", 2, 5), ("mail", 9, 0),
                                         ("mail", 9, 0)]
    assert send.enqueue(conn, {}, key="k") == send.enqueue(conn, {}, key="k") > second > first
    assert drainer.tasks.registered()["mail"] is send


# --- results -------------------------------------------------------------------------


def test_a_kept_result_is_stored_and_read_back(conn):
    task = Task(lambda job: {"sum": sum(job.payload)}, "add", keep_result=True)
    job_id, summary = run(conn, task, [1, 2, 3])
    assert summary.done == 1
    assert drainer.result(conn, job_id) == {"sum": 6}
    none_id, _ = run(conn, Task(lambda job: None, "nothing", keep_result=True))
    assert drainer.result(conn, none_id) is None  # JSON null, kept


def test_result_says_why_there_is_none(conn):
    plain, _ = run(conn, Task(lambda job: 5, "plain"))
    with pytest.raises(drainer.NoResult, match="keeps no result"):
        drainer.result(conn, plain)
    waiting = drainer.enqueue(conn, "later", {}, delay=600)
    with pytest.raises(drainer.NoResult, match="is queued: no result yet") as raised:
        drainer.result(conn, waiting)
    assert raised.value.status == "queued"
    failed, _ = run(conn, Task(failing(ValueError("nope")), "bad", max_attempts=1,
                               keep_result=True))
    with pytest.raises(drainer.NoResult, match="failed: ValueError: nope"):
        drainer.result(conn, failed)
    with pytest.raises(LookupError, match="no job 999999"):
        drainer.result(conn, 999999)


def test_a_result_survives_archiving(conn):
    job_id, _ = run(conn, Task(lambda job: [job.id], "arch", keep_result=True))
    conn.execute("UPDATE jobs SET created_at = now() - interval '30 days'")
    assert drainer.archive(conn, timedelta(days=7)) == 1
    assert drainer.result(conn, job_id) == [job_id]


def test_a_result_that_is_not_json_fails_the_job_for_good(conn, caplog):
    task = Task(lambda job: {1, 2}, "set", keep_result=True, max_attempts=5)
    job_id, summary = run(conn, task)
    assert summary.failed == 1
    failed = row(conn, job_id)
    assert failed["status"] == "failed" and failed["attempts"] == 1
    assert failed["last_error"].startswith(
        "TypeError: the return value cannot be kept as the job's result (keep_result=True)")
    assert failed["result"] is None
    # the log says why as the error does, not that retry_on left the exception out
    assert "failed for good\n" in caplog.text + "\n" and "retry_on" not in caplog.text


def test_a_stale_worker_writes_no_result(conn):
    drainer.enqueue(conn, "stale", {})
    [job] = drainer.claim(conn, ["stale"], 1, timedelta(minutes=5))
    drainer.cancel(conn, [job.id])
    settled = roundtrip.settle(conn, [job], (), (), results={job.token: '"mine"'})
    assert settled.done == set()
    assert row(conn, job.id)["result"] is None


def test_keeping_results_on_a_hand_made_table_says_to_migrate(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE)
        drainer.enqueue(conn, "k", {})
        with pytest.raises(drainer.ConfigError, match="drainer migrate"):
            drain(conn, {"k": Task(lambda job: 1, "k", keep_result=True)}, Options(["k"]))
        assert conn.execute("SELECT status FROM jobs").fetchone() == ("queued",)
        with pytest.raises(drainer.ConfigError, match="drainer migrate"):
            drainer.result(conn, 1)
        # The same table drains as before with tasks that keep nothing.
        summary = drain(conn, {"k": Task(lambda job: 1, "k")}, Options(["k"]))
        assert summary.done == 1



# --- the command line ----------------------------------------------------------------


def test_show_prints_the_kept_result_and_the_log_says_why_a_job_failed_at_once(conn, db_url):
    kept = drainer.enqueue(conn, "sums", [2, 3])
    failed = drainer.enqueue(conn, "hooks", {"why": "400 bad request"})
    retried = drainer.enqueue(conn, "hooks", {"why": "reset", "transient": True})
    drained = run_cli("drain", "--database-url", db_url, "--tasks", "shaped")
    assert drained.returncode == 0, drained.stderr
    assert (summary_of(drained.stdout)["done"], summary_of(drained.stdout)["failed"],
            summary_of(drained.stdout)["retried"]) == (1, 1, 1)
    assert (f"job {failed} (queue hooks) failed, attempt 1 of 5: ValueError: 400 bad request; "
            "failed for good (its task's retry_on does not name this exception)"
            ) in drained.stderr
    assert round(row(conn, retried)["wait"]) == 30
    shown = run_cli("show", str(kept), "--database-url", db_url)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r'^result +\{\n +"sum": 5\n +\}$', shown.stdout, re.MULTILINE), shown.stdout


def test_a_drain_of_a_task_keeping_results_on_a_hand_made_table_exits_2(empty_db_url):
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        conn.execute(HAND_MADE_TABLE)
        drainer.enqueue(conn, "sums", [1])
        drained = run_cli("drain", "--database-url", empty_db_url, "--tasks", "shaped",
                          "--queue", "sums")
        assert drained.returncode == 2, drained.stderr
        assert "keeps results (keep_result=True)" in drained.stderr
        assert "run `drainer migrate`" in drained.stderr
        assert conn.execute("SELECT status, attempts FROM jobs").fetchone() == ("queued", 0)


# --- snooze at the integer limit -----------------------------------------------------

LEASE = timedelta(minutes=5)


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
