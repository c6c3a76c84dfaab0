"""Virtual time for real threads, behind `drainer.clock`.

The drain, its batches' handler threads, the function's run and the kick
coalescer are drainer's own code on real threads; every wait they make goes
through `drainer.clock`, which `installed()` points here (`clock.installed`).
One simulated thread runs at a time (the others wait for their turn on a
semaphore); when every one waits on virtual time, the clock jumps to the earliest
wake-up, so a day replays in seconds. Statements take no virtual time: nothing of drainer's holds a
lock across a wait on the clock, so a thread never blocks on a real lock held by
one that waits for its turn.
"""

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from types import ModuleType

from drainer import clock


class Stopped(BaseException):
    """Raised in the threads still waiting when the replay ends, to unwind them."""


class _Wake:
    """One wait of one thread: the first of its event and its timeout resumes it."""

    def __init__(self, kernel: "Kernel", thread: "_Thread") -> None:
        self.kernel, self.thread = kernel, thread
        self.fired = self.timed_out = False

    def __call__(self, timed_out: bool = False) -> None:
        if not self.fired:
            self.fired, self.timed_out = True, timed_out
            self.kernel.ready.append(self.thread)


class _Thread:
    """A real thread that runs only while the kernel has handed it the turn."""

    def __init__(self, kernel: "Kernel", fn: Callable[[], object], group: int) -> None:
        self.kernel, self.fn, self.group = kernel, fn, group
        self.turn = threading.Semaphore(0)
        self.waiting: _Wake | None = None
        self.thread = threading.Thread(target=self._main, daemon=True, name="simulated")
        self.thread.start()

    def _main(self) -> None:
        kernel = self.kernel
        self.turn.acquire()
        kernel.local.thread = self
        try:
            if not kernel.stopping and self.group not in kernel.dead:
                self.fn()
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - reported by Kernel.run
            kernel.failure = kernel.failure or exc
        finally:
            kernel.live.discard(self)
            kernel.yielded.release()

    def park(self, wake: _Wake) -> None:
        """Give the turn back until `wake` fires; a thread whose group died meanwhile
        waits on, for nothing, until the replay ends."""
        while True:
            self.waiting = wake
            self.kernel.yielded.release()
            self.turn.acquire()
            self.waiting = None
            if self.kernel.stopping:
                raise Stopped
            if self.group not in self.kernel.dead:
                return
            wake = _Wake(self.kernel, self)  # fired by nothing but the replay's end


class Event:
    """`threading.Event` on virtual time."""

    def __init__(self, kernel: "Kernel") -> None:
        self.kernel = kernel
        self.flag = False
        self.waiters: list[_Wake] = []

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()

    def clear(self) -> None:
        self.flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if not self.flag:
            wake = self.kernel.block(timeout, self.waiters.append)
            if wake in self.waiters:
                self.waiters.remove(wake)
        return self.flag


class Later:
    """A call to come (`clock.later`), which `cancel()` drops."""

    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Kernel:
    """The virtual clock (`now`, seconds since `start`), the timers, and the turn."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.now = 0.0
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self.order = itertools.count()  # ties run in the order they were scheduled
        self.ready: deque[_Thread] = deque()
        self.live: set[_Thread] = set()
        self.yielded = threading.Semaphore(0)  # the running thread gave the turn back
        self.local = threading.local()
        self.stopping = False
        self.failure: BaseException | None = None
        self.groups = itertools.count(1)  # a thread's group: its spawner's, or a new one
        self.dead: set[int] = set()

    def call_at(self, moment: float, action: Callable[[], None]) -> None:
        """`action()` on the kernel's own thread at `moment`; it must not wait."""
        if not self.stopping:
            heapq.heappush(self.timers, (max(moment, self.now), next(self.order), action))

    def spawn(self, fn: Callable[..., object], *args: object) -> None:
        """`fn(*args)` on a new simulated thread, from now, in the spawning thread's
        group (a new group when the kernel's timers spawn it)."""
        parent = getattr(self.local, "thread", None)
        group = parent.group if parent is not None else next(self.groups)
        thread = _Thread(self, lambda: fn(*args), group)
        self.live.add(thread)
        self.ready.append(thread)

    def later(self, seconds: float, fn: Callable[..., object], *args: object) -> Later:
        call = Later()
        self.call_at(self.now + seconds, lambda: call.cancelled or self.spawn(fn, *args))
        return call

    def block(self, timeout: float | None, subscribe: Callable[[_Wake], None] | None = None
              ) -> _Wake:
        """Wait, in a simulated thread, for a wake-up handed to `subscribe`, or `timeout`."""
        if self.stopping:
            raise Stopped
        thread = getattr(self.local, "thread", None)
        if thread is None:
            raise RuntimeError("a wait on virtual time outside a simulated thread")
        wake = _Wake(self, thread)
        if subscribe:
            subscribe(wake)
        if timeout is not None:
            self.call_at(self.now + max(0.0, timeout), lambda: wake(True))
        thread.park(wake)
        return wake

    def sleep(self, seconds: float) -> None:
        self.block(seconds)

    def group(self) -> int:
        """The calling simulated thread's group."""
        group: int = self.local.thread.group
        return group

    def kill(self) -> None:
        """Kill the calling thread's group, as a process dies: each of its threads
        stops where it waits, or where it is, and never runs again."""
        self.dead.add(self.group())
        self.block(None)

    def database_now(self) -> datetime:
        return self.start + timedelta(seconds=self.now)

    def run(self, until: float) -> None:
        """Run every thread and timer due up to `until` seconds."""
        while self.ready or (self.timers and self.timers[0][0] <= until):
            if self.ready:
                self._turn(self.ready.popleft())
            else:
                self.now, _, action = heapq.heappop(self.timers)
                action()
        self.now = max(self.now, until)

    def stop(self) -> None:
        """Unwind every thread still waiting: its wait raises Stopped."""
        self.stopping = True
        self.timers.clear()
        for thread in list(self.live):
            if thread.waiting is not None:
                thread.waiting()
        while self.ready:
            self._turn(self.ready.popleft())

    def _turn(self, thread: _Thread) -> None:
        thread.turn.release()
        self.yielded.acquire()
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.start.timestamp() + self.now

    def event(self) -> Event:
        return Event(self)

    def installed(self) -> AbstractContextManager[None]:
        """`drainer.clock` on this kernel while inside."""
        return clock.installed(self)


@contextmanager
def replaced(module: ModuleType, **names: object) -> Iterator[None]:
    """The module's attributes `names` replaced while inside: what drainer looks up
    at call time (the AWS clients, the function's connect)."""
    saved = {name: getattr(module, name) for name in names}
    for name, value in names.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
