"""`clock.process_start`: the process's start as the OS recorded it, on the monotonic
scale, so `--max-runtime` also counts the interpreter's start and the imports; the
end of the async handlers' event loop (`clock.end_threads`); and another time source
put in the seam's place (`clock.installed`), as the simulator does."""

import asyncio
import subprocess
import sys
import threading
from datetime import UTC, datetime

import pytest

from drainer import clock
from drainer.engine.core import Freshness
from tests.helpers import clean_env

# /proc counts the start in clock ticks (10 ms) and the uptime in hundredths.
GRAIN = 0.05
SLEEP = 1.0
CHILD = f"""
import time
time.sleep({SLEEP})  # the process has run this long before drainer is imported
from drainer import clock
print(clock.process_start(), clock.monotonic())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_start_is_the_processes_own_not_the_import():
    # CLOCK_MONOTONIC is one clock for every process of the machine, so the child's
    # start can be placed between two moments of this one.
    spawned = clock.monotonic()
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                           env=clean_env(), timeout=60, check=True)
    start, later = map(float, child.stdout.split())
    assert start >= spawned - GRAIN  # not before the process existed
    assert later - start >= SLEEP - GRAIN  # the sleep before the import is counted


def test_without_proc_the_start_is_the_import_of_the_clock(monkeypatch, tmp_path):
    monkeypatch.setattr(clock, "PROC_STAT", str(tmp_path / "missing"))
    assert clock.process_start() == clock.IMPORTED


def test_ending_the_loop_cancels_its_tasks_and_ends_its_thread():
    started, cleaned_up = threading.Event(), threading.Event()

    async def pending():
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            cleaned_up.set()

    future = clock.run_async(pending())
    assert started.wait(5)
    [thread] = [t for t in threading.enumerate() if t.name == "drainer-async"]
    clock.end_threads()
    assert cleaned_up.is_set()  # its cancellation ran before end_threads returned
    assert future.cancelled()
    assert not thread.is_alive()
    assert clock.run_async(asyncio.sleep(0, "again")).result(5) == "again"  # a new loop


class Source:
    """A time source of a test's own: time moves when slept, threads are noted."""

    def __init__(self) -> None:
        self.now = 100.0
        self.spawned: list[object] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 5_000.0 + self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def database_now(self) -> datetime:
        return datetime(2030, 1, 1, tzinfo=UTC)

    def event(self) -> str:
        return "an event"

    def later(self, seconds: float, fn: object, *args: object) -> tuple[float, object]:
        return seconds, fn

    def spawn(self, fn: object) -> None:
        self.spawned.append(fn)


def test_an_installed_time_source_drives_the_seam_and_the_seam_is_its_own_again_after():
    real = {name: getattr(clock, name) for name in clock.SOURCED}
    source = Source()
    with pytest.raises(RuntimeError), clock.installed(source):
        clock.sleep(2.5)
        assert (clock.monotonic(), clock.wall()) == (102.5, 5_102.5)
        assert clock.database_now() == datetime(2030, 1, 1, tzinfo=UTC)
        assert (clock.event(), clock.later(3.0, print)) == ("an event", (3.0, print))
        clock.spawn(print)
        assert source.spawned == [print]
        # Code elsewhere sees it: it looks the seam's functions up as it calls them.
        confirmed = Freshness(lease=10.0, confirmed=None)
        assert (confirmed.confirmed, confirmed.wall) == (102.5, 5_102.5)
        raise RuntimeError("the block ends with an error")
    assert {name: getattr(clock, name) for name in clock.SOURCED} == real
    assert clock.monotonic() != 102.5
