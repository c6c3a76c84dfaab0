"""What a replay of the day cost, and what the ideal would have."""

import math
from collections import Counter
from dataclasses import dataclass, field

from .database import Database
from .day import Day
from .faults import Faults
from .strategies import NO_FAULTS, Strategy, World


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
    # Each run of a slot job of the day (not the next's): schedule, slot, start.
    slot_starts: list[tuple[str, float, float]]
    wake_ups: list[float] | None  # when ours's wake-ups fired (None: not ours)
    injected: dict[str, int] = field(default_factory=dict)  # faults, by kind
    fanouts: int = 0  # ours: invocations that widened a fleet

    @property
    def starts(self) -> list[float]:
        """Every attempt's wait: from commit for a first attempt ready at enqueue,
        from its run_at for the others."""
        return self.latency + self.lateness

    @property
    def slot_lateness(self) -> list[float]:
        return [started - slot for _, slot, started in self.slot_starts]


def replay(day: Day, timeout_minutes: float, strategy: Strategy, database: Database,
           faults: Faults = NO_FAULTS) -> Result:
    world = World(day, timeout_minutes, strategy, database, faults)
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
        suspensions=world.compute.suspensions,
        invocations=None if strategy.always_on else world.invocations,
        worker_hours=world.worker_seconds / 3600,
        latency=latency,
        lateness=lateness,
        unfinished=database.unfinished(day.at(day.seconds)),
        slot_starts=[run for run in world.slot_starts if run[1] < day.seconds],
        wake_ups=world.wake_ups,
        injected=dict(world.draws.counts),
        fanouts=world.fanouts,
    )


def slot_problems(day: Day, result: Result) -> list[str]:
    """How the replay broke "every slot of the day runs once, at or after its time":
    a slot that never ran, ran more than once, or ran early. Empty when it held."""
    runs = Counter((name, slot) for name, slot, _ in result.slot_starts)
    problems = [f"{slot.schedule} at {_hhmm(slot.at)} ran {runs[slot.schedule, slot.at]} times"
                for slot in day.slots if runs[slot.schedule, slot.at] != 1]
    problems += [f"{name} at {_hhmm(slot)} started {slot - started:.1f} s early"
                 for name, slot, started in result.slot_starts if started < slot]
    return [f"{result.strategy}: {problem}" for problem in problems]


def woken_slots(day: Day, result: Result) -> int | None:
    """How many of the day's slots had a wake-up fire at their minute (None: no
    wake-ups, not ours)."""
    if result.wake_ups is None:
        return None
    fired = set(result.wake_ups)
    return sum(slot.at in fired for slot in day.slots)


def _hhmm(seconds: float) -> str:
    return f"{int(seconds // 3600):02d}:{int(seconds % 3600 // 60):02d}"


def ideal(day: Day, timeout_minutes: float, backoff: list[float]) -> tuple[float, int]:
    """(awake hours, bursts) of a compute awake exactly while work runs, every attempt
    and every schedule's slot starting when it is due (`backoff`: the database's,
    `Database.backoff`), plus one suspend timeout after each burst (a run of work
    with no gap as long as the timeout): a slot away from other work is a burst of
    its own, one resume."""
    timeout = 60 * timeout_minutes
    spans = [(slot.at, slot.at + slot.seconds) for slot in day.slots]
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
