"""Simulated time: an event heap and processes written as generators.

A process is a generator that yields what it waits for: a number of seconds, or a
`Wait` on flags with a timeout. Simulated seconds cost nothing, so a day of 1 s
polling runs in about a second of real time.
"""

import heapq
import itertools
from collections.abc import Callable, Generator
from dataclasses import dataclass

Process = Generator[object, object, object]


class Sim:
    """The clock and the event heap; `now` is seconds since the start of the day."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()  # ties run in the order they were scheduled

    def call_at(self, moment: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (max(moment, self.now), next(self._order), action))

    def spawn(self, process: Process, at: float | None = None) -> None:
        """Start `process` at `at` (now by default)."""
        self.call_at(self.now if at is None else at, lambda: self._step(process, None))

    def run(self, until: float) -> None:
        while self._heap and self._heap[0][0] <= until:
            self.now, _, action = heapq.heappop(self._heap)
            action()
        self.now = until

    def _step(self, process: Process, value: object) -> None:
        try:
            command = process.send(value)
        except StopIteration:
            return
        if isinstance(command, Wait):
            command.start(self, lambda fired: self._step(process, fired))
        else:
            self.call_at(self.now + float(command), lambda: self._step(process, None))


class Flag:
    """Something a process can wait for. A `latching` flag set while nobody waits
    stays set for the next wait (a notification the connection buffers)."""

    def __init__(self, latching: bool = False) -> None:
        self.latching = latching
        self.pending = False
        self._waiters: list[Callable[[Flag], None]] = []

    def set(self) -> None:
        waiters, self._waiters = self._waiters, []
        if not waiters and self.latching:
            self.pending = True
        for wake in waiters:
            wake(self)


@dataclass
class Wait:
    """Resume on the first of `flags` to be set (sent back to the process), or with
    None after `timeout` seconds."""

    flags: tuple[Flag, ...]
    timeout: float

    def start(self, sim: Sim, resume: Callable[[Flag | None], None]) -> None:
        for flag in self.flags:
            if flag.pending:
                flag.pending = False
                sim.call_at(sim.now, lambda f=flag: resume(f))
                return
        done = False

        def once(fired: Flag | None) -> None:
            nonlocal done
            if done:
                return
            done = True
            for flag in self.flags:  # a later set() must find no stale waiter
                if once in flag._waiters:
                    flag._waiters.remove(once)
            resume(fired)

        for flag in self.flags:
            flag._waiters.append(once)
        sim.call_at(sim.now + self.timeout, lambda: once(None))
