"""`job.cancelled`: a running job's handler learns at the next heartbeat that the job is
no longer its worker's (cancelled, or taken over), and heartbeats come every
CANCEL_CHECK seconds only while a handler looks. The batch alone, its time driven
through the clock seam; then a real drain process and `drainer cancel`."""

import asyncio
import dataclasses
import json
import threading
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest

import drainer
from drainer import clock
from drainer.db import connect
from drainer.engine import batch
from drainer.engine import summary as summary_
from drainer.engine.batch import MAX_HEARTBEAT
from drainer.engine.core import CANCEL_CHECK
from drainer.model import Job, Token
from drainer.run import Summary
from drainer.storage import roundtrip, writeback
from drainer.tasks import Task
from tests.helpers import drainer_process, run_cli, summary_of, wait_until

START = 1000.0
REAL_WAIT = 30.0  # seconds of real time a test thread waits before giving up


class Ticks:
    """The clock seam for one batch: time stands still until `ready` is set (the
    handler has begun, looked or not), then every wait of the batch's loop that
    times out moves it on by its whole timeout at once."""

    def __init__(self, ready: threading.Event) -> None:
        self.now = START
        self.ready = ready

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + 1e9

    def event(self) -> threading.Event:
        return _Waits(self)


class _Waits(threading.Event):
    """An event whose timed waits take a moment of real time (for the handler threads)
    and their full timeout of the fake clock's."""

    def __init__(self, ticks: Ticks) -> None:
        super().__init__()
        self.ticks = ticks

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            return super().wait()
        self.ticks.ready.wait(REAL_WAIT)
        if super().wait(0.005):
            return True
        self.ticks.now += timeout
        return False


@pytest.fixture
def ticks(monkeypatch) -> Ticks:
    fake = Ticks(threading.Event())
    for name in ("monotonic", "wall", "event"):
        monkeypatch.setattr(clock, name, getattr(fake, name))
    return fake


def run_batch(job: Job, handler: Callable[[Job], None], extend: Callable[[list[Job]], set[Token]],
              lease: float = 60) -> batch.Outcome:
    return batch.Batch([job], {"default": handler}, concurrency=1,
                       lease=timedelta(seconds=lease), extend=extend,
                       may_start=lambda j: True, stop=threading.Event()).run()


def a_job() -> Job:
    return Job(1, "default", None, 1, 5)


# -- the event itself ------------------------------------------------------------------

def test_the_event_is_made_once_when_first_asked_for_and_is_no_part_of_the_jobs_value():
    job, twin = a_job(), a_job()
    assert not job.cancel_watched
    start = threading.Barrier(8)
    events: list[threading.Event] = []

    def look() -> None:
        start.wait()
        events.append(job.cancelled)

    threads = [threading.Thread(target=look) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(e) for e in events}) == 1 and job.cancel_watched
    job.cancelled.set()
    assert job == twin and repr(job) == repr(twin) and hash(a_job()) == hash(job)
    assert "cancel" not in repr(job) and Job.__match_args__ == (
        "id", "queue", "payload", "attempts", "max_attempts", "meta")
    with pytest.raises(TypeError):
        Job(1, "default", {}, 1, 5, None, threading.Event())  # not a constructor argument


def test_a_job_and_a_dataclass_subclass_of_it_carry_their_token():
    """Job sets its fields itself; a dataclass subclass's generated __init__ still gets
    the token (from __post_init__), as does dataclasses.replace."""
    @dataclasses.dataclass(frozen=True, slots=True)
    class Traced(Job):
        trace: str = ""

    assert Traced(7, "default", {}, 2, 5).token == (7, 2) == a_job_with(7, 2).token
    assert dataclasses.replace(a_job_with(7, 2), attempts=3).token == (7, 3)


def a_job_with(job_id: int, attempts: int) -> Job:
    return Job(job_id, "default", None, attempts, 5)


# -- the batch's heartbeats ------------------------------------------------------------

@pytest.mark.parametrize("looks, lease", [(False, 60), (True, 60), (False, 600), (True, 600),
                                          (True, 6)])
def test_heartbeats_come_every_cancel_check_only_while_a_handler_looks(ticks, looks, lease):
    job, release, beats = a_job(), threading.Event(), []

    def handler(j: Job) -> None:
        if looks:
            j.cancelled  # noqa: B018 - looking is the point
        ticks.ready.set()
        release.wait(REAL_WAIT)

    def extend(js: list[Job]) -> set[Token]:
        beats.append(ticks.now)
        if len(beats) == 3:
            release.set()
        return {j.token for j in js}

    outcome = run_batch(job, handler, extend, lease)
    steady = min(lease / 3, MAX_HEARTBEAT)
    every = min(steady, CANCEL_CHECK) if looks else steady
    assert beats[:3] == [START + every * k for k in (1, 2, 3)]
    assert outcome.succeeded == [job] and not outcome.lost
    assert job.cancel_watched == looks  # a job still ours gets no event made for it


def test_the_heartbeat_that_finds_the_job_gone_sets_its_event_and_it_is_counted_lost(ticks):
    job, beats, saw = a_job(), [], []

    def handler(j: Job) -> None:
        cancelled = j.cancelled
        ticks.ready.set()
        saw.append(cancelled.wait(REAL_WAIT))
        wait_until(lambda: len(beats) >= 3, timeout=REAL_WAIT)  # then returns normally

    def extend(js: list[Job]) -> set[Token]:
        beats.append(ticks.now)
        return set()  # cancelled meanwhile

    outcome = run_batch(job, handler, extend)
    assert saw == [True] and beats[0] == START + CANCEL_CHECK
    assert outcome.lost == {job.token} and not outcome.succeeded and not outcome.abandoned
    # Found lost, the job no longer hurries the heartbeats while its handler runs on.
    assert beats[1:3] == [beats[0] + 60 / 3 * k for k in (1, 2)]


def test_a_job_lost_before_its_handler_looks_has_its_event_set_all_the_same(ticks):
    job, beats, saw = a_job(), [], []

    def handler(j: Job) -> None:
        ticks.ready.set()
        # Wait, without making the event, until the heartbeat has.
        wait_until(lambda: j.cancel_watched, timeout=REAL_WAIT)
        saw.append(j.cancelled.wait(REAL_WAIT))

    def extend(js: list[Job]) -> set[Token]:
        beats.append(ticks.now)
        return set()  # taken over

    outcome = run_batch(job, handler, extend)
    assert saw == [True] and beats[0] == START + 60 / 3  # no one looked: the steady pace
    assert outcome.lost == {job.token}


def test_an_async_handler_whose_job_is_lost_is_cancelled(ticks):
    """No thread to abandon: the heartbeat that finds the job gone cancels its work."""
    job, saw = a_job(), []

    async def handler(j: Job) -> None:
        ticks.ready.set()
        try:
            await asyncio.sleep(REAL_WAIT)
        except asyncio.CancelledError:
            saw.append("cancelled")
            raise
        saw.append("slept on")

    outcome = run_batch(job, handler, lambda js: set())  # cancelled meanwhile
    # The batch is done with the job once its work is cancelled; the handler's own
    # `except` runs at the loop's next turn.
    assert wait_until(lambda: saw, timeout=REAL_WAIT) == ["cancelled"]
    assert outcome.lost == {job.token} and not outcome.failed and not outcome.abandoned


def test_a_handler_that_stops_at_the_cancel_changes_nothing_in_the_table(ticks, conn):
    drainer.enqueue(conn, "default", {})
    [job] = drainer.claim(conn, ["default"], 1, timedelta(seconds=60))
    saw = []

    def handler(j: Job) -> None:
        cancelled = j.cancelled
        assert drainer.cancel(conn, [j.id]) == [j.id]
        ticks.ready.set()
        saw.append(cancelled.wait(REAL_WAIT))

    outcome = run_batch(job, handler,
                        lambda js: writeback.extend_claims(conn, js, timedelta(seconds=60)))
    assert saw == [True]
    summary = Summary()
    summary_.record(roundtrip.settle(conn, outcome.succeeded, outcome.failed, outcome.unstarted),
                outcome, summary)
    assert (summary.claimed, summary.done, summary.failed, summary.lost) == (1, 0, 0, 1)
    # Even written back as done, its result changes nothing: the write is guarded.
    assert roundtrip.settle(conn, [job], [], []).done == set()
    assert conn.execute("SELECT status, last_error, attempts FROM jobs").fetchone() == (
        "failed", "cancelled", job.attempts)


# -- a real drain, cancelled from the command line --------------------------------------

LEASE = 300  # seconds: the drain's default, pinned
STEADY = min(LEASE / 3, MAX_HEARTBEAT)
# The handler's own bound: well past a heartbeat at CANCEL_CHECK (a loaded machine, the
# cancel command's start) and before the steady heartbeat, so only the quicker pace
# can wake the handler in time.
FALLBACK = STEADY / 2
assert CANCEL_CHECK * 3 < FALLBACK < STEADY


def test_a_drains_handler_sees_its_job_cancelled_and_the_summary_counts_it_lost(db_url,
                                                                                tmp_path):
    started, seen = tmp_path / "started", tmp_path / "seen"
    with connect(db_url) as conn:
        job = drainer.enqueue(conn, "watches_cancel", {"started": str(started),
                                                       "seen": str(seen),
                                                       "fallback": FALLBACK})
    proc = drainer_process(db_url, "--tasks", "cancellable", "--lease", str(LEASE))
    try:
        wait_until(started.exists, timeout=60)
        cancel = run_cli("cancel", str(job), "--database-url", db_url)
        assert json.loads(cancel.stdout) == {"cancelled": 1, "ids": [job]}, cancel.stderr
        out, err = proc.communicate(timeout=FALLBACK + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert json.loads(seen.read_text()) == {"seen": True}  # before its fallback
    s = summary_of(out)
    assert (s["claimed"], s["done"], s["retried"], s["failed"], s["lost"]) == (1, 0, 0, 0, 1)
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = "SELECT status, last_error, attempts FROM jobs WHERE id = %s"
        assert conn.execute(row, (job,)).fetchone() == ("failed", "cancelled", 1)

        # A queue's requeue leaves it alone; by id it comes back.
        requeued = run_cli("requeue", "--queue", "watches_cancel", "--database-url", db_url)
        assert json.loads(requeued.stdout) == {"requeued": 0, "ids": []}, requeued.stderr
        assert conn.execute(row, (job,)).fetchone() == ("failed", "cancelled", 1)
        assert drainer.requeue(conn, ids=[job]) == [job]
        assert conn.execute(row, (job,)).fetchone() == ("queued", None, 1)


def test_a_handler_written_off_at_its_timeout_sees_cancelled(conn):
    seen = threading.Event()

    def slow(job):
        if job.cancelled.wait(10):
            seen.set()

    drainer.enqueue(conn, "slow", {})
    summary = drainer.drain(conn, {"slow": Task(slow, "slow", timeout=0.3)},
                            drainer.Options(["slow"]))
    assert summary.retried == 1
    assert seen.wait(5)  # the abandoned thread was told, long before its own 10 s
