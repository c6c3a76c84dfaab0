"""`clock.process_start`: the process's start as the OS recorded it, on the monotonic
scale, so `--max-runtime` also counts the interpreter's start and the imports; and
the end of the async handlers' event loop (`clock.end_threads`)."""

import asyncio
import subprocess
import sys
import threading

import pytest

from drainer import clock
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
