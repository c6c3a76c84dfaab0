"""Ways of waiting for work, replayed on the same day against the same compute.

Every strategy drains with drainer's own code on a real PostgreSQL: the pollers,
the LISTEN worker and the cron drains call `drainer.run.drain`; ours is the Lambda
function's run (`drainer.aws.function`: drain, `drainer.wake.after_run`, continue,
wait, arm a wake-up, prune), kicked by `drainer.aws.kick.Kicker` after each
enqueue commits. The day's schedules are declared (`drainer.schedules`) for every
strategy but the one whose scheduler polls for due slots, so drainer's drains
enqueue each slot's job. What is modelled is outside drainer: the compute,
Lambda, Scheduler, the producer, the polling scheduler, and how the always-on
workers wait.
"""

import contextlib
import io
import itertools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from drainer import clock, enqueue, enqueue_many, schedules
from drainer.aws import events, schedule
from drainer.aws.kick import Kicker
from drainer.commands.work import MIN_WAIT, Backoff
from drainer.model import Job
from drainer.run import Options, drain

from . import aws, work
from .compute import Compute, Connection, Session
from .database import Database
from .day import Day, Slot, Spec
from .faults import Faults
from .kernel import Kernel

BACKSTOP_MINUTES = 360.0  # infra/template.yaml's default BackstopRate, rate(6 hours)
HANDLERS = {work.QUEUE: work.run}
_replays = itertools.count()
NO_FAULTS = Faults()


class SimulatedFailure(Exception):
    """The failure of a job's attempt that its spec says fails."""


class World:
    """One strategy's replay of the day: its compute, the database and the producer."""

    def __init__(self, day: Day, timeout_minutes: float, strategy: "Strategy",
                 database: Database, faults: Faults = NO_FAULTS) -> None:
        self.day = day
        self.faults = faults
        self.draws = faults.draws()
        self.before_job: Callable[[], None] = lambda: None  # a fault's hook: Lambda's
        self.model = day.model
        self.kernel = Kernel(day.start)
        self.compute = Compute(self.kernel, timeout=60 * timeout_minutes,
                               resume=self.model.resume)
        self.database = database
        self.strategy = strategy
        self.specs = {spec.id: spec for spec in day.specs}
        self.starts: dict[int, list[tuple[float, float]]] = {}  # spec id -> (due, started)
        self.periodic = {periodic.name: periodic for periodic in day.schedules}
        self.slot_starts: list[tuple[str, float, float]] = []  # (schedule, slot, started)
        self.wake_ups: list[float] | None = None  # when the function's wake-ups fired
        self.invocations = 0
        self.fanouts = 0  # ours: invocations that widened a fleet
        self.worker_seconds = 0.0  # time a drainer process or function ran

    def session(self) -> Session:
        return Session(self.compute, connect=self.model.connect)

    def connect(self, *_: object, **__: object) -> Connection:
        """A new connection to the compute (a resume first if it is suspended)."""
        return self.database.connect(self.session())

    def connected(self, conn: Connection | None) -> Connection:
        """`conn`, or a new connection when there is none or the compute dropped it."""
        if conn is not None and conn.session.live:
            return conn
        if conn is not None:
            conn.close()
        return self.connect()

    def options(self) -> Options:
        return Options(queues=[work.QUEUE], lease=timedelta(seconds=self.model.lease),
                       concurrency=self.model.concurrency)

    def handle(self, job: Job) -> None:
        """A job's attempt: recorded with its run_at, as long as its spec (or its
        schedule) says."""
        self.before_job()
        slot = slot_of(job)
        if slot is not None:
            self._run_slot(*slot)
            return
        spec = self.specs[job.payload["spec"]]
        due = self.day.seconds_of(self.database.run_at(job.id))
        # On the database's microseconds, so an attempt never starts before it is due.
        started = self.day.seconds_of(clock.database_now())
        self.starts.setdefault(spec.id, []).append((due, started))
        clock.sleep(spec.duration)
        if job.attempts <= spec.failures:
            raise SimulatedFailure(f"attempt {job.attempts} of {spec.failures} failing")

    def _run_slot(self, name: str, slot: datetime) -> None:
        now = clock.database_now()
        assert now is not None, "a slot runs on virtual time"
        started = self.day.seconds_of(now)
        self.slot_starts.append((name, self.day.seconds_of(slot), started))
        clock.sleep(self.periodic[name].seconds)

    def declared(self) -> dict[str, schedules.Schedule]:
        """The schedules drainer's drains see: the day's, unless the strategy's own
        scheduler enqueues the slots."""
        if not self.strategy.declares:
            return {}
        return {p.name: p.declared() for p in self.day.schedules}

    def run(self) -> None:
        self.database.reset()
        if declared := self.declared():
            # As the previous day left it (or a deploy's `drainer schedules --sync`):
            # each schedule stored, and its first slot of the day queued.
            self.database.sync(list(declared.values()),
                               self.day.start - timedelta(seconds=1))
        self.kernel.spawn(self._produce)
        for moment in self.faults.restarts:
            self.kernel.call_at(moment, self._restart)
        with self._installed():
            self.strategy.start(self)
            try:
                self.kernel.run(self.day.seconds)
            finally:
                self.kernel.stop()
        if self.strategy.always_on:
            self.worker_seconds = self.day.seconds

    def _restart(self) -> None:
        """The database restarts: every session cut now, no connection accepted for
        a while. A suspended compute has no session to cut."""
        if self.compute.awake_since is None:
            return
        self.draws.counts["restarts"] = self.draws.counts.get("restarts", 0) + 1
        self.database.restart()
        self.compute.restart(self.faults.restart_seconds)

    @contextlib.contextmanager
    def _installed(self) -> Iterator[None]:
        """Virtual time, this replay's handler, and drainer's logs and metric lines
        (a line per failure and per run) kept out of the output."""
        logger = logging.getLogger("drainer")
        level, logger.level = logger.level, logging.CRITICAL
        work.current = self.handle
        previous = schedules.replace_declared(self.declared())
        try:
            with (self.kernel.installed(), contextlib.redirect_stdout(io.StringIO()),
                  self.strategy.installed(self)):
                yield
        finally:
            work.current, logger.level = None, level
            schedules.replace_declared(previous)

    def _produce(self) -> None:
        """The application: one process, one pooled connection (made again after a
        suspension drops it), a transaction per entry of the day."""
        conn: Connection | None = None
        for at, specs in self.day.enqueues:
            clock.sleep(at - self.kernel.now)
            conn = self.connected(conn)
            with self.strategy.transaction(self, conn):
                self._enqueue(conn, specs)

    def _enqueue(self, conn: Connection, specs: list[Spec]) -> None:
        """Insert (COPY for several) with the virtual clock as the database's."""
        due = specs[0].run_at
        run_at = None if due is None else self.day.at(due)
        now, attempts = clock.database_now(), specs[0].max_attempts
        if len(specs) == 1:
            enqueue(conn, work.QUEUE, {"spec": specs[0].id}, run_at=run_at,
                    max_attempts=attempts, now=now)
        else:
            enqueue_many(conn, work.QUEUE, ({"spec": s.id} for s in specs), run_at=run_at,
                         max_attempts=attempts, now=now)


def slot_of(job: Job) -> tuple[str, datetime] | None:
    """The schedule and slot a job runs for: by its meta (drainer's schedules), or
    by its payload (the polling scheduler's); None for the day's other jobs."""
    if job.scheduled_for is not None:
        return job.meta["schedule"], job.scheduled_for
    if "slot" in job.payload:
        return job.payload["schedule"], datetime.fromisoformat(job.payload["slot"])
    return None


class Strategy:
    name = "strategy"
    always_on = False  # a worker process that runs all day (no invocations)
    declares = True  # the day's schedules are declared to drainer

    def start(self, world: World) -> None:
        raise NotImplementedError

    def installed(self, world: World) -> contextlib.AbstractContextManager[None]:
        """What the strategy runs on, for the replay's length."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def transaction(self, world: World, conn: Connection) -> Iterator[None]:
        """The producer's transaction."""
        with conn.transaction():
            yield


@dataclass
class Poll(Strategy):
    """An always-on worker: drain until empty, sleep `every` seconds, again."""

    every: float
    always_on = True

    @property
    def name(self) -> str:
        return f"poll every {self.every:g} s"

    def start(self, world: World) -> None:
        world.kernel.spawn(self.worker, world)

    def worker(self, world: World) -> None:
        conn = None
        while True:
            conn = world.connected(conn)
            drain(conn, HANDLERS, world.options())
            clock.sleep(self.every)


@dataclass
class Listen(Strategy):
    """`python -m drainer work` (drainer.commands.work): always on, LISTEN jobs on one
    connection, drain on the other; after each drain it waits for a notification,
    the drain's next_due or the fallback poll, whichever comes first. A suspension
    drops both connections, and it reconnects at once (its first backoff step)."""

    fallback: float
    always_on = True

    def __post_init__(self) -> None:
        self.listening: Session | None = None
        self.woken: threading.Event | None = None  # a notification, or a suspension
        self.dropped = False

    @property
    def name(self) -> str:
        return f"LISTEN + poll every {self.fallback / 60:g} min"

    def start(self, world: World) -> None:
        world.compute.on_drop.append(lambda: self._wake(dropped=True))
        world.kernel.spawn(self.worker, world)

    def _wake(self, dropped: bool = False) -> None:
        if self.woken is not None:
            self.dropped |= dropped
            self.woken.set()

    @contextlib.contextmanager
    def transaction(self, world: World, conn: Connection) -> Iterator[None]:
        with conn.transaction():
            yield
        # Delivered at commit, and only to a session listening at that moment.
        if self.listening and self.listening.live:
            self._wake()

    def worker(self, world: World) -> None:
        self.woken = clock.event()
        self.listening = world.session()
        conn = None
        while True:
            if not self.listening.live:
                self.listening.open()
                self.listening.statement()  # LISTEN
            conn = world.connected(conn)
            self.woken.clear()  # the drain's claims see what was announced until now
            summary = drain(conn, HANDLERS, world.options())
            wait = self.fallback
            if summary.next_due is not None:
                conn.session.statement()  # seconds_until next_due, by the database clock
                until = world.day.seconds_of(summary.next_due) - world.kernel.now
                wait = min(self.fallback, max(MIN_WAIT, until))
            self.dropped = False
            self.woken.wait(wait)
            if self.dropped:
                clock.sleep(Backoff.FIRST)


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
            world.kernel.call_at(tick, lambda: world.kernel.spawn(self.run, world))
            tick += self.every

    def run(self, world: World) -> None:
        world.invocations += 1
        began = world.kernel.now
        with world.connect() as conn:
            drain(conn, HANDLERS, world.options())
        world.worker_seconds += world.kernel.now - began


@dataclass
class Ours(Strategy):
    """The Lambda function, invoked by a kick after each enqueue commit, by the
    wake-ups it arms itself, and by a backstop schedule."""

    # Minutes between backstop ticks (infra/template.yaml's default BackstopRate); None:
    # the kicks and wake-ups alone, to see what the backstop costs.
    backstop: float | None = BACKSTOP_MINUTES
    max_width: int | None = None  # its fleet's cap; None: the default

    def __post_init__(self) -> None:
        self.function: aws.Lambda | None = None
        self.kicker: Kicker | None = None

    @property
    def name(self) -> str:
        if self.max_width is not None:
            return f"{self._name()}, max width {self.max_width}"
        return self._name()

    def _name(self) -> str:
        if self.backstop is None:
            return "ours, no backstop"
        every = f"{self.backstop / 60:g} h" if self.backstop >= 60 else f"{self.backstop:g} min"
        if self.backstop == BACKSTOP_MINUTES:
            return f"ours: kick + wake-on-due + backstop {every} (default)"
        return f"ours, backstop {every}"

    @contextlib.contextmanager
    def installed(self, world: World) -> Iterator[None]:
        model = world.model
        settings = aws.settings(queue=work.QUEUE, task_module=work.__name__,
                                lease=model.lease, concurrency=model.concurrency,
                                margin=model.margin, max_depth=model.max_depth,
                                max_width=self.max_width)
        function = self.function = aws.Lambda(world.kernel, settings, invoke=model.invoke,
                                              timeout=model.function_timeout,
                                              draws=world.draws)
        world.before_job = function.before_job
        # A name of its own: the coalescer remembers its last kick per function name.
        self.kicker = Kicker(f"{aws.FUNCTION_ARN}-{next(_replays)}",
                             interval=model.kick_coalesce)
        with function.installed(world.connect):
            yield
        world.invocations, world.worker_seconds = function.invocations, function.seconds
        world.fanouts = function.fanouts
        world.wake_ups = function.scheduler.fired if self.declares else None

    def start(self, world: World) -> None:
        tick = 60 * (self.backstop or 0)  # a rate schedule fires one period after creation
        while self.backstop and tick < world.day.seconds:
            world.kernel.call_at(tick, lambda: self.function.invoke({"source": events.CRON}))
            tick += 60 * self.backstop
        slots = world.day.slots
        if self.declares and slots:
            self._arm(world.day.at(slots[0].at))

    def _arm(self, at: datetime) -> None:
        """The wake-up the previous day's last run armed for the day's first slot."""
        assert self.function is not None and self.function.settings.scheduler is not None
        group, role = self.function.settings.scheduler
        schedule.arm(at, target_arn=aws.FUNCTION_ARN, role_arn=role, group=group)

    @contextlib.contextmanager
    def transaction(self, world: World, conn: Connection) -> Iterator[None]:
        with self.kicker.transaction(conn, work.QUEUE):
            yield


@dataclass
class PolledSlots(Ours):
    """Ours for the jobs, but the schedules are a scheduler process's (as pg-boss's
    is): every `every` seconds it checks, with a query, whether a slot is due, and
    enqueues its job (with a kick) when one is."""

    every: float = 30.0
    declares = False

    @property
    def name(self) -> str:
        return f"ours, slots from a scheduler polling every {self.every:g} s"

    def start(self, world: World) -> None:
        super().start(world)
        world.kernel.spawn(self.scheduler, world)

    def scheduler(self, world: World) -> None:
        pending = list(world.day.slots)
        conn = None
        while True:
            conn = world.connected(conn)
            conn.execute("SELECT now()")  # the check: is a slot due?
            due = [slot for slot in pending if slot.at <= world.kernel.now]
            if due:
                with self.transaction(world, conn):
                    for slot in due:
                        self._enqueue(world, conn, slot)
                pending = pending[len(due):]
            clock.sleep(self.every)

    def _enqueue(self, world: World, conn: Connection, slot: Slot) -> None:
        moment = world.day.at(slot.at).isoformat()
        enqueue(conn, work.QUEUE, {"schedule": slot.schedule, "slot": moment},
                key=f"schedule:{slot.schedule}@{moment}", run_at=world.day.at(slot.at),
                now=clock.database_now())


def strategies() -> list[Strategy]:
    """The strategies compared, in the README table's order."""
    return [Poll(1), Poll(60), Listen(300), Cron(300), Cron(900), Cron(3600), Ours(),
            Ours(backstop=60), Ours(backstop=None), PolledSlots()]
