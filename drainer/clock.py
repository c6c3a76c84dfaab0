"""The one seam for Python-side time and threads (deadlines, heartbeats, rates, the
waits between them, handler threads, delayed calls).

Job times never come from here: statements pass `database_now()`, None, and the
database clock decides leases, run_at and backoff. Functions look `time` up at call
time so freezegun can drive them; callers look the functions up here at call time
(`clock.sleep(...)`), so a simulation can put virtual time and threads in their
place with `installed(source)` (bench/simulator) without a cost to the code that
ships: nothing is looked up per call that was not before.
"""

import asyncio
import contextlib
import contextvars
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import datetime
from queue import SimpleQueue
from typing import Any, Protocol

log = logging.getLogger(__name__)

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


class TimeSource(Protocol):
    """Another source of Python-side time and threads, for `installed`: each method
    stands for this module's function of the same name. Its events and delayed calls
    need only what drainer uses of them: an event's is_set, set, clear and wait, a
    delayed call's cancel."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def database_now(self) -> datetime | None: ...

    def event(self) -> Any: ...

    def later(self, seconds: float, fn: Callable[..., None], *args: object) -> Any: ...

    def spawn(self, fn: Callable[[], None]) -> None: ...


SOURCED = ("monotonic", "wall", "sleep", "database_now", "event", "later", "spawn")


@contextmanager
def installed(source: TimeSource) -> Iterator[None]:
    """Time, waits, events, delayed calls and handler threads from `source` while
    inside (a simulation's virtual time: bench/simulator), and this module's own again
    after. Its functions are put in place of this module's (callers look them up here
    at call time), so the code that ships pays nothing for the seam. One at a time:
    not for threads that install sources of their own at once."""
    here = globals()
    saved = {name: here[name] for name in SOURCED}
    here.update({name: getattr(source, name) for name in SOURCED})
    try:
        yield
    finally:
        here.update(saved)


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


def loop_kind(text: str) -> str:
    """One of LOOPS (surrounding blanks dropped); ValueError names them."""
    if text.strip() not in LOOPS:
        raise ValueError(f"{text!r} must be one of {', '.join(LOOPS)}")
    return text.strip()


def uvloop_installed() -> bool:
    """Whether uvloop imports here (installed, and built for this Python)."""
    try:
        import uvloop  # noqa: F401 - only here: a drain without async handlers never pays it
    except ImportError:
        return False
    return True


def _resolved(kind: str) -> str:
    """The loop `kind` gives: "auto" is uvloop's when it imports, else asyncio's."""
    return "uvloop" if kind == "uvloop" or (kind == "auto" and uvloop_installed()) else "asyncio"


def _new_loop(kind: str) -> asyncio.AbstractEventLoop:
    """A loop of `kind`: uvloop's (faster timers and callbacks), or asyncio's."""
    if _resolved(kind) == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The loop's thread: run the loop until it is stopped, then close it. asyncio lets
    SystemExit and KeyboardInterrupt out of the loop when a task a handler started
    raises one: the loop runs on (the task holds the exception, for whoever awaits it),
    as its thread's end would leave every job on it waiting forever."""
    while True:
        try:
            loop.run_forever()
            break
        except (SystemExit, KeyboardInterrupt) as exc:
            log.warning("a task on the event loop raised %s; the loop goes on",
                        type(exc).__name__)
    loop.close()


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
                self.loop = _new_loop(self.kind)
                self.thread = threading.Thread(target=_serve, args=(self.loop,), daemon=True,
                                               name="drainer-async")
                self.thread.start()
            return asyncio.run_coroutine_threadsafe(awaited(awaitable), self.loop)

    def runs_here(self) -> bool:
        return self.thread is threading.current_thread()

    def gives(self, kind: str) -> bool:
        """Whether this loop is, or will be, of the kind `kind` gives."""
        with self.lock:
            made = self.loop is not None
        return kind == self.kind or (made and _resolved(kind) == _resolved(self.kind))

    def close(self, cancel: bool = True) -> None:
        """Stop the loop once its tasks have ended, its thread then closes it. With
        `cancel`, the tasks are cancelled first and may run their cancellation
        (`finally` blocks, `except CancelledError`): a task that blocks the loop, or
        will not end when cancelled, is waited for LOOP_CLOSE_WAIT seconds, then the
        loop is left to its daemon thread. Without, they run to their end."""
        with self.lock:
            loop, thread, self.loop, self.thread = self.loop, self.thread, None, None
        if loop is None or thread is None or not thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(_wind_down(cancel), loop)
        if cancel:
            thread.join(LOOP_CLOSE_WAIT)


async def _wind_down(cancel: bool) -> None:
    """Cancel every other task of the running loop if asked, wait for them to end
    (bounded when cancelled), and stop the loop."""
    while others := asyncio.all_tasks() - {asyncio.current_task()}:
        for other in others if cancel else ():
            other.cancel()
        await asyncio.wait(others, timeout=LOOP_CLOSE_WAIT if cancel else None)
        if cancel:
            break
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
_SWAP = threading.Lock()  # held while the process's loop is swapped for another


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
    """Cancel a task of the loop from any thread (on its loop's thread); nothing when
    its loop has been closed (a task of a closed loop never runs again)."""
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
        task.get_loop().call_soon_threadsafe(task.cancel)


def on_loop() -> bool:
    """Whether this is the event loop's thread, where nothing may block."""
    return _LOOP.runs_here()


def use_loop(kind: str) -> None:
    """Run async handlers on a loop of `kind` (one of LOOPS) from now on. A loop of
    another kind is retired: its tasks (another drain's handlers, in a program that
    runs two) run to their end on it, and it stops then; new ones go to the new loop."""
    global _LOOP
    with _SWAP:  # two drains starting at once: one swap at a time
        old = _LOOP
        if old.gives(kind):
            old.kind = kind
            return
        _LOOP = _Loop(kind)
    old.close(cancel=False)


def end_threads() -> None:
    """End the handler threads kept for later batches (a thread still in a handler
    ends when it returns), and the event loop of async handlers (its tasks
    cancelled); the next batch starts new ones. For tests: none starts with the
    threads an earlier one left, written-off handlers' included (see
    drainer.testing.reset)."""
    global _THREADS, _LOOP
    old, _THREADS = _THREADS, _Threads()
    old.close()
    with _SWAP:
        loop, _LOOP = _LOOP, _Loop()
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
