"""Alerting hooks (drainer.hooks): a task's and the global ones, called once a failure is
written back, with its error; never for lost jobs or snoozes; a hook that raises or
hangs is logged and the drain goes on. In-process drains on a real PostgreSQL."""

import asyncio
import logging
import threading
import time

import psycopg
import pytest

import drainer
from drainer import hooks
from drainer.db import connect
from drainer.errors import ConfigError
from drainer.run import Options, drain
from drainer.testing import separate_tasks


class Heard:
    """Hook calls, each with what the table said of the job when the hook ran."""

    def __init__(self, db_url: str, drain_conn: psycopg.Connection | None = None):
        self.db_url = db_url
        self.drain_conn = drain_conn
        self.calls: list[tuple] = []
        self.lock = threading.Lock()

    def hook(self, name: str):
        def called(job, error):
            with psycopg.connect(self.db_url, autocommit=True) as c:
                row = c.execute("SELECT status, attempts, last_error FROM jobs WHERE id = %s",
                                (job.id,)).fetchone()
            idle = (self.drain_conn is None or self.drain_conn.info.transaction_status
                    == psycopg.pq.TransactionStatus.IDLE)
            with self.lock:
                self.calls.append((name, job.id, job.attempts, error, row, idle))
        called.__qualname__ = name
        return called


def boom(job):
    raise RuntimeError("boom")


def test_a_tasks_hooks_hear_each_failed_attempt_after_its_write_back(conn, db_url):
    heard = Heard(db_url, drain_conn := connect(db_url))
    task = drainer.Task(boom, "alerts", max_attempts=2, backoff=drainer.Constant(0),
                        on_failure=heard.hook("failure"), on_dead=heard.hook("dead"))
    job = drainer.enqueue(conn, "alerts", {}, max_attempts=2)
    s = drain(drain_conn, {"alerts": task}, Options(["alerts"]))
    assert (s.retried, s.failed) == (1, 1)
    error = "RuntimeError: boom"
    assert heard.calls == [
        # Written back, with the next claim in the same round trip: running again.
        ("failure", job, 1, error, ("running", 2, error), True),
        ("failure", job, 2, error, ("failed", 2, error), True),
        ("dead", job, 2, error, ("failed", 2, error), True),
    ]


def test_retry_on_that_does_not_name_the_exception_is_dead_at_once(conn, db_url):
    heard = Heard(db_url)

    def handler(job):
        raise KeyError("missing")

    task = drainer.Task(handler, "alerts", retry_on=ValueError,
                        on_failure=heard.hook("failure"), on_dead=heard.hook("dead"))
    job = drainer.enqueue(conn, "alerts", {}, max_attempts=5)
    drain(conn, {"alerts": task}, Options(["alerts"]))
    error = "KeyError: 'missing'"
    assert [c[:4] for c in heard.calls] == [("failure", job, 1, error), ("dead", job, 1, error)]


def test_retry_at_max_attempts_and_a_timeout_are_failures_too(conn, db_url):
    heard = Heard(db_url)

    def retry(job):
        raise drainer.Retry("later", delay=60)

    def slow(job):
        time.sleep(1)

    retrying = drainer.Task(retry, "retry", on_dead=heard.hook("dead"))
    timing_out = drainer.Task(slow, "slow", timeout=0.2, on_failure=heard.hook("failure"))
    first = drainer.enqueue(conn, "retry", {}, max_attempts=1)
    second = drainer.enqueue(conn, "slow", {})
    drain(conn, {"retry": retrying, "slow": timing_out}, Options(["retry", "slow"],
                                                                 concurrency=2))
    assert sorted(c[:4] for c in heard.calls) == [
        ("dead", first, 1, "Retry: later"),
        ("failure", second, 1, "TimeoutError: the handler ran longer than its 0.2 s timeout "
                               "and was abandoned")]


def test_global_hooks_follow_the_tasks_own(conn, db_url, declared):
    heard = Heard(db_url)
    assert drainer.on_failure(heard.hook("global failure")) is not None
    drainer.on_dead(heard.hook("global dead"))
    task = drainer.Task(boom, "alerts", on_failure=heard.hook("task failure"))
    job = drainer.enqueue(conn, "alerts", {}, max_attempts=1)
    drain(conn, {"alerts": task, "plain": boom}, Options(["alerts", "plain"]))
    other = drainer.enqueue(conn, "plain", {}, max_attempts=2)
    drain(conn, {"alerts": task, "plain": boom}, Options(["alerts", "plain"]))
    assert [c[:3] for c in heard.calls] == [
        ("task failure", job, 1), ("global failure", job, 1), ("global dead", job, 1),
        ("global failure", other, 1)]


def test_the_global_hooks_go_with_the_block_that_registered_them(declared):
    def hook(job, error):
        pass

    drainer.on_failure(hook)
    assert list(hooks._FAILURE) == [hook]
    with separate_tasks():
        assert list(hooks._FAILURE) == []
    assert list(hooks._FAILURE) == [hook]


def test_no_hook_for_a_lost_job_nor_a_snooze(conn, db_url):
    heard = Heard(db_url)

    def handler(job):
        if job.payload.get("snooze"):
            raise drainer.Snooze(delay=60)
        with psycopg.connect(db_url, autocommit=True) as other:
            drainer.cancel(other, [job.id])  # no longer ours: the failure changes nothing
        raise RuntimeError("too late")

    task = drainer.Task(handler, "alerts", on_failure=heard.hook("failure"),
                        on_dead=heard.hook("dead"))
    drainer.enqueue(conn, "alerts", {}, max_attempts=1)
    drainer.enqueue(conn, "alerts", {"snooze": True}, max_attempts=1)
    s = drain(conn, {"alerts": task}, Options(["alerts"]))
    assert (s.lost, s.failed, s.retried) == (1, 0, 1)  # the snooze counts as queued again
    assert heard.calls == []


def test_a_hook_that_raises_is_logged_and_the_drain_goes_on(conn, db_url, declared, caplog):
    heard = Heard(db_url)

    def broken(job, error):
        raise ValueError("the pager is down")

    drainer.on_failure(heard.hook("after"))
    task = drainer.Task(boom, "alerts", on_failure=broken)
    jobs = [drainer.enqueue(conn, "alerts", {}, max_attempts=1) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="drainer.hooks"):
        s = drain(conn, {"alerts": task}, Options(["alerts"], batch_size=1))
    assert (s.claimed, s.failed) == (2, 2)
    assert [c[1] for c in heard.calls] == jobs  # the next hook still heard each
    lines = [r.getMessage() for r in caplog.records if r.name == "drainer.hooks"]
    assert lines == [f"job {j} (queue alerts): its on_failure hook "
                     f"{broken.__qualname__} raised ValueError: the pager is down" for j in jobs]


def test_a_hook_that_hangs_is_given_up_on_at_the_bound(conn, db_url, declared, caplog,
                                                       monkeypatch):
    monkeypatch.setattr(hooks, "HOOK_TIMEOUT", 0.3)
    heard = Heard(db_url)
    release, hung_up = threading.Event(), threading.Event()

    def hangs(job, error):
        release.wait(30)
        hung_up.set()

    drainer.on_failure(heard.hook("skipped"))
    task = drainer.Task(boom, "alerts", on_failure=hangs)
    first = drainer.enqueue(conn, "alerts", {"n": 1}, max_attempts=1)
    drainer.enqueue(conn, "alerts", {"n": 2}, max_attempts=1)
    try:
        with caplog.at_level(logging.WARNING, logger="drainer.hooks"):
            s = drain(conn, {"alerts": task}, Options(["alerts"], batch_size=2))
        still_hung = not hung_up.is_set()  # the drain ended without waiting for the hook
    finally:
        release.set()
    assert (s.claimed, s.failed) == (2, 2)
    assert still_hung
    assert heard.calls == []  # the batch's later hook calls were skipped
    [line] = [r.getMessage() for r in caplog.records if r.name == "drainer.hooks"]
    assert line == (f"job {first} (queue alerts): its on_failure hook {hangs.__qualname__} "
                    "still ran after 0.3 s; the drain goes on without it (3 later hook calls "
                    "of this batch skipped)")


def test_a_hook_must_be_callable():
    with pytest.raises(ConfigError, match="on_dead: a hook must be a function"):
        drainer.task("alerts", on_dead="page me")
    with pytest.raises(ConfigError, match="on_failure: a hook must be a function"):
        drainer.on_failure(42)


def test_an_async_hook_is_awaited(conn, db_url, declared):
    heard, loops = [], set()

    async def alert(job, error):
        await asyncio.sleep(0.01)
        loops.add(id(asyncio.get_running_loop()))
        heard.append((job.id, error))

    async def handler(job):
        loops.add(id(asyncio.get_running_loop()))
        raise RuntimeError("boom")

    drainer.on_dead(alert)
    job = drainer.enqueue(conn, "alerts", {}, max_attempts=1)
    drain(conn, {"alerts": handler}, Options(["alerts"]))
    assert heard == [(job, "RuntimeError: boom")]
    assert len(loops) == 1  # the handlers' loop


def test_an_async_hook_that_hangs_is_cancelled_at_the_bound(conn, db_url, declared, caplog,
                                                            monkeypatch):
    monkeypatch.setattr(hooks, "HOOK_TIMEOUT", 0.3)
    cancelled, after = threading.Event(), []

    async def hangs(job, error):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def broken(job, error):
        raise ValueError("the pager is down")

    drainer.on_failure(broken)
    drainer.on_failure(hangs)
    drainer.on_failure(lambda job, error: after.append(job.id))
    job = drainer.enqueue(conn, "alerts", {}, max_attempts=1)
    with caplog.at_level(logging.WARNING, logger="drainer.hooks"):
        s = drain(conn, {"alerts": boom}, Options(["alerts"]))
    assert s.failed == 1
    assert cancelled.wait(5)
    assert after == []  # skipped after the bound
    lines = [r.getMessage() for r in caplog.records if r.name == "drainer.hooks"]
    assert lines == [
        f"job {job} (queue alerts): its on_failure hook {broken.__qualname__} raised "
        "ValueError: the pager is down",
        f"job {job} (queue alerts): its on_failure hook {hangs.__qualname__} still ran after "
        "0.3 s; the drain goes on without it (1 later hook calls of this batch skipped)"]
