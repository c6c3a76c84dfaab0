"""A backlog widened: drainer's fleet against SQS feeding Lambda, on one modelled
database, in steps of the fan-out's decision interval (2 s).

A million jobs is too many to replay through PostgreSQL on virtual time, so the
drains are modelled and the decisions are not: each member of drainer's fleet
decides with `drainer.width.more_members`, from its own claims (the jobs it has
taken and how long it has worked), with the session budget of
`drainer.storage.budget.Budget`, one member after the other as the fleet row's
compare-and-set orders them; a member it asks for starts working one start
(`drainer.width.STARTUP`) later, as SQS's added invocations do. SQS's ramp is AWS's
documented one ("Configuring scaling behavior for SQS event source mappings"): five
concurrent invocations when messages appear, up to 300 more a minute, at most 1,000
or `MaximumConcurrency`; it knows nothing of the database, so an invocation past the
sessions the server takes is refused and does no work.

Every drain works at the same rate, a member's own or its share of the database's
ceiling (jobs a second the database serves, every drain's claims and write-backs
together), whichever is less.
"""

import math
from dataclasses import dataclass, field

from drainer import defaults, width
from drainer.aws.fanout import DECIDE_EVERY
from drainer.aws.settings import Settings
from drainer.storage.budget import Budget

STEP = DECIDE_EVERY  # seconds: a member decides about this often
MARGIN = next(f.default for f in Settings.__dataclass_fields__.values() if f.name == "margin")


@dataclass(frozen=True)
class Database:
    """The database the drains share: the jobs a second it serves at most, and its
    sessions: `max_connections`, the slots reserved for superusers, and those the
    application holds."""

    ceiling: float = 36_000.0
    max_connections: int = 100
    reserved: int = 3
    application: int = 20

    @property
    def free(self) -> int:
        """Sessions the server takes beyond the application's."""
        return self.max_connections - self.reserved - self.application

    def budget(self, running: int, pending: int) -> int:
        """More members drainer may start: `Budget.more` as the server's view gives it."""
        usable = self.max_connections - self.reserved
        return Budget(usable=usable, open=self.application + running,
                      share=defaults.BUDGET_SHARE).more(running, pending)

    def each(self, rate: float, working: int) -> float:
        """Jobs a second each of `working` drains gets."""
        return min(rate, self.ceiling / working)


@dataclass(frozen=True)
class Backlog:
    """`jobs` ready at once, `rate`: jobs a second one drain works (its handler
    threads over a job's time), `claim`: the jobs a claim takes."""

    name: str
    jobs: int
    rate: float
    claim: int
    timeout: float = 900.0  # the function's, seconds

    def useful(self, db: Database) -> int:
        """The fewest drains that reach the database's ceiling."""
        return math.ceil(db.ceiling / self.rate)


@dataclass
class Run:
    """What one way of widening did: `widths[i]` drains worked in step i."""

    name: str
    widths: list[int] = field(default_factory=list)
    seconds: float = 0.0  # until the last job was claimed
    refused: int = 0  # the most invocations the server refused at once

    @property
    def peak(self) -> int:
        return max(self.widths, default=0)

    def at(self, seconds: float) -> int:
        """Drains working at `seconds` (the last step's once the backlog is done)."""
        return self.widths[min(int(seconds // STEP), len(self.widths) - 1)]

    def reached(self, useful: int) -> float | None:
        """Seconds until `useful` drains worked at once (None: never)."""
        return next((STEP * i for i, w in enumerate(self.widths) if w >= useful), None)


@dataclass
class _Member:
    began: float
    done: float = 0.0


def _work(run: Run, left: float, working: int, rate: float) -> float:
    """One step of `working` drains at `rate` each: the jobs left after it."""
    run.widths.append(working)
    step = working * rate * STEP
    if step >= left:
        run.seconds += left / (working * rate)
        return 0.0
    run.seconds += STEP
    return left - step


def drainer(backlog: Backlog, db: Database, cap: int) -> Run:
    """Drainer's fleet from one run (the kick's), widening by its own decisions."""
    run = Run(f"drainer, max width {cap}")
    members, left = [_Member(0.0)], float(backlog.jobs)
    starting: list[float] = []  # when each member asked for starts
    while left > 0:
        now = run.seconds
        members += [_Member(now) for at in starting if at <= now]
        starting = [at for at in starting if at > now]
        each = db.each(backlog.rate, len(members))
        left = _work(run, left, len(members), each)
        for m in members:
            m.done += each * (run.seconds - now)
        now = run.seconds
        for m in members:
            if m.began + backlog.timeout - MARGIN <= now:  # continued: a fresh run
                m.began, m.done = now, 0.0
        for m in members:
            if m.began >= now:
                continue
            load = width.Load(
                taken=min(backlog.claim, math.ceil(left)), full=left >= backlog.claim,
                done=int(m.done), rate=m.done / (now - m.began),
                left=m.began + backlog.timeout - MARGIN - now,
                running=len(members) + len(starting), cap=cap, allowed=None,
                budget=db.budget(len(members), len(starting)))
            starting += [now + width.STARTUP] * width.more_members(load)
    return run


def sqs(backlog: Backlog, db: Database, most: int = 1000, *, each_minute: bool = False
        ) -> Run:
    """SQS's event source mapping: 5 invocations at once, up to 300 more a minute
    (evenly, 10 every 2 s; `each_minute`: all 300 at each minute's end), at most
    `most`; those past the server's free sessions are refused."""
    ramp = "+300 at each minute's end" if each_minute else "+5 a second"
    run = Run(f"SQS → Lambda, MaximumConcurrency {most}, {ramp}")
    left = float(backlog.jobs)
    while left > 0:
        since = max(0.0, run.seconds - width.STARTUP)  # the added ones' start
        added = 300 * (since // 60 if each_minute else since / 60)
        invoked = min(most, 5 + int(added))
        working = min(invoked, db.free)
        run.refused = max(run.refused, invoked - working)
        left = _work(run, left, working, db.each(backlog.rate, working))
    return run


# The backlogs compared: the speed bench's width workload (10 ms jobs, 8 handler
# threads a drain), and jobs that wait 100 ms on another service.
TEN_MS = Backlog("10 ms jobs", 1_000_000, rate=800.0, claim=100)
HUNDRED_MS = Backlog("100 ms jobs", 1_000_000, rate=80.0, claim=16)
SMALL = Database()  # PostgreSQL's default max_connections
LARGE = Database(max_connections=400, application=50)
SCENARIOS = ((SMALL, TEN_MS), (SMALL, HUNDRED_MS), (LARGE, HUNDRED_MS))
CAP = 100
AT = (10, 30, 60)  # seconds: the widths shown


def compare(backlog: Backlog, db: Database) -> list[Run]:
    """Every way of widening, in the table's order; SQS capped at drainer's budget
    too when that is below the cap."""
    budget = db.budget(0, 0)
    runs = [drainer(backlog, db, 1), drainer(backlog, db, CAP), sqs(backlog, db, CAP),
            sqs(backlog, db, CAP, each_minute=True)]
    return runs + ([sqs(backlog, db, budget)] if budget < CAP else [])


def table() -> str:
    """The comparison as Markdown, a block of rows per database and backlog."""
    lines = [
        f"A backlog of a million jobs ready at once; a drain starts {width.STARTUP:g} s "
        f"after it is asked for; the database serves at most {SMALL.ceiling:,.0f} jobs/s.",
        "",
        "| database | backlog | way of widening | drains at "
        + " | ".join(f"{t} s" for t in AT)
        + " | peak (at) | sessions left to the app | refused at once | total |",
        "|---|---|---|" + "--:|" * (len(AT) + 4),
    ]
    for db, backlog in SCENARIOS:
        for run in compare(backlog, db):
            at = [str(run.at(t)) for t in AT]
            lines.append(
                f"| {db.max_connections} sessions, {db.free} free, budget {db.budget(0, 0)} "
                f"| {backlog.name} ({backlog.rate:g}/s a drain, {backlog.useful(db)} "
                f"reach the ceiling) | {run.name} | " + " | ".join(at)
                + f" | {run.peak} ({run.reached(run.peak):.0f} s) | {db.free - run.peak} "
                f"| {run.refused} | {_duration(run.seconds)} |")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 600 else f"{seconds / 60:.0f} min"
