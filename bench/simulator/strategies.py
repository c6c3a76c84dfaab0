"""Ways of waiting for work, replayed on the same day against the same compute.

Every strategy drains with the loop of `drainer.run.drain` (start, claim batches
sized by `drainer.run.Sizer`, write back with the next claim, archive, next_due) on
the in-memory table, and differs only in how it waits. Ours decides after each run with
`drainer.wake.after_run`, the very function the cloud entry points call.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from drainer.aws import schedule
from drainer.run import Sizer, Summary
from drainer.wake import Next, after_run, switch_at
from drainer.worker import MIN_WAIT, Backoff

from .compute import Compute, Session
from .day import Day
from .engine import Flag, Process, Sim, Wait
from .table import Row, Table

BACKSTOP_MINUTES = 360.0  # infra/template.yaml's default BackstopRate, rate(6 hours)


class World:
    """One strategy's replay of the day: its compute, its table and the producer."""

    def __init__(self, day: Day, timeout_minutes: float, strategy: "Strategy") -> None:
        self.day = day
        self.model = day.model
        self.sim = Sim()
        self.compute = Compute(self.sim, timeout=60 * timeout_minutes, resume=self.model.resume)
        self.table = Table()
        self.strategy = strategy
        self.invocations = 0
        self.worker_seconds = 0.0  # time a drainer process or function ran
        self.producer = self.session()  # the application's pooled connection

    def session(self) -> Session:
        return Session(self.compute, connect=self.model.connect, statement=self.model.statement)

    def run(self) -> None:
        for at, specs in self.day.enqueues:
            self.sim.spawn(self._enqueue(specs), at)
        self.strategy.start(self)
        self.sim.run(self.day.seconds)
        if self.strategy.always_on:
            self.worker_seconds = self.day.seconds

    def _enqueue(self, specs: list) -> Process:
        """The producer's transaction: insert (COPY for several) and commit."""
        yield from self.producer.sql()
        rows = [self.table.insert(spec, self.sim.now) for spec in specs]
        self.strategy.committed(self, rows)


class Strategy:
    name = "strategy"
    always_on = False  # a worker process that runs all day (no invocations)

    def start(self, world: World) -> None:
        raise NotImplementedError

    def committed(self, world: World, rows: list[Row]) -> None:
        """Called when a producer's enqueue commits."""


def drain(world: World, session: Session, deadline: float | None,
          on_claim: Callable[[], None] | None = None) -> Process:
    """`drainer.run.drain` on the model: returns its Summary."""
    sim = world.sim
    began = sim.now
    summary = Summary()
    yield from session.sql()  # start: reap (no lease expires here: nothing crashes) + has_archive
    summary.stopped = yield from work(world, session, Sizer(None, world.model.concurrency),
                                      deadline, summary, on_claim)
    yield from session.sql()  # archive
    yield from session.sql()  # next_due, with its sources
    summary.next_due, summary.next_run_at, summary.next_lease_end = (
        None if t is None else world.day.at(t) for t in world.table.due(sim.now))
    summary.seconds = sim.now - began
    return summary


def work(world: World, session: Session, sizer: Sizer, deadline: float | None,
         summary: Summary, on_claim: Callable[[], None] | None = None) -> Process:
    """Claim and run batches until none is ready or the deadline; returns why it
    stopped. A batch's write-back and the next claim share one round trip
    (`drainer.queue.settle`), as in `drainer.run.drain`."""
    sim, table, lease = world.sim, world.table, world.model.lease

    def next_size() -> tuple[int, str]:
        size = sizer.fits(None if deadline is None else deadline - sim.now)
        return (size, "empty") if size >= 1 else (0, "deadline")

    size, stopped = next_size()
    rows: list[Row] = []
    if size:
        yield from session.sql()
        rows = table.claim(sim.now, size, lease)
    if rows and on_claim:
        on_claim()
    while rows:
        began = sim.now
        succeeded, failed, unstarted = yield from batch(world, session, rows, sizer, deadline)
        sizer.observe(len(rows) - len(unstarted), sim.now - began, full=len(rows) == size)
        size, stopped = (0, "deadline") if unstarted else next_size()
        yield from session.sql()  # settle: complete, fail, release and claim, pipelined
        table.complete(succeeded)
        table.fail(failed, sim.now)
        table.release(unstarted)
        summary.claimed += len(succeeded) + len(failed)
        summary.done += len(succeeded)
        summary.failed += sum(r.status == "failed" for r in failed)
        summary.retried += sum(r.status == "queued" for r in failed)
        rows = table.claim(sim.now, size, lease) if size else []
    return stopped


def batch(world: World, session: Session, rows: list[Row], sizer: Sizer,
          deadline: float | None) -> Process:
    """`drainer.batch.Batch`: handlers on `concurrency` threads, each job started only
    if `Sizer.may_start` expects it to finish, leases extended every lease/3.
    Returns (succeeded, failed, unstarted) rows."""
    sim, model = world.sim, world.model
    slots = [sim.now] * min(model.concurrency, len(rows))
    ends: dict[int, float] = {}
    unstarted: list[Row] = []
    for i, row in enumerate(rows):
        slot = slots.index(min(slots))
        if not sizer.may_start(None if deadline is None else deadline - slots[slot]):
            unstarted = rows[i:]
            break
        row.starts.append((row.run_at, slots[slot]))
        slots[slot] += row.spec.duration
        ends[row.id] = slots[slot]
    end = max(ends.values(), default=sim.now)
    beat = model.lease / 3
    while sim.now + beat < end:
        yield beat
        yield from session.sql()  # extend
        world.table.extend((r for r in rows if ends.get(r.id, 0) > sim.now), sim.now,
                           model.lease)
    yield max(0.0, end - sim.now)
    started = [r for r in rows if r.id in ends]
    return ([r for r in started if r.attempts > r.spec.failures],
            [r for r in started if r.attempts <= r.spec.failures], unstarted)


@dataclass
class Poll(Strategy):
    """An always-on worker: claim until empty, sleep `every` seconds, again."""

    every: float
    always_on = True

    @property
    def name(self) -> str:
        return f"poll every {self.every:g} s"

    def start(self, world: World) -> None:
        world.sim.spawn(self.worker(world))

    def worker(self, world: World) -> Process:
        session, summary = world.session(), Summary()
        sizer = Sizer(None, world.model.concurrency)
        while True:
            yield from work(world, session, sizer, None, summary)
            yield self.every


@dataclass
class Listen(Strategy):
    """`python -m drainer work` (drainer.worker): always on, LISTEN jobs on one
    connection, drain on the other; after each drain it waits for a notification,
    the drain's next_due or the fallback poll, whichever comes first. A suspension
    drops both connections, and it reconnects at once (its first backoff step)."""

    fallback: float
    always_on = True

    def __post_init__(self) -> None:
        self.notified = Flag(latching=True)  # notifications wait on the connection
        self.listening: Session | None = None

    @property
    def name(self) -> str:
        return f"LISTEN + poll every {self.fallback / 60:g} min"

    def start(self, world: World) -> None:
        world.sim.spawn(self.worker(world))

    def committed(self, world: World, rows: list[Row]) -> None:
        # Delivered at commit, and only to a session listening at that moment.
        if self.listening and self.listening.epoch == world.compute.epoch:
            self.notified.set()

    def worker(self, world: World) -> Process:
        sim = world.sim
        self.listening, claims = world.session(), world.session()
        while True:
            if self.listening.epoch != world.compute.epoch:
                yield from self.listening.sql()  # (re)connect and LISTEN
            self.notified.pending = False  # the drain's claims see what they announced
            summary = yield from drain(world, claims, None)
            wait = self.fallback
            if summary.next_due is not None:
                yield from claims.sql()  # seconds_until next_due, by the database clock
                until = world.day.seconds_of(summary.next_due) - sim.now
                wait = min(self.fallback, max(MIN_WAIT, until))
            fired = yield Wait((self.notified, world.compute.suspended), wait)
            if fired is world.compute.suspended:
                yield Backoff.FIRST


@dataclass
class Cron(Strategy):
    """A scheduled drain every `every` seconds (on the clock), to empty, then exit."""

    every: float

    @property
    def name(self) -> str:
        return f"cron drain every {self.every / 60:g} min"

    def start(self, world: World) -> None:
        tick = 0.0
        while tick < world.day.seconds:
            world.sim.spawn(self.run(world), tick)
            tick += self.every

    def run(self, world: World) -> Process:
        world.invocations += 1
        began, session = world.sim.now, world.session()
        yield from session.connect()
        yield from drain(world, session, None)
        session.close()
        world.worker_seconds += world.sim.now - began


@dataclass
class Ours(Strategy):
    """A function invoked by a kick after each enqueue commit, by the wake-ups it
    arms itself, and by a backstop schedule; after each drain `after_run` decides
    whether to stop, wait in the run, continue in a fresh invocation or arm a wake-up."""

    # Minutes between backstop ticks (infra/template.yaml's default BackstopRate); None:
    # the kicks and wake-ups alone, to see what the backstop costs.
    backstop: float | None = BACKSTOP_MINUTES

    def __post_init__(self) -> None:
        self.group: dict[str, object] = {}  # the schedule group: wake-up name -> its token
        self.last_kick = float("-inf")
        self.trailing = False  # a folded kick is due when the interval ends

    @property
    def name(self) -> str:
        if self.backstop is None:
            return "ours, no backstop"
        every = f"{self.backstop / 60:g} h" if self.backstop >= 60 else f"{self.backstop:g} min"
        if self.backstop == BACKSTOP_MINUTES:
            return f"ours: kick + wake-on-due + backstop {every} (default)"
        return f"ours, backstop {every}"

    def start(self, world: World) -> None:
        if self.backstop is None:
            return
        tick = 60 * self.backstop  # a rate schedule fires one period after it is created
        while tick < world.day.seconds:
            world.sim.call_at(tick, lambda: self.invoke(world, 0))
            tick += 60 * self.backstop

    def committed(self, world: World, rows: list[Row]) -> None:
        """`drainer.aws.kick.Kicker` in one producer process: a kick now, or, within the
        interval after the last one, a single kick folded in at the interval's end."""
        wait = self.last_kick + world.model.kick_coalesce - world.sim.now
        if wait <= 0:
            self._kick(world)
        elif not self.trailing:
            self.trailing = True
            world.sim.call_at(world.sim.now + wait, lambda: self._kick(world))

    def _kick(self, world: World) -> None:
        self.trailing, self.last_kick = False, world.sim.now
        self.invoke(world, 0)

    def invoke(self, world: World, depth: int) -> None:
        world.invocations += 1
        world.sim.spawn(self.run(world, depth), world.sim.now + world.model.invoke)

    def run(self, world: World, depth: int) -> Process:
        sim, model, day = world.sim, world.model, world.day
        began = sim.now
        deadline = began + model.function_timeout - model.margin
        session = world.session()
        while True:
            yield from session.connect()
            summary = yield from drain(world, session, deadline,
                                       on_claim=lambda: self.arm_switch(world))
            session.close()  # the run leaves no session open, even while it waits
            decision = after_run(summary, now=day.at(sim.now), depth=depth,
                                 max_depth=model.max_depth,
                                 remaining=timedelta(seconds=deadline - sim.now))
            if decision.action != "wait":
                break
            yield day.seconds_of(decision.at) - sim.now
        world.worker_seconds += sim.now - began
        if decision.action == "continue":
            self.invoke(world, depth + 1)
        elif decision.action == "wake":
            self.arm(world, decision)
        for name in schedule.stale(list(self.group), decision):  # drainer.aws.schedule.prune
            del self.group[name]

    def arm_switch(self, world: World) -> None:
        """`drainer.aws.function._arm_switch`: the run's lease wake-up, once it holds jobs."""
        at = switch_at(world.day.at(world.sim.now), timedelta(seconds=world.model.lease))
        self.arm(world, Next("wake", at, lease=True))

    def arm(self, world: World, decision: Next) -> None:
        """`drainer.aws.schedule.arm`: a one-time schedule named by its kind and minute;
        runs arming the same name share it, and one deleted before its minute never fires."""
        name = schedule.name_for(decision.at, lease=decision.lease)
        if name in self.group:
            return
        token = self.group[name] = object()

        def fire() -> None:
            if self.group.get(name) is token:
                del self.group[name]
                self.invoke(world, 0)

        world.sim.call_at(world.day.seconds_of(decision.at), fire)


def strategies() -> list[Strategy]:
    """The strategies compared, in the README table's order."""
    return [Poll(1), Poll(60), Listen(300), Cron(300), Cron(900), Cron(3600), Ours(),
            Ours(backstop=60), Ours(backstop=None)]

