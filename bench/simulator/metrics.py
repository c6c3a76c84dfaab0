"""What a replay of the day cost, and what the ideal would have."""

import math
from dataclasses import dataclass

from .database import Database
from .day import Day
from .strategies import Strategy, World


@dataclass(frozen=True)
class Result:
    strategy: str
    timeout_minutes: float
    awake_hours: float
    resumes: int
    suspensions: int
    invocations: int | None  # None: an always-on worker, never invoked
    worker_hours: float  # a drainer process or function running
    latency: list[float]  # first attempts of jobs ready at enqueue: start - commit
    lateness: list[float]  # retries and jobs scheduled ahead: start - due
    unfinished: int  # jobs neither done nor failed for good when the day ends


def replay(day: Day, timeout_minutes: float, strategy: Strategy, database: Database
           ) -> Result:
    world = World(day, timeout_minutes, strategy, database)
    world.run()
    latency, lateness = [], []
    for spec_id, starts in world.starts.items():
        for attempt, (due, started) in enumerate(starts):
            first_and_ready = attempt == 0 and world.specs[spec_id].run_at is None
            (latency if first_and_ready else lateness).append(started - due)
    return Result(
        strategy=strategy.name,
        timeout_minutes=timeout_minutes,
        awake_hours=world.compute.awake_until(day.seconds) / 3600,
        resumes=world.compute.resumes,
        suspensions=world.compute.epoch,
        invocations=None if strategy.always_on else world.invocations,
        worker_hours=world.worker_seconds / 3600,
        latency=latency,
        lateness=lateness,
        unfinished=database.unfinished(),
    )


def ideal(day: Day, timeout_minutes: float, backoff: list[float]) -> tuple[float, int]:
    """(awake hours, bursts) of a compute awake exactly while work runs, every attempt
    starting when it is due (`backoff`: the database's, `Database.backoff`), plus one
    suspend timeout after each burst (a run of work with no gap as long as the
    timeout)."""
    timeout = 60 * timeout_minutes
    spans = []
    for spec in day.specs:
        spans.append((spec.enqueue_at, spec.enqueue_at))  # the producer's own commit
        ready = max(spec.enqueue_at, spec.run_at or spec.enqueue_at)
        for attempt in range(1, spec.max_attempts + 1):
            spans.append((ready, ready + spec.duration))
            if attempt > spec.failures:
                break
            ready += spec.duration + backoff[min(attempt, len(backoff)) - 1]
    groups: list[list[float]] = []
    for begin, finish in sorted(spans):
        if groups and begin < groups[-1][1] + timeout:  # still awake from the last work
            groups[-1][1] = max(groups[-1][1], finish)
        else:
            groups.append([begin, finish])
    awake = sum(min(end + timeout, day.seconds) - begin for begin, end in groups)
    return awake / 3600, len(groups)


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]
