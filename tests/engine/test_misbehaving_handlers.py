"""Handlers that misbehave: huge or unreadable exception messages, sys.exit, a hang
(the task's timeout, else the lease), a return value that is not serialisable. Each
ends in a recorded outcome, and the drain goes on with the next job."""

import functools
import signal
import threading
import time
from datetime import timedelta

import pytest

import drainer
import drainer.testing
from drainer import testing
from drainer.errors import MAX_ERROR, ConfigError, describe
from drainer.run import Options, drain
from drainer.tasks import Task, registered, task
from tests.helpers import count, drainer_process, run_cli, summary_of, wait_until


class Unreadable(Exception):
    def __str__(self):
        raise ValueError("this message cannot be read")


class NotAString(Exception):
    def __str__(self):
        return 42


RAISES = {
    "huge": RuntimeError("x" * 10_000_000),
    "unreadable": Unreadable(),
    "not a string": NotAString(),
    "surrogate": RuntimeError("bad byte \udcff here"),
    "nul": RuntimeError("nul \x00 here"),
    "control": RuntimeError("\x1b[31mred\x07\r\nsecond line"),
    "exit": SystemExit(3),
    "interrupt": KeyboardInterrupt(),
}
RETURNS = {"object": object(), "generator": (i for i in ()), "lambda": lambda: 1,
           "self-referencing": (ref := []).append(ref) or ref}


def misbehave(job):
    kind = job.payload["kind"]
    if kind in RAISES:
        raise RAISES[kind]
    return RETURNS.get(kind)


def test_each_misbehaviour_ends_in_a_recorded_outcome_and_the_drain_goes_on(conn):
    kinds = [*RAISES, *RETURNS]
    for kind in kinds:
        drainer.enqueue(conn, "default", {"kind": kind})
    drainer.enqueue_many(conn, "default", [{"kind": "fine"}] * 5)

    s = drain(conn, {"default": misbehave}, Options(queues=["default"], batch_size=50))

    assert s.stopped == "empty"
    assert (s.claimed, s.done, s.retried, s.failed, s.lost) == (
        len(kinds) + 5, len(RETURNS) + 5, len(RAISES), 0, 0)
    rows = dict(conn.execute("SELECT payload->>'kind', last_error FROM jobs "
                             "WHERE status = 'queued' AND attempts = 1").fetchall())
    assert set(rows) == set(RAISES)
    assert all(0 < len(error) <= MAX_ERROR for error in rows.values())
    assert rows["huge"].startswith("RuntimeError: xxx") and rows["huge"].endswith("…")
    assert rows["unreadable"] == "Unreadable: <the exception's message could not be read>"
    assert rows["surrogate"] == "RuntimeError: bad byte \\udcff here"
    assert rows["nul"] == "RuntimeError: nul \\0 here"
    assert rows["exit"] == "SystemExit: 3"
    assert count(conn, "status = 'done'") == len(RETURNS) + 5


def test_describe_never_raises_and_stays_bounded():
    for exc in [*RAISES.values(), ValueError("é" * MAX_ERROR * 3), ValueError("\udcff" * 5000)]:
        text = describe(exc)
        assert len(text) <= MAX_ERROR and "\x00" not in text
        text.encode("utf-8")  # storable: raises on a lone surrogate


def test_a_handler_past_its_timeout_is_failed_and_its_late_result_changes_nothing(conn):
    lock, running, peak = threading.Lock(), [0], [0]

    def measured(seconds):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(seconds)
        with lock:
            running[0] -= 1

    def handler(job):
        kind = job.payload["kind"]
        if kind == "late":
            time.sleep(1.0)  # returns (a success) after its 0.3 s timeout, mid-batch
        else:
            measured(0.2)  # six of these run while the late one is still going

    drainer.enqueue(conn, "default", {"kind": "late"})
    drainer.enqueue_many(conn, "default", [{"kind": "quick"}] * 6)

    s = drain(conn, {"default": Task(handler, "default", timeout=0.3)},
              Options(queues=["default"], batch_size=7, concurrency=1))

    assert (s.stopped, s.claimed, s.done, s.retried, s.lost) == ("empty", 7, 6, 1, 0)
    status, attempts, error = conn.execute(
        "SELECT status, attempts, last_error FROM jobs WHERE payload->>'kind' = 'late'"
    ).fetchone()
    assert (status, attempts) == ("queued", 1)  # retried later; the late success was dropped
    assert error == "TimeoutError: the handler ran longer than its 0.3 s timeout and was abandoned"
    assert peak[0] == 1  # the written-off thread took no other job: concurrency held


def test_task_timeouts_are_checked():
    for bad in (0, -1, float("inf"), float("nan"), "5"):
        with pytest.raises(drainer.ConfigError, match="timeout"):
            task("checked", timeout=bad)
    task("checked", timeout=timedelta(seconds=2))(lambda job: None)
    assert registered()["checked"].timeout == 2.0


def test_a_hung_handler_with_a_timeout_fails_its_job_and_the_run_goes_on(db_url, tmp_path):
    touch = tmp_path / "started"
    with drainer.db.connect(db_url) as conn:
        drainer.enqueue(conn, "hang", {"touch": str(touch)}, max_attempts=1)
        drainer.enqueue(conn, "exit", {"code": 7})
        drainer.enqueue(conn, "junk", {})
    result = run_cli("drain", "--database-url", db_url, "--tasks", "misbehave",
                     "--queue", "hang", "--queue", "exit", "--queue", "junk", "--batch-size", "3")
    assert result.returncode == 0, result.stderr
    s = summary_of(result.stdout)
    assert (s["claimed"], s["done"], s["retried"], s["failed"]) == (3, 1, 1, 1)
    with drainer.db.connect(db_url) as conn:
        rows = dict(conn.execute("SELECT queue, (status, last_error) FROM jobs").fetchall())
    assert rows["hang"][0] == "failed" and rows["hang"][1].startswith("TimeoutError")
    assert rows["exit"] == ("queued", "SystemExit: 7")
    assert rows["junk"] == ("done", None)


def test_a_hung_handler_without_a_timeout_comes_back_by_its_lease(db_url, tmp_path):
    touch = tmp_path / "started"
    with drainer.db.connect(db_url) as conn:
        drainer.enqueue(conn, "hang_forever", {"touch": str(touch)}, max_attempts=1)
    proc = drainer_process(db_url, "--tasks", "misbehave", "--queue", "hang_forever",
                           "--lease", "1")
    wait_until(touch.exists)
    proc.send_signal(signal.SIGTERM)  # the handler gets one lease, then is abandoned
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert summary_of(out)["stopped"] == "signal"
    time.sleep(1.2)  # the abandoned job's lease runs out

    rerun = run_cli("drain", "--database-url", db_url, "--tasks", "misbehave",
                    "--queue", "hang_forever")
    assert summary_of(rerun.stdout)["reaped"] == 1
    with drainer.db.connect(db_url) as conn:
        assert conn.execute("SELECT status, last_error FROM jobs").fetchone() == (
            "failed", "lease expired")


def test_an_async_handler_is_registered_and_runs(conn):
    """An `async def` handler runs on the process's event loop, not as a coroutine
    made on a thread and dropped."""
    ran = []

    async def send_email(job):
        ran.append(job.id)

    with drainer.testing.separate_tasks():
        registered_task = task("async-ok")(send_email)
        job_id = drainer.enqueue(conn, "async-ok", {})
        summary = drain(conn, {"async-ok": registered_task}, Options(["async-ok"]))
    assert (summary.done, ran) == (1, [job_id])


def _status(conn, job_id):
    return conn.execute("SELECT status, attempts FROM jobs WHERE id = %s", [job_id]).fetchone()


async def _async_handler(job):
    _async_handler.ran = True


_async_handler.ran = False


def test_an_async_handler_given_to_drain_is_not_marked_done_unrun(conn):
    """`@task` refuses `async def`, but drain() takes handlers as a dict: called on a
    thread, it would only make a coroutine, and the job must not be marked done."""
    job_id = drainer.enqueue(conn, "q", {})
    _async_handler.ran = False
    try:
        drain(conn, {"q": _async_handler}, Options(queues=["q"]))
    except ConfigError:
        return  # refused up front: fine
    assert _async_handler.ran or _status(conn, job_id)[0] != "done", (
        "the job is 'done' though its handler never ran")


class _AsyncCallable:
    ran = False

    async def __call__(self, job):
        type(self).ran = True


def _sync_decorated(fn):
    @functools.wraps(fn)  # a common retry/metrics decorator: sync wrapper, coroutine out
    def wrapper(job):
        return fn(job)

    return wrapper


async def _async_gen(job):
    _async_gen.ran = True
    yield


_async_gen.ran = False


@pytest.mark.parametrize("make", [
    lambda: _async_gen,
    lambda: _AsyncCallable(),
    lambda: _sync_decorated(_async_handler),
], ids=["async-generator", "async-__call__", "wrapped-async-def"])
def test_an_async_task_in_another_shape_is_refused_or_not_done_unrun(conn, make):
    """inspect.iscoroutinefunction misses async generators, objects with an async
    __call__ and `async def` behind a functools.wraps decorator: @task may register
    them, but the drain must not mark their jobs done without running them."""
    handler = make()
    _async_handler.ran = _async_gen.ran = _AsyncCallable.ran = False
    job_id = drainer.enqueue(conn, "q", {})
    with testing.separate_tasks():
        try:
            drainer.task("q")(handler)
        except ConfigError:
            return  # refused: fine
        drain(conn, {"q": handler}, Options(queues=["q"]))
    ran = _async_handler.ran or _async_gen.ran or _AsyncCallable.ran
    assert ran or _status(conn, job_id)[0] != "done", (
        "the job is 'done' though its handler never ran")
