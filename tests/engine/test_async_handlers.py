"""`async def` handlers on a real PostgreSQL: one event loop for the process,
--concurrency as the one cap on jobs in flight (async and sync together), a task
timeout that really cancels, the task's policies, and a real drain process (SIGTERM
mid-batch, kill -9 then the reaper)."""

import asyncio
import contextvars
import re
import signal
import sys
import threading
import time
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer import clock
from drainer.engine.batch import Batch
from drainer.engine.runners import Runner, on_event_loop, on_handler_threads
from drainer.run import Options, drain
from drainer.storage import roundtrip
from drainer.tasks import Task
from tests.helpers import drainer_process, run_cli, summary_of, wait_until


@pytest.fixture(autouse=True, params=["asyncio", "uvloop"])
def event_loop(request):
    """Every test here on both loops the handlers may run on; the drains in this
    process then keep the loop of this kind (Options.event_loop None)."""
    clock.use_loop(request.param)
    yield request.param
    clock.use_loop("auto")


def test_async_handlers_run_on_one_loop_up_to_the_concurrency(conn):
    loops, in_flight, peak = set(), [0], [0]

    async def handler(job):
        loops.add(id(asyncio.get_running_loop()))
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.05)
        in_flight[0] -= 1
        return job.payload["n"] * 2

    drainer.enqueue_many(conn, "a", [{"n": n} for n in range(40)])
    summary = drain(conn, {"a": Task(handler, "a", keep_result=True)},
                    Options(["a"], concurrency=5, batch_size=10))
    assert summary.done == 40
    assert len(loops) == 1  # one loop, across jobs and batches
    assert peak[0] == 5
    assert sorted(v for (v,) in conn.execute("SELECT result FROM jobs")) == list(range(0, 80, 2))


class InFlight:
    """Handlers that count how many of them run at once, and the most seen."""

    def __init__(self) -> None:
        self.lock, self.now, self.peak = threading.Lock(), 0, 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1

    def handlers(self, seconds):  # (job -> seconds) -> (async handler, sync handler)
        async def slow_async(job):
            self.enter()
            await asyncio.sleep(seconds(job))
            self.leave()

        def slow_sync(job):
            self.enter()
            time.sleep(seconds(job))
            self.leave()

        return slow_async, slow_sync


def test_sync_and_async_handlers_share_one_cap(conn):
    flight = InFlight()
    slow_async, slow_sync = flight.handlers(lambda job: 0.05)

    drainer.enqueue_many(conn, "x", [{}] * 12)
    drainer.enqueue_many(conn, "y", [{}] * 12)
    summary = drain(conn, {"x": slow_async, "y": slow_sync},
                    Options(["x", "y"], concurrency=4, batch_size=24))
    assert summary.done == 24
    assert flight.peak == 4


def test_a_timeout_cancels_an_async_handler(conn):
    seen = threading.Event()

    async def stuck(job):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.set()
            raise

    job_id = drainer.enqueue(conn, "t", {})
    summary = drain(conn, {"t": Task(stuck, "t", timeout=0.3)}, Options(["t"]))
    assert summary.retried == 1
    assert seen.wait(5)  # cancelled on the loop, not left running
    assert conn.execute("SELECT last_error FROM jobs WHERE id = %s", (job_id,)).fetchone()[
        0].startswith("TimeoutError: ")


def test_an_async_handlers_policies_retry_and_snooze(conn):
    async def asks(job):
        if job.payload["ask"] == "retry":
            raise drainer.Retry(delay=7)
        if job.payload["ask"] == "snooze":
            raise drainer.Snooze(delay=9)
        raise KeyError("not worth retrying")

    for ask in ("retry", "snooze", "fatal"):
        drainer.enqueue(conn, "p", {"ask": ask})
    summary = drain(conn, {"p": Task(asks, "p", retry_on=ConnectionError)}, Options(["p"]))
    assert (summary.retried, summary.failed) == (2, 1)
    rows = conn.execute("SELECT payload ->> 'ask', status, round(extract(epoch FROM run_at - "
                        "now())), max_attempts FROM jobs ORDER BY id").fetchall()
    assert [(a, s) for a, s, _, _ in rows] == [("retry", "queued"), ("snooze", "queued"),
                                               ("fatal", "failed")]
    assert [w for _, s, w, _ in rows if s == "queued"] == [7, 9]
    assert rows[1][3] == 6  # the snooze raised the budget


def test_a_drain_process_with_async_tasks_and_sigterm_mid_batch(conn, db_url, tmp_path):
    drainer.enqueue_many(conn, "async", [{}] * 20)
    drainer.enqueue_many(conn, "sync", [{}] * 20)
    done = run_cli("drain", "--database-url", db_url, "--tasks", "asyncy", "--concurrency", "8")
    assert done.returncode == 0, done.stderr
    assert summary_of(done.stdout)["done"] == 40
    touch = tmp_path / "started"
    drainer.enqueue(conn, "async", {"touch": str(touch), "sleep": 1})
    drainer.enqueue_many(conn, "async", [{"sleep": 1}] * 5)
    proc = drainer_process(db_url, "--tasks", "asyncy", "--queue", "async", "--batch-size", "6")
    wait_until(touch.exists)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = summary_of(out)
    assert summary["stopped"] == "signal"
    # The started job finished; those not started were given back, attempt included.
    assert summary["done"] >= 1
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'").fetchone() == (0,)


def test_a_drain_killed_mid_async_job_leaves_it_to_the_reaper(conn, db_url, tmp_path):
    touch = tmp_path / "started"
    held = drainer.enqueue(conn, "async", {"touch": str(touch), "sleep": 60})
    proc = drainer_process(db_url, "--tasks", "asyncy", "--queue", "async")
    wait_until(touch.exists)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert conn.execute("SELECT status, attempts FROM jobs WHERE id = %s", (held,)
                        ).fetchone() == ("running", 1)
    conn.execute("UPDATE jobs SET locked_until = now() - interval '1 second', "
                 "payload = '{}' WHERE id = %s", (held,))  # its lease runs out
    again = run_cli("drain", "--database-url", db_url, "--tasks", "asyncy", "--queue", "async")
    assert again.returncode == 0, again.stderr
    assert (summary_of(again.stdout)["reaped"], summary_of(again.stdout)["done"]) == (1, 1)
    assert conn.execute("SELECT status, attempts FROM jobs WHERE id = %s", (held,)
                        ).fetchone() == ("done", 2)


def test_an_async_handler_that_exits_fails_its_job_and_the_loop_goes_on(conn):
    """asyncio lets SystemExit out of its loop: it must fail the job, not end the loop
    and leave the drain waiting on it forever."""

    async def leaves(job):
        await asyncio.sleep(0)
        raise SystemExit(3)

    async def fine(job):
        await asyncio.sleep(0)

    failed = drainer.enqueue(conn, "e", {}, max_attempts=1)
    summary = drain(conn, {"e": leaves}, Options(["e"]))
    assert summary.failed == 1
    assert conn.execute("SELECT last_error FROM jobs WHERE id = %s", (failed,)).fetchone() == (
        "SystemExit: 3",)
    drainer.enqueue(conn, "f", {})
    assert drain(conn, {"f": fine}, Options(["f"])).done == 1  # the loop still serves


EXITS = {"exit": SystemExit(3), "interrupt": KeyboardInterrupt()}


def exits_plain(job):
    if job.payload["kind"] in EXITS:
        raise EXITS[job.payload["kind"]]


async def exits_async(job):
    await asyncio.sleep(0)
    if job.payload["kind"] in EXITS:
        raise EXITS[job.payload["kind"]]


def test_an_async_handlers_exit_is_recorded_and_judged_as_a_plain_handlers(conn, caplog):
    """sys.exit and KeyboardInterrupt in an `async def` fail the job as in a plain
    function: the same last_error, the same policy (retry_on names one of them), the
    same log line and traceback, and the drain goes on."""
    seen = {}
    for name, handler in (("plain", exits_plain), ("async", exits_async)):
        ids = {kind: drainer.enqueue(conn, name, {"kind": kind}) for kind in EXITS}
        drainer.enqueue(conn, name, {"kind": "fine"})  # after them, on the same slot
        caplog.clear()
        summary = drain(conn, {name: Task(handler, name, retry_on=KeyboardInterrupt)},
                        Options([name], concurrency=1, verbose=True))
        rows = {kind: conn.execute("SELECT status, last_error FROM jobs WHERE id = %s",
                                   (job_id,)).fetchone() for kind, job_id in ids.items()}
        logs = {kind: [re.sub(r"retry at \S+", "retry at T", r.getMessage()).replace(
                           f"job {job_id} (queue {name})", "job N")
                       for r in caplog.records if f"job {job_id} " in r.getMessage()]
                for kind, job_id in ids.items()}
        seen[name] = (summary.done, summary.retried, summary.failed), rows, logs
    assert seen["async"][:2] == seen["plain"][:2]
    assert seen["plain"][:2] == ((1, 1, 1), {"exit": ("failed", "SystemExit: 3"),
                                             "interrupt": ("queued", "KeyboardInterrupt: ")})
    for kind in EXITS:
        [plain], [in_async] = seen["plain"][2][kind], seen["async"][2][kind]
        # The line, and the traceback's last line: what was raised, never a wrapper.
        assert in_async.splitlines()[0] == plain.splitlines()[0]
        assert in_async.splitlines()[-1] == plain.splitlines()[-1]
        assert "raise EXITS[" in in_async and "HandlerExit" not in in_async


def handler_threads() -> int:
    return sum(t.name == "drainer-handler" for t in threading.enumerate())


def test_async_jobs_in_flight_hold_no_thread(conn):
    """200 async jobs at once with --concurrency 200: every one in flight together on
    the one loop, while the handler pool stays a few threads (a thread waiting on
    each job would make it 200)."""
    jobs, in_flight, peak, threads = 200, [0], [0], []
    before = handler_threads()  # earlier tests' written-off handlers may run on

    async def handler(job):
        in_flight[0] += 1  # one loop: no other handler runs between these lines
        peak[0] = max(peak[0], in_flight[0])
        threads.append(handler_threads())
        for _ in range(1500):  # until every job is in flight (30 s at most)
            if peak[0] == jobs:
                break
            await asyncio.sleep(0.02)
        in_flight[0] -= 1

    drainer.enqueue_many(conn, "a", [{}] * jobs)
    summary = drain(conn, {"a": handler}, Options(["a"], concurrency=jobs, batch_size=jobs))
    assert summary.done == jobs
    assert peak[0] == jobs
    assert max(threads) - before <= 4, (before, max(threads))


def test_jobs_sync_and_async_in_turn_never_pass_the_cap(conn):
    """Slots go from a sync job (a thread) to an async one (the loop) and back: the
    jobs in flight together stay at --concurrency."""
    flight = InFlight()
    slow_async, slow_sync = flight.handlers(lambda job: 0.01 * job.payload["n"])

    for n in range(30):  # claimed in id order: the queues take turns
        drainer.enqueue(conn, "x" if n % 2 else "y", {"n": n % 4})
    summary = drain(conn, {"x": slow_async, "y": slow_sync},
                    Options(["x", "y"], concurrency=3, batch_size=30))
    assert summary.done == 30
    assert 1 < flight.peak <= 3


def test_a_timed_out_async_handler_is_cancelled_and_its_slot_goes_on(conn):
    """The timeout cancels the handler; the slot's next jobs run; what the cancelled
    work returns afterwards (it swallowed the cancellation) changes nothing."""
    cancelled, ran = threading.Event(), []

    async def handler(job):
        if job.payload.get("stuck"):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                return "too late"  # swallowed: it must not count as done
        ran.append(job.id)
        return "fine"

    stuck = drainer.enqueue(conn, "t", {"stuck": True})
    others = [drainer.enqueue(conn, "t", {}) for _ in range(3)]
    summary = drain(conn, {"t": Task(handler, "t", timeout=0.3, keep_result=True)},
                    Options(["t"], concurrency=1, batch_size=4))
    assert cancelled.wait(5)
    assert (summary.done, summary.retried) == (3, 1)
    assert sorted(ran) == others
    status, error, result = conn.execute(
        "SELECT status, last_error, result FROM jobs WHERE id = %s", (stuck,)).fetchone()
    assert (status, result) == ("queued", None)
    assert error.startswith("TimeoutError: ")


SEEN: contextvars.ContextVar[object] = contextvars.ContextVar("seen", default=None)


def test_what_one_async_job_sets_in_a_context_variable_never_reaches_the_next(conn):
    """A slot's async jobs run one after another, each in a task of its own with a
    copy of the drain's context: a request id or a logging binding set by one job is
    gone for the next, as it would be between two requests of a web framework."""
    met = []

    async def handler(job):
        met.append(SEEN.get())
        SEEN.set(job.id)
        await asyncio.sleep(0)

    drainer.enqueue_many(conn, "cv", [{}] * 30)
    token = SEEN.set(-1)  # the drain's own: every job starts with it
    try:
        summary = drain(conn, {"cv": handler}, Options(["cv"], concurrency=3, batch_size=30))
    finally:
        SEEN.reset(token)
    assert summary.done == 30
    assert met == [-1] * 30


def test_an_async_job_written_off_before_its_task_began_never_runs(conn):
    """A heartbeat may find a job lost (or a timeout fail it) between the hand-off of
    its work to the loop and its task's first step, when there is no task yet to
    cancel: the task then ends at once, its handler unrun, and the slot goes on."""
    ran = []

    async def handler(job):
        ran.append(job.id)

    first, second = (drainer.enqueue(conn, "w", {}) for _ in range(2))
    jobs = roundtrip.claim(conn, ["w"], 2, timedelta(minutes=5))

    def first_written_off(slots, job, awaitable):
        if job.id == first:  # as the heartbeat does when it finds a job lost
            with slots.core.lock:
                slots.core.lost.add(job.token)
                slots.core.outcome.lost.add(job.token)
            slots.write_off(job)
        return on_event_loop(slots, job, awaitable)

    batch = Batch(jobs, {"w": handler}, concurrency=1, lease=timedelta(minutes=5),
                  extend=lambda js: {j.token for j in js}, may_start=lambda job: True,
                  stop=threading.Event(), runner=Runner(on_handler_threads, first_written_off))
    outcome = batch.run()
    assert ran == [second]  # the slot went on
    assert [j.id for j in outcome.succeeded] == [second]
    assert outcome.lost == {(first, 1)} and not outcome.failed


def test_a_drain_runs_async_handlers_on_the_loop_it_is_told(conn, db_url, tmp_path, event_loop):
    """--event-loop picks the loop; auto is uvloop where it is installed (it is, here)."""
    for given, expected in ((event_loop, event_loop), ("auto", "uvloop")):
        seen = tmp_path / f"{given}.loop"
        drainer.enqueue(conn, "async", {"loop": str(seen)})
        ran = run_cli("drain", "--database-url", db_url, "--tasks", "asyncy",
                      "--event-loop", given)
        assert ran.returncode == 0, ran.stderr
        assert seen.read_text().split(".")[0] == expected


def test_uvloop_asked_for_and_missing_is_a_config_error(conn, monkeypatch):
    monkeypatch.setattr(clock, "uvloop_installed", lambda: False)
    drainer.enqueue(conn, "a", {})
    with pytest.raises(drainer.ConfigError, match=r"drainer\[uvloop\]"):
        drain(conn, {"a": lambda job: None}, Options(["a"], event_loop="uvloop"))
    with pytest.raises(drainer.ConfigError, match="one of auto, asyncio, uvloop"):
        drain(conn, {"a": lambda job: None}, Options(["a"], event_loop="trio"))
    assert drain(conn, {"a": lambda job: None}, Options(["a"], event_loop="auto")).done == 1


def test_an_async_job_started_off_the_loop_starts_in_the_drains_context_too(conn):
    """A slot's next async job may start on a pool thread (after a sync job, or in the
    fresh slot that replaces a timed-out one), whose own context lives on between
    jobs: what a sync job set there must not reach it."""
    met = []

    def sync_handler(job):
        SEEN.set(f"sync job {job.id}")

    async def async_handler(job):
        met.append(SEEN.get())
        if job.payload.get("stuck"):
            await asyncio.sleep(30)

    for n in range(6):  # claimed in id order: the queues take turns
        drainer.enqueue(conn, "cvs" if n % 2 == 0 else "cva", {"stuck": n == 1})
    token = SEEN.set("drain")
    try:
        summary = drain(conn, {"cvs": sync_handler,
                               "cva": Task(async_handler, "cva", timeout=0.3)},
                        Options(["cvs", "cva"], concurrency=1, batch_size=6))
    finally:
        SEEN.reset(token)
    assert (summary.done, summary.retried) == (5, 1)
    assert met == ["drain"] * 3


def test_systemexit_in_a_task_a_handler_started_fails_that_job_and_the_loop_goes_on(conn):
    """asyncio lets SystemExit out of its loop when a task raises it, not only the
    handler itself: the loop's thread ended, and every job on it waited forever (the
    drain hung, its leases kept alive by heartbeats)."""

    async def child():
        raise SystemExit(3)

    async def handler(job):
        if job.payload.get("exit"):
            await asyncio.gather(child())
        await asyncio.sleep(0.01)

    drainer.enqueue(conn, "se", {"exit": True})
    drainer.enqueue_many(conn, "se", [{}] * 3)
    stop, out = threading.Event(), {}

    def run():
        out["summary"] = drain(conn, {"se": handler},
                               Options(["se"], concurrency=2, lease=timedelta(seconds=3)),
                               stop=stop)

    drainer_thread = threading.Thread(target=run, daemon=True)
    drainer_thread.start()
    drainer_thread.join(20)
    hung = drainer_thread.is_alive()
    stop.set()
    drainer_thread.join(10)
    assert not hung, "the drain hung: the loop's thread had ended"
    assert (out["summary"].done, out["summary"].retried) == (3, 1)


def test_a_drain_asking_for_another_loop_leaves_another_drains_handlers_be(conn, db_url,
                                                                        event_loop):
    """drain() is a library call: of two drains in one process, one that asks for
    another kind of loop must not cancel the handlers the other runs on the first."""
    started, results = threading.Event(), {}

    async def slow(job):
        started.set()
        await asyncio.sleep(1)

    drainer.enqueue_many(conn, "sa", [{}] * 3)
    drainer.enqueue(conn, "sb", {})

    def first():
        with psycopg.connect(db_url, autocommit=True) as own:
            results["a"] = drain(own, {"sa": slow},
                                 Options(["sa"], concurrency=3, event_loop=event_loop))

    other = threading.Thread(target=first)
    other.start()
    assert started.wait(10)

    async def quick(job):
        pass

    switched = "uvloop" if event_loop == "asyncio" else "asyncio"
    assert drain(conn, {"sb": quick}, Options(["sb"], event_loop=switched)).done == 1
    other.join(30)
    assert (results["a"].done, results["a"].retried) == (3, 0)
    assert drain(conn, {"sb": quick}, Options(["sb"], event_loop="auto")).done == 0


def test_auto_with_a_uvloop_that_does_not_import_runs_on_asyncios_loop(
        conn, tmp_path, monkeypatch):
    """uvloop may be installed and still not import (built for another Python, a
    layer's): auto then runs the handlers on asyncio's loop, and asking for uvloop is
    refused before anything is claimed."""
    fake = tmp_path / "uvloop"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('built for another Python')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "uvloop" or m.startswith("uvloop.")]:
        monkeypatch.delitem(sys.modules, name)
    clock.end_threads()  # no loop made yet: the next is made afresh
    loops = []

    async def handler(job):
        loops.append(type(asyncio.get_running_loop()).__module__.split(".")[0])

    drainer.enqueue(conn, "bu", {})
    with pytest.raises(drainer.ConfigError, match="uvloop"):
        drain(conn, {"bu": handler}, Options(["bu"], event_loop="uvloop"))
    assert drain(conn, {"bu": handler}, Options(["bu"], event_loop="auto")).done == 1
    assert loops == ["asyncio"]


def test_a_drain_process_exits_with_a_written_off_handler_that_ignores_cancellation(
        conn, db_url, event_loop):
    drainer.enqueue(conn, "stubborn", {})
    drainer.enqueue_many(conn, "quick", [{}] * 5)
    ran = run_cli("drain", "--database-url", db_url, "--tasks", "stubborn", "--queue",
                  "stubborn", "--queue", "quick", "--concurrency", "2", "--event-loop",
                  event_loop, timeout=60)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (summary_of(ran.stdout)["done"], summary_of(ran.stdout)["retried"]) == (5, 1)
