"""Faults the replay injects, each drawn from a seeded stream of its own so that a
replay is the same every time: lost kicks, runs that die holding a batch, wake-ups
that fail to arm, and database restarts.

- A lost kick: the producer committed and its kick never reached Lambda (it died
  between the two, or the invoke was lost for good, past the kicker's retries).
- A run that dies: the function run is killed (out of memory, a crash) as its
  first job starts; every thread of the run stops where it is, nothing more is
  written, so its jobs stay running until their lease ends.
- A wake-up that fails to arm: Scheduler refuses the create (a throttle, an
  outage), for a queued job's wake-up and a run's own lease wake-up alike.
- A restart: every session of the database is cut at that second, and it accepts
  connections again `restart_seconds` later (the compute stays awake).
"""

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Faults:
    lost_kicks: float = 0.0  # share of kicks lost
    dead_runs: float = 0.0  # share of runs that die at their first job
    failed_arms: float = 0.0  # share of wake-up creates refused
    restarts: tuple[float, ...] = ()  # seconds into the day the database restarts at
    restart_seconds: float = 10.0
    seed: int = 0

    @classmethod
    def at_rate(cls, rate: float, *, restarts: tuple[float, ...] = (), seed: int = 0
                ) -> "Faults":
        """Every kind of fault at `rate`, and the restarts given."""
        return cls(rate, rate, rate, restarts if rate else (), seed=seed)

    @property
    def none(self) -> bool:
        return not (self.lost_kicks or self.dead_runs or self.failed_arms or self.restarts)

    def draws(self) -> "Draws":
        return Draws(self)


@dataclass
class Draws:
    """One replay's draws: a stream per kind, so that adding one kind's faults does
    not move another's."""

    faults: Faults
    streams: dict[str, random.Random] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # faults injected, by kind

    def hit(self, kind: str) -> bool:
        """Whether this kick, run or create is struck by a fault of `kind`."""
        rate: float = getattr(self.faults, kind)
        if not rate:
            return False
        stream = self.streams.setdefault(kind, random.Random(f"{self.faults.seed}:{kind}"))
        struck = stream.random() < rate
        self.counts[kind] = self.counts.get(kind, 0) + struck
        return struck
