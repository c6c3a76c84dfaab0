"""The day to replay, read from a parameter file (bench/day.json is the default).

The file holds the workload (bursts, a trickle, jobs scheduled hours ahead, job
durations, the share of failing jobs, schedules) and the model's parameters (the
compute's resume delay, client and Lambda latencies). Times of day are "HH:MM" in
UTC. Jobs are drawn once from the file's seed, so every strategy replays the same
day. A schedule (`drainer.schedule`) is declared on the simulated queue; its slots
are drainer's (cronsim's), each one job that runs `seconds`.
"""

import json
import math
import random
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path

from drainer import defaults
from drainer.aws.settings import Settings
from drainer.schedules import Schedule
from drainer.settings import DEFAULT_MAX_DEPTH

from .work import QUEUE

DEFAULT = Path(__file__).resolve().parent.parent / "day.json"


@dataclass(frozen=True)
class Spec:
    """A job the day will enqueue: when, due when (scheduled ahead), how long its
    handler runs and how many of its attempts fail."""

    id: int
    enqueue_at: float
    run_at: float | None
    duration: float
    failures: int
    max_attempts: int


@dataclass(frozen=True)
class Periodic:
    """A schedule of the day: its job runs `seconds` at each slot of `cron` in `tz`."""

    name: str
    cron: str
    tz: str = "UTC"
    seconds: float = 1.0

    def declared(self) -> Schedule:
        """The schedule as an application declares it, on the simulated queue."""
        return Schedule(self.name, QUEUE, self.cron, self.tz)


@dataclass(frozen=True)
class Slot:
    """One slot of a schedule in the day: seconds into the day, and its job's length."""

    schedule: str
    at: float
    seconds: float


@dataclass(frozen=True)
class Model:
    """What the model assumes about the platform; seconds unless named otherwise."""

    suspend_timeouts_minutes: tuple[float, ...] = (5, 10)
    resume: float = 1.0  # a suspended compute's resume, paid by the connection that wakes it
    connect: float = 0.03  # TCP + TLS + authentication
    lease: float = 300.0
    concurrency: int = 1  # handler threads per drain or worker
    invoke: float = 0.3  # from an asynchronous Lambda invoke to the handler running
    function_timeout: float = 900.0
    # The function's own defaults (drainer.aws): kept back from its remaining time,
    # continuations in a row, and a producer process's kick coalescing interval.
    margin: float = next(f.default for f in fields(Settings) if f.name == "margin")
    max_depth: int = DEFAULT_MAX_DEPTH
    kick_coalesce: float = defaults.KICK_INTERVAL


@dataclass(frozen=True)
class Day:
    start: datetime
    seconds: float
    model: Model
    # One entry per producer transaction: when it commits, and the jobs it enqueues.
    enqueues: list[tuple[float, list[Spec]]] = field(default_factory=list)
    schedules: list[Periodic] = field(default_factory=list)

    @property
    def specs(self) -> list[Spec]:
        return [spec for _, specs in self.enqueues for spec in specs]

    @property
    def slots(self) -> list[Slot]:
        """Every schedule's slots from the day's start to its end, in order."""
        found = []
        for periodic in self.schedules:
            moments = periodic.declared().after(self.start - timedelta(microseconds=1))
            for moment in moments:
                if (at := self.seconds_of(moment)) >= self.seconds:
                    break
                found.append(Slot(periodic.name, at, periodic.seconds))
        return sorted(found, key=lambda slot: (slot.at, slot.schedule))

    def at(self, seconds: float) -> datetime:
        """The simulated clock (seconds into the day) as the database's timestamptz."""
        return self.start + timedelta(seconds=seconds)

    def seconds_of(self, moment: datetime) -> float:
        return (moment - self.start).total_seconds()


def load(path: Path = DEFAULT) -> Day:
    return parse(json.loads(Path(path).read_text()))


def parse(data: dict) -> Day:
    """A Day from the file's JSON object; every workload key is optional."""
    rng = random.Random(data.get("seed", 0))
    attempts = data.get("max_attempts", 5)
    duration = data.get("duration", {"median": 0.2, "sigma": 1.0, "max": 60})
    failing = data.get("failing_share", 0.0)
    ids = iter(range(1, 10**9))

    def job(at: float, due: float | None = None) -> Spec:
        seconds = rng.lognormvariate(math.log(duration["median"]), duration["sigma"])
        failures = rng.randint(1, attempts) if rng.random() < failing else 0
        return Spec(next(ids), at, due, min(seconds, duration["max"]), failures, attempts)

    arrivals: list[float] = []
    for burst in data.get("bursts", []):
        begin = clock(burst["at"])
        arrivals += [begin + rng.uniform(0, 60 * burst["minutes"]) for _ in range(burst["jobs"])]
    for trickle in data.get("trickles", []):
        begin, end = clock(trickle["from"]), clock(trickle["to"])
        moment = begin
        while (moment := moment + rng.expovariate(trickle["per_hour"] / 3600)) < end:
            arrivals.append(moment)
    enqueues = [(at, [job(at)]) for at in arrivals]
    for batch in data.get("scheduled", []):
        at, due = clock(batch["at"]), clock(batch["due"])
        enqueues.append((at, [job(at, due) for _ in range(batch["jobs"])]))
    model = data.get("model", {})
    if "suspend_timeouts_minutes" in model:
        model = {**model, "suspend_timeouts_minutes": tuple(model["suspend_timeouts_minutes"])}
    return Day(
        start=datetime.fromisoformat(data.get("date", "2026-03-03")).replace(tzinfo=UTC),
        seconds=3600 * data.get("hours", 24),
        model=Model(**model),
        enqueues=sorted(enqueues, key=lambda e: e[0]),
        schedules=[Periodic(**entry) for entry in data.get("schedules", [])],
    )


def clock(hhmm: str) -> float:
    """Seconds into the day of "HH:MM"."""
    hours, minutes = hhmm.split(":")
    return 3600 * int(hours) + 60 * int(minutes)
