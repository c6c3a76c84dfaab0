"""How many handler slots a batch opens: few for handlers that end within
microseconds (each slot is a thread's hand-off, which costs more than they do), all of
them while the handlers' pace is unknown, when they take time, or as soon as one runs
long while others wait behind it."""

import threading
import time
from datetime import timedelta

import pytest
from freezegun import freeze_time

import drainer
from drainer import clock
from drainer.engine.batch import Batch
from drainer.engine.core import Pace
from drainer.engine.slots import Slots
from drainer.model import Job
from drainer.run import Options, drain


@pytest.mark.parametrize(("ran", "blocked", "jobs", "slots"), [
    (None, False, 50, 50),  # nothing measured yet: every slot
    (0.002, False, 50, 50),  # handlers that take time: every slot
    (0.000_002, False, 50, 1),  # 100 µs of work in all: one slot
    (0.000_1, False, 50, 5),  # 5 ms of work: a slot per millisecond of it
    (0.000_002, True, 50, 50),  # one has run long: the others get slots of their own
])
def test_a_batch_opens_a_slot_for_each_millisecond_of_work_it_expects(ran, blocked, jobs,
                                                                      slots):
    pace = Pace()
    if ran is not None:
        pace.ran(ran)
    assert pace.slots(jobs, blocked) == slots


@pytest.fixture
def handed(monkeypatch) -> list[int]:
    """How many jobs had run as each slot was handed to a pool thread."""
    handed: list[int] = []
    spawn = clock.spawn

    def counted(fn):
        handed.append(len(RAN))
        spawn(fn)

    RAN.clear()
    monkeypatch.setattr(clock, "spawn", counted)
    return handed


RAN: list[int] = []


def noop(job: Job) -> None:
    RAN.append(job.id)  # list.append: atomic under the GIL


def test_fast_handlers_are_handed_to_one_thread(handed, monkeypatch):
    """Handlers known to take microseconds: fifty jobs at concurrency 50 go to one
    pool thread, which runs them one after another."""
    pace = Pace()
    pace.ran(0.000_002)
    monkeypatch.setattr(Pace, "WORK", 1.0)  # no handler seems blocked on a busy machine
    outcome = Batch([Job(i, "default", None, 1, 5) for i in range(1, 51)],
                    {"default": noop}, concurrency=50, lease=timedelta(minutes=5),
                    extend=lambda js: {j.token for j in js}, may_start=lambda j: True,
                    stop=threading.Event(), pace=pace).run()
    assert len(outcome.succeeded) == 50
    assert handed == [0]


def test_a_drain_learns_its_handlers_pace_from_its_first_batch(conn, handed, monkeypatch):
    """Claims of 50 at --concurrency 50, ten batches: past the first, a batch of no-op
    handlers is handed to a thread, not to one per slot (before: five to ten a batch
    here, as many as the slots' threads woke before the first ran every job)."""
    drainer.enqueue_many(conn, "default", [{}] * 500)
    monkeypatch.setattr(Pace, "WORK", 0.05)  # no handler seems blocked on a busy machine
    summary = drain(conn, {"default": noop},
                    Options(queues=["default"], batch_size=50, concurrency=50))
    assert summary.done == 500
    assert len([ran for ran in handed if ran >= 100]) <= 2 * 8


def test_a_handler_that_runs_long_gets_the_jobs_waiting_behind_it_slots_of_their_own():
    """Handlers known to be fast: the batch opens one slot. Its first job then waits
    (10 s at most) until every other job ran: it returns early only if they got slots
    while it ran."""
    pace = Pace()
    pace.ran(0.000_001)
    others_ran = threading.Event()
    left = [9]
    lock = threading.Lock()
    seen: list[bool] = []

    def handler(job: Job) -> None:
        if job.id == 1:
            seen.append(others_ran.wait(10))
            return
        with lock:
            left[0] -= 1
            if not left[0]:
                others_ran.set()

    outcome = Batch([Job(i, "default", None, 1, 5) for i in range(1, 11)],
                    {"default": handler}, concurrency=10, lease=timedelta(minutes=5),
                    extend=lambda js: {j.token for j in js}, may_start=lambda j: True,
                    stop=threading.Event(), pace=pace).run()
    assert seen == [True]
    assert len(outcome.succeeded) == 10


def jobs(*ids: int) -> list[Job]:
    return [Job(i, "default", None, 1, 5) for i in ids]


def test_a_slow_heartbeat_round_trip_does_not_hold_back_jobs_waiting_behind_a_long_handler(
        monkeypatch):
    """Handlers known to be fast: the batch opens one slot. Job 1 then waits (2 s at
    most) for job 2, while the batch's thread is in a heartbeat whose round trip takes
    5 s (a reconnect's pauses, the link held by a refill's write-back, a slow server).
    Job 2 must get a slot of its own meanwhile: before the change every slot was open
    from the start. The pool thread is held back only until the heartbeat is out, so
    the batch's thread surely saw job 1 not yet long when it last looked."""
    pace = Pace()
    pace.ran(0.000_002)
    in_heartbeat, job2_ran = threading.Event(), threading.Event()
    seen: list[bool] = []
    spawn = clock.spawn

    def held_back(fn) -> None:  # a handler slot's thread starts once the heartbeat is out
        if getattr(fn, "__func__", None) is Slots.work:
            spawn(lambda: (in_heartbeat.wait(10), fn()))
        else:
            spawn(fn)

    monkeypatch.setattr(clock, "spawn", held_back)

    def extend(js: list[Job]) -> set:
        in_heartbeat.set()
        job2_ran.wait(5)  # a slow round trip (returns early once job 2 has run)
        return {j.token for j in js}

    def handler(job: Job) -> None:
        if job.id == 1:
            seen.append(job2_ran.wait(2))
        else:
            job2_ran.set()

    lease = timedelta(seconds=60)
    # Confirmed 24 s ago: a heartbeat is due at once (every 20 s), yet the leases are
    # fresh enough to start jobs (for 30 s).
    outcome = Batch(jobs(1, 2), {"default": handler}, concurrency=2, lease=lease,
                    extend=extend, may_start=lambda j: True, stop=threading.Event(),
                    confirmed=clock.monotonic() - 24, pace=pace).run()
    assert seen == [True]
    assert len(outcome.succeeded) == 2


@pytest.mark.parametrize("learned", [False, True],
                         ids=["frozen throughout", "frozen once the pace was learned"])
def test_a_frozen_clock_leaves_every_slot_open(monkeypatch, learned):
    """Under a frozen clock every handler seems to take no time, and none to run long:
    handlers that wait for each other must still get a slot each, whether the clock
    was frozen from the start or stopped once the pace was learned (a test's freezegun
    started while a drain runs). Two batches share a pace: in the second, job 1 waits
    (10 s at most) for job 2 to run."""
    monkeypatch.setattr("freezegun.api.call_stack_inspection_limit", 0)  # every thread
    monkeypatch.setattr(Pace, "WORK", 0.5)  # a busy machine's no-op stays below it
    pace = Pace()
    job2_ran = threading.Event()
    seen: list[bool] = []

    def handler(job: Job) -> None:
        if job.id == 1:
            seen.append(job2_ran.wait(10))
        elif job.id == 2:
            job2_ran.set()

    def batch(js: list[Job], fn) -> None:
        Batch(js, {"default": fn}, concurrency=2, lease=timedelta(minutes=5),
              extend=lambda j: {x.token for x in j}, may_start=lambda j: True,
              stop=threading.Event(), pace=pace).run()

    frozen = freeze_time("2026-12-05 12:00:00")
    if not learned:
        frozen.start()
    try:
        batch(jobs(*range(10, 60)), noop)
        if learned:
            assert pace.seconds is not None and pace.seconds < Pace.WORK
            frozen.start()
        batch(jobs(1, 2), handler)
    finally:
        frozen.stop()
    assert seen == [True]


def test_the_pace_of_small_batches_is_not_only_their_fastest_handler():
    """Twenty batches of 10 jobs share a pace (a limited queue's batches hold no more
    jobs than slots, so batches under PACE_SAMPLE are the rule there): in each, nine
    handlers sleep 3 ms and one, in the middle, returns at once. The handlers' mean is
    2.7 ms: the handler timed is chosen as it starts, not as it ends (the first to end
    is the fastest, and the pace would drift down to a no-op's)."""
    pace = Pace()

    def handler(job: Job) -> None:
        if job.id % 10 != 5:
            time.sleep(0.003)

    for b in range(20):
        outcome = Batch([Job(10 * b + i, "default", None, 1, 5) for i in range(10)],
                        {"default": handler}, concurrency=10, lease=timedelta(minutes=5),
                        extend=lambda js: {j.token for j in js}, may_start=lambda j: True,
                        stop=threading.Event(), pace=pace).run()
        assert len(outcome.succeeded) == 10
    assert pace.seconds is not None and pace.seconds >= Pace.WORK, pace.seconds
