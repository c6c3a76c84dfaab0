"""The one seam for Python-side time and threads (deadlines, heartbeats, rates, the
waits between them, handler threads, delayed calls).

Job times never come from here: statements pass `database_now()`, None, and the
database clock decides leases, run_at and backoff. Functions look `time` up at call
time so freezegun can drive them; callers look the functions up here at call time
(`clock.sleep(...)`), so a simulation can put virtual time and threads in their
place (bench/simulator) without a cost to the code that ships.
"""

import asyncio
import contextvars
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from datetime import datetime
from importlib.util import find_spec
from queue import SimpleQueue
from typing import Any

PROC_STAT = "/proc/self/stat"
PROC_UPTIME = "/proc/uptime"
IMPORTED = time.monotonic()  # the start when the OS does not say (not Linux)
# Seconds `end_threads` waits for the event loop's tasks to end once cancelled.
LOOP_CLOSE_WAIT = 5.0


def monotonic() -> float:
    """Seconds on a clock that never goes back; for deadlines and durations."""
    return time.monotonic()


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def wall() -> float:
    """Seconds since the epoch, for log and metric timestamps and for timing the cloud
    run's own wake-ups; never for a job's times."""
    return time.time()


def database_now() -> datetime | None:
    """The `now` drainer's statements pass: None, so the database's clock decides."""
    return None


def event() -> threading.Event:
    """An event to wait for with a timeout (a batch's end, between heartbeats)."""
    return threading.Event()


def later(seconds: float, fn: Callable[..., None], *args: object) -> threading.Timer:
    """`fn(*args)` on a daemon thread in `seconds`, unless cancelled before then; a
    process that exits meanwhile drops it."""
    timer = threading.Timer(seconds, fn, args)
    timer.daemon = True
    timer.start()
    return timer


def spawn(fn: Callable[[], None]) -> None:
    """`fn()` on a daemon thread of the handler pool."""
    _THREADS.start(fn)


class _Threads:
    """Daemon threads that wait for work between batches. One stuck in a handler
    never comes back; a new thread starts whenever none is idle. Threads outlive
    their batch and serve the next one: starting threads for every batch costs
    more than a batch of fast handlers."""

    def __init__(self) -> None:
        self.work: SimpleQueue[Callable[[], None] | None] = SimpleQueue()  # None: end
        self.idle = 0
        self.lock = threading.Lock()
        self.closed = False

    def start(self, fn: Callable[[], None]) -> None:
        with self.lock:
            reuse = self.idle > 0
            self.idle -= reuse
        if not reuse:
            threading.Thread(target=self._serve, daemon=True, name="drainer-handler").start()
        self.work.put(fn)

    def close(self) -> None:
        """End the idle threads now, and the busy ones when their handler returns."""
        with self.lock:
            self.closed, idle, self.idle = True, self.idle, 0
        for _ in range(idle):
            self.work.put(None)

    def _serve(self) -> None:
        while (fn := self.work.get()) is not None:
            fn()
            with self.lock:
                if self.closed:
                    return
                self.idle += 1


_THREADS = _Threads()


LOOPS = ("auto", "asyncio", "uvloop")  # the kinds of event loop async handlers may run on


def uvloop_installed() -> bool:
    return find_spec("uvloop") is not None


def _new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A loop of `kind`: uvloop's (faster timers and callbacks) when asked for, or for
    "auto" when it is installed; else asyncio's."""
    if kind == "uvloop" or (kind == "auto" and uvloop_installed()):
        import uvloop  # only here: a drain without async handlers never pays its import

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class _Loop:
    """The process's one event loop for async handlers, on a daemon thread of its own,
    started when the first async handler runs: a loop per job would cost a loop's
    start each time and share nothing (clients, connection pools) between jobs."""

    def __init__(self, kind: str = "auto") -> None:
        self.lock = threading.Lock()
        self.kind = kind
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None

    def submit(self, awaitable: Awaitable[Any]) -> "Future[Any]":
        with self.lock:
            # The thread, not loop.is_running(): a loop just started is not running yet.
            if self.loop is None or self.thread is None or not self.thread.is_alive():
                if self.loop is not None:
                    self.loop.close()  # its thread ended: nothing runs it any more
                self.loop = _new_loop(self.kind)
                self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                               name="drainer-async")
                self.thread.start()
            return asyncio.run_coroutine_threadsafe(awaited(awaitable), self.loop)

    def runs_here(self) -> bool:
        return self.thread is threading.current_thread()

    def close(self) -> None:
        """Cancel the loop's tasks and let them run their cancellation (`finally`
        blocks, `except CancelledError`), then stop the loop, wait for its thread and
        close it. A task that blocks the loop, or will not end when cancelled, is
        waited for LOOP_CLOSE_WAIT seconds, then the loop is left to its daemon thread."""
        with self.lock:
            loop, thread, self.loop, self.thread = self.loop, self.thread, None, None
        if loop is None or thread is None:
            return
        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(_wind_down(), loop)
            thread.join(LOOP_CLOSE_WAIT)
        if not thread.is_alive():
            loop.close()


async def _wind_down() -> None:
    """Cancel every other task of the running loop, wait (bounded) for them to end,
    and stop the loop."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for other in others:
        other.cancel()
    if others:
        await asyncio.wait(others, timeout=LOOP_CLOSE_WAIT)
    asyncio.get_running_loop().stop()


class HandlerExit(Exception):  # noqa: N818 - what a handler's exit became
    """`SystemExit` or `KeyboardInterrupt` raised by an async handler, as an ordinary
    exception: asyncio lets those two out of the loop, which would end the loop's
    thread and leave every job waiting on it waiting forever."""


async def awaited(awaitable: Awaitable[Any]) -> Any:
    try:
        return await awaitable
    except (SystemExit, KeyboardInterrupt) as exc:
        raise HandlerExit(f"{type(exc).__name__}: {exc}") from exc


_LOOP = _Loop()


def run_async(awaitable: Awaitable[Any]) -> "Future[Any]":
    """Run `awaitable` on the process's event loop; its future (cancel it to cancel
    the task: asyncio raises CancelledError at its next await)."""
    return _LOOP.submit(awaitable)


def start_here(coroutine: Coroutine[Any, Any, None],
               context: contextvars.Context) -> "asyncio.Task[None]":
    """On the event loop's own thread: `coroutine` as a task of the loop in `context`,
    without run_async's hand-offs (a future on each side, chained, and a wake-up of
    the loop through its pipe), the most of an async job's cost to the loop. The
    coroutine must let no SystemExit out (see `awaited`)."""
    return asyncio.get_running_loop().create_task(coroutine, context=context)


def cancel(task: "asyncio.Task[Any]") -> None:
    """Cancel a task of the loop from any thread (on its loop's thread)."""
    task.get_loop().call_soon_threadsafe(task.cancel)


def on_loop() -> bool:
    """Whether this is the event loop's thread, where nothing may block."""
    return _LOOP.runs_here()


def use_loop(kind: str) -> None:
    """Run async handlers on a loop of `kind` (one of LOOPS) from now on: a loop of
    another kind is ended (its tasks cancelled: only handlers written off by earlier
    drains are left on it), and the next async handler starts the new one."""
    global _LOOP
    if kind != _LOOP.kind:
        loop, _LOOP = _LOOP, _Loop(kind)
        loop.close()


def end_threads() -> None:
    """End the handler threads kept for later batches (a thread still in a handler
    ends when it returns), and the event loop of async handlers (its tasks
    cancelled); the next batch starts new ones. For tests: none starts with the
    threads an earlier one left, written-off handlers' included (see
    drainer.testing.reset)."""
    global _THREADS, _LOOP
    old, _THREADS = _THREADS, _Threads()
    old.close()
    loop, _LOOP = _LOOP, _Loop(_LOOP.kind)
    loop.close()


def process_start() -> float:
    """When this process started, on `monotonic`'s scale: a run's `--max-runtime`
    must include the interpreter's start and the imports, which take a good part of
    a second, so it counts from the OS's record of the start (Linux: /proc), and
    from this module's import where there is none."""
    try:
        return min(IMPORTED, monotonic() - _seconds_since_start())
    except (OSError, ValueError, IndexError):
        return IMPORTED


def _seconds_since_start() -> float:
    """/proc/self/stat's `starttime` (field 22, clock ticks since boot) against
    /proc/uptime (seconds since boot): both on the boot clock."""
    with open(PROC_STAT) as stat:
        # The command name (field 2) is in parentheses and may hold spaces or ')'.
        fields = stat.read().rsplit(")", 1)[1].split()
    with open(PROC_UPTIME) as uptime:
        since_boot = float(uptime.read().split()[0])
    return max(0.0, since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
