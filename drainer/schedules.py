"""Periodic jobs with no scheduler process: each slot of a schedule is one ordinary job.

The next slot is queued as a job with that slot as its run_at, so `next_due` sees it
and a serverless run arms its wake-up for it; nothing runs in between. A slot is
enqueued only by moving the schedule's `last_slot` forward by compare-and-set (the
`drainer_schedules` table, migration 8), so it runs once however many drainers see
it. Every drain reconciles the schedules its task modules declare for the queues it
drains (new ones get their next slot, changed ones move, removed ones go); when a
slot's job has run, the drain enqueues the slot after it in the batch's write-back.

Cron expressions are parsed and evaluated by cronsim, which follows Debian's cron,
daylight-saving changes included (see `Schedule`).
"""

import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg

from . import db, defaults
from .errors import ConfigError
from .model import Job
from .storage import sql
from .storage.enqueue import check_queue, encode_payload

if TYPE_CHECKING:
    from cronsim import CronSim

log = logging.getLogger(__name__)

SHORTHANDS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
              "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
              "@hourly": "0 * * * *"}
CATCH_UP = ("latest", "all", "none")
CRON_FORM = ("five fields (minute hour day month weekday) or @hourly, @daily, @weekly, "
             "@monthly, @yearly")
MAX_CATCH_UP = 100  # catch_up="all" enqueues at most this many missed slots, the latest
MAX_NAME = 200  # bytes; the name goes into each slot job's key

_DECLARED: dict[str, "Schedule"] = {}


@dataclass(frozen=True)
class Schedule:
    """One schedule: its job goes to `queue` with `payload` at each slot of `cron`
    (five fields, or @hourly, @daily, @weekly, @monthly, @yearly) in time zone `tz`.

    Daylight-saving changes behave as Debian's cron does. A fixed-time slot (minute
    and hour fields that do not start with `*`) in the hour skipped when clocks go
    forward runs when the clock jumps (at 03:00 for 02:30 in Europe/Paris), and one in
    the hour that repeats when clocks go back runs once, the first time. Expressions
    whose minute or hour field starts with `*` (every 30 minutes, say) follow the
    wall clock: nothing runs in the skipped hour, and the repeated one runs twice.

    `catch_up`, for slots missed while nothing ran: "latest" runs one job for the
    latest, "all" one per missed slot (at most MAX_CATCH_UP, the latest ones), "none"
    none; then the next slot to come."""

    name: str
    queue: str
    cron: str
    tz: str = "UTC"
    payload: Any = None
    catch_up: str = "latest"
    max_attempts: int | None = None
    expression: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"schedule {self.name!r}"
        if not isinstance(self.name, str) or not 0 < _utf8_size(self.name) <= MAX_NAME or (
                "\x00" in self.name):
            raise ConfigError(f"{where}: a name must be a non-empty string of at most "
                              f"{MAX_NAME} bytes")
        check_queue(self.queue)
        if self.catch_up not in CATCH_UP:
            raise ConfigError(f"{where}: catch_up must be one of {', '.join(CATCH_UP)}")
        try:
            self.zone  # noqa: B018 - checks the time zone exists
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):  # OSError: "Europe"
            raise ConfigError(f"{where}: unknown time zone {self.tz!r} (an IANA name, "
                              "e.g. Europe/Paris)") from None
        expression = SHORTHANDS.get(self.cron.strip().lower(), self.cron.strip()) if isinstance(
            self.cron, str) else ""
        object.__setattr__(self, "expression", expression)
        count = len(expression.split())
        if isinstance(self.cron, str) and count != 5:  # cronsim reads a sixth as seconds
            seconds = ": a field of seconds is not supported" if count == 6 else ""
            raise ConfigError(f"{where}: bad cron expression {self.cron!r} ({count} "
                              f"fields{seconds}); {CRON_FORM}")
        try:
            self._cron(datetime.now(UTC))
        except Exception as exc:  # noqa: BLE001 - cronsim's errors, or a non-string
            raise ConfigError(f"{where}: bad cron expression {self.cron!r} ({exc}); "
                              f"{CRON_FORM}") from None
        encode_payload(self.body)

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)

    @property
    def body(self) -> Any:
        """The payload of each slot's job ({} when none was given)."""
        return {} if self.payload is None else self.payload

    @property
    def definition(self) -> str:
        """A hash of what the code declares: a change of it is a new definition."""
        text = json.dumps([self.queue, self.expression, self.tz, self.body, self.catch_up,
                           self.max_attempts], sort_keys=True, separators=(",", ":"))
        import hashlib  # only drains with schedules pay for its import

        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def _cron(self, start: datetime, *, reverse: bool = False) -> "CronSim":
        from cronsim import CronSim  # only drains with schedules pay for the import

        return CronSim(self.expression, start.astimezone(self.zone), reverse=reverse)

    def after(self, moment: datetime) -> Iterator[datetime]:
        """The slots after `moment`, in order (aware datetimes in the schedule's zone)."""
        return iter(self._cron(moment))

    def latest(self, moment: datetime) -> datetime | None:
        """The latest slot at or before `moment`."""
        return next(iter(self._cron(moment + timedelta(microseconds=1), reverse=True)), None)

    def due(self, after: datetime | None, now: datetime) -> list[datetime]:
        """The slots to enqueue when `after` is the last slot enqueued (None: none yet,
        nothing missed): the missed ones the catch-up asks for, then the next to come.
        Nothing while the last slot enqueued is still to come."""
        if after is not None and after > now:
            return []
        # By the moment, not the wall time: slots of one ZoneInfo compare as wall times,
        # without their pass, and in the hour that repeats 02:00 CET is after 02:30 CEST.
        start = now if after is None else after.astimezone(UTC)
        missed: list[datetime] = []
        if self.catch_up == "latest":
            latest = self.latest(now)
            missed = [latest] if latest is not None and latest > start else []
        elif self.catch_up == "all":
            missed = self._missed(start, now)
        return [*missed, *_first(self.after(now))]

    def _missed(self, start: datetime, now: datetime) -> list[datetime]:
        slots: list[datetime] = []
        for slot in self._cron(now + timedelta(microseconds=1), reverse=True):
            if slot <= start or len(slots) == MAX_CATCH_UP:
                break
            slots.append(slot)
        return slots[::-1]


def slot_key(name: str, slot: datetime) -> str:
    """The unique key of schedule `name`'s job of `slot`."""
    return f"schedule:{name}@{slot.astimezone(UTC).isoformat()}"


def _utf8_size(text: str) -> int:
    """Bytes of `text` in UTF-8; 0 when it is not valid Unicode (a lone surrogate), which
    no statement could send."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return 0


def _first(slots: Iterator[datetime]) -> list[datetime]:
    return [slot for slot, _ in zip(slots, range(1), strict=False)]


def schedule(name: str, queue: str, cron: str, *, payload: object = None, tz: str = "UTC",
             catch_up: str = "latest") -> Schedule:
    """Declare a schedule: a job on `queue` with `payload` at each slot of `cron` in `tz`.
    Declare it in a task module (one `--tasks` names): a drain of `queue` that loads
    its modules and no longer finds a schedule there withdraws it."""
    declared = Schedule(name, queue, cron, tz, payload, catch_up)
    _DECLARED[name] = declared
    return declared


def declare(schedule_: Schedule) -> None:
    """Record a schedule built elsewhere (`@task(cron=...)`)."""
    _DECLARED[schedule_.name] = schedule_


def declared() -> dict[str, Schedule]:
    """Name -> schedule, for every schedule declared so far."""
    return dict(_DECLARED)


def replace_declared(schedules: dict[str, Schedule]) -> dict[str, Schedule]:
    """Make `schedules` the declared ones and return those they replace (for tests)."""
    previous = dict(_DECLARED)
    _DECLARED.clear()
    _DECLARED.update(schedules)
    return previous


@dataclass(frozen=True)
class Stored:
    """A schedule's row, as the reconcile reads it."""

    name: str
    queue: str
    definition: str
    retired: list[str]
    withdrawn: bool
    last_slot: datetime | None


def read(conn: psycopg.Connection, queues: Sequence[str] | None, now: datetime | None
         ) -> tuple[datetime, dict[str, Stored]]:
    """The database clock's now, and the stored schedules of these queues (all: None)."""
    rows = sql.rows(conn, "schedules_read", {"queues": None if queues is None else list(queues),
                                             "now": now})
    return rows[0][0], {row[1]: Stored(*row[1:]) for row in rows if row[1] is not None}


def enqueue(conn: psycopg.Connection, declared_: Schedule, slots: Sequence[datetime]
            ) -> psycopg.Cursor:
    """Send the slots' jobs, if `last_slot` can still move to the last of them (and the
    stored definition is this one)."""
    params = {"name": declared_.name, "definition": declared_.definition,
              "queue": declared_.queue, "tz": declared_.tz,
              "payload": encode_payload(declared_.body),
              "max_attempts": declared_.max_attempts or defaults.MAX_ATTEMPTS,
              "slots": json.dumps([[s.isoformat(), slot_key(declared_.name, s)] for s in slots])}
    return sql.run(conn, "schedule_enqueue", params)


def after_run(conn: psycopg.Connection, jobs: Iterable[Job], now: datetime) -> None:
    """For each job of a declared schedule's slot in `jobs` (run just now): record it
    as the schedule's latest run, and enqueue what comes after its slot. Sent within
    the batch's write-back (a pipeline): nothing here waits for an answer. The
    schedules' rows are locked in the order of their names, the same in every drainer:
    they are locked in the write-back's transaction, and a deadlock would undo its
    completions too."""
    slotted = [(job.meta["schedule"], slot, job) for job in jobs
               if (slot := job.scheduled_for) is not None]
    refused = _refused(conn, [_DECLARED[name] for name, _, _ in slotted if name in _DECLARED])
    for name, slot, job in sorted(slotted, key=lambda s: s[0]):
        found = _DECLARED.get(name)
        if found is None or name in refused:  # the drain's start logged it
            continue
        sql.run(conn, "schedule_ran", {"name": found.name, "job": job.id})
        try:
            slots = found.due(slot, max(now, slot))  # a slot run early still has a next
        except OverflowError:  # another producer's slot at the calendar's end
            continue
        if slots:
            enqueue(conn, found, slots)


def reconcile(conn: psycopg.Connection, schedules: Iterable[Schedule], queues: Sequence[str],
              *, withdraw: Iterable[str] = (), force: bool = False, strict: bool = False,
              now: datetime | None = None) -> datetime:
    """Bring the stored schedules of `queues` in line with the declared ones: a new one
    gets its next slot, a changed one (a definition no newer code retired, unless
    `force`) moves to its next slot, a due one gets what its catch-up asks for, and a
    stored one of a queue in `withdraw` that is not declared goes. A declared one the
    database cannot store is left as it is stored, with an error logged (a drain's
    other schedules and queues go on), or, when `strict` (a deploy's sync), is a
    ConfigError before anything is written. Returns the database clock's now."""
    wanted = {s.name: s for s in schedules if s.queue in queues}
    refused = _refused(conn, list(wanted.values()))
    if refused and strict:
        raise ConfigError("; ".join(f"schedule {name!r}: {why}" for name, why in refused.items()))
    for name, why in refused.items():
        log.error("schedule %r skipped: %s", name, why)
    current, stored = read(conn, queues, now)
    for name, declared_ in wanted.items():
        if name in refused:
            continue
        found = stored.get(name)
        if found is None or found.definition != declared_.definition or found.withdrawn:
            if found is not None and not force and declared_.definition in found.retired:
                continue  # older code, during a deploy: the newer definition stays
            _define(conn, declared_, found, current)
            found = None
        slots = declared_.due(found.last_slot if found else None, current)
        if slots:
            enqueue(conn, declared_, slots)
    for name, found in stored.items():
        if name not in wanted and found.queue in set(withdraw) and not found.withdrawn:
            sql.run(conn, "schedule_withdraw", {**_prior(found), "name": name})
            log.info("schedule %r withdrawn: no task module of queue %r declares it",
                     name, found.queue)
    return current


def _refused(conn: psycopg.Connection, schedules: Sequence[Schedule]) -> dict[str, str]:
    """{name: why} of the schedules holding a character the database's encoding lacks:
    checked before sending, as the statement refused for it would stop the drain."""
    codecs = db.codecs(conn) if schedules else ()
    refused: dict[str, str] = {}
    for declared_ in schedules if codecs else ():
        for part, text in (("name", declared_.name), ("queue", declared_.queue),
                           ("cron expression", declared_.cron), ("time zone", declared_.tz),
                           ("payload", encode_payload(declared_.body))):
            if (unfit := db.unfit(text, codecs)) is not None:
                refused[declared_.name] = f"{unfit} of its {part}"
                break
    return refused


def _prior(found: Stored | None) -> dict[str, object]:
    """The stored state a change is conditional on, and the key of its pending job."""
    if found is None:
        return {"was": None, "was_withdrawn": False, "pending_key": None, "pending_queue": None}
    pending = None
    if found.last_slot is not None:
        pending = slot_key(found.name, found.last_slot)
    return {"was": found.definition, "was_withdrawn": found.withdrawn,
            "pending_key": pending, "pending_queue": found.queue}


def _define(conn: psycopg.Connection, declared_: Schedule, found: Stored | None,
            now: datetime) -> None:
    """Store the declared definition (new, changed or back), starting from `now`: the
    job of a slot the old one had queued is deleted."""
    sql.run(conn, "schedule_define", {
        **_prior(found), "name": declared_.name, "queue": declared_.queue,
        "cron": declared_.cron, "tz": declared_.tz, "catch_up": declared_.catch_up,
        "payload": encode_payload(declared_.body), "definition": declared_.definition,
        "since": now})


def listed(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every stored schedule for `drainer schedules`: its definition, its next slot (the
    one queued, else the next by its expression), and its latest run's job, status and
    error."""
    found: list[dict[str, Any]] = []
    for row in sql.rows(conn, "schedules_list"):
        now, name, queue, cron, tz, catch_up, withdrawn, last_slot, job, status, error = row
        found.append({"name": name, "queue": queue, "cron": cron, "tz": tz,
                      "catch_up": catch_up, "withdrawn": withdrawn,
                      "next_slot": None if withdrawn else _next(
                          name, queue, cron, tz, last_slot, now),
                      "last_job": job, "last_status": status, "last_error": error})
    return found


def _next(name: str, queue: str, cron: str, tz: str, last_slot: datetime | None,
          now: datetime) -> str | None:
    if last_slot is not None and last_slot > now:
        return last_slot.astimezone(ZoneInfo(tz)).isoformat()
    try:
        upcoming = _first(Schedule(name, queue, cron, tz).after(now))
    except ConfigError:  # stored by another version, with what this one cannot read
        return None
    return upcoming[0].isoformat() if upcoming else None


def format_listed(rows: list[dict[str, Any]]) -> str:
    """One line per schedule: name, queue, expression and zone, next slot, last run."""
    if not rows:
        return "(no schedules: declare them in a task module, then `drainer schedules --sync`)"
    head = ("name", "queue", "cron", "tz", "next slot", "last run")
    lines = [head] + [(
        r["name"], r["queue"], r["cron"], r["tz"],
        "withdrawn" if r["withdrawn"] else (r["next_slot"] or "-"),
        "-" if r["last_job"] is None else f"job {r['last_job']} "
        f"{r['last_status'] or 'archived'}" + (f": {r['last_error']}" if r["last_status"]
                                                 == "failed" and r["last_error"] else ""))
        for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(line, widths, strict=False)),
                                line[-1]]).rstrip() for line in lines)
