"""What the dashboard's pages read, through the SQL gateway (the statements are in
storage/queries/dashboard.sql, and those `show`, `schedules` and the limits share with
the commands). Plain functions of one connection, each a statement or two."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from .. import schedules
from ..storage import admin, pauses, sql
from ..storage.limits import Fill, fills

CAP = 10_000  # rows a count or a page reads at most: "more than 10,000"
PAGE = 50  # jobs a page of the jobs list shows
GROUPS = 100  # error groups the failures page shows
# The schema the dashboard reads: `drainer migrate` adds what a table lacks.
NEEDED = ("done_at", "key", "meta", "result", "schedules", "limits", "cancelled_running")
STATES = ("queued", "scheduled", "running", "done", "failed", "cancelled",
          "cancelled_running")
# The filters of the jobs page: (status, whether cancelled) of each state offered.
FILTERS: dict[str, tuple[str, bool | None]] = {
    "queued": ("queued", None), "running": ("running", None), "done": ("done", None),
    "failed": ("failed", False), "cancelled": ("failed", True)}


def missing(conn: psycopg.Connection) -> list[str]:
    """The parts of the schema the dashboard needs that this database lacks."""
    known = sql.features(conn)
    return [name for name in NEEDED if not getattr(known, name)]


@dataclass
class Queue:
    """A row of the queues page; counts past CAP are CAP + 1 ("more than")."""

    name: str
    queued: int
    ready: int
    oldest_ready: float | None  # seconds
    running: int
    expired: int
    failed: int  # among the newest CAP failed jobs
    done_last_hour: int  # among the newest CAP done jobs
    fill: Fill | None = None
    no_task: bool = False
    paused: bool = False


@dataclass
class Queues:
    queues: list[Queue]
    running_capped: bool
    failed_capped: bool
    read_at: Any  # the database clock's now()
    checked_tasks: bool  # whether ready jobs with no task were looked for


def queues(conn: psycopg.Connection, known: Sequence[str] | None) -> Queues:
    """The queues page: each queue's depth and rates, its limits and how full they are,
    and, given the queues that have a task (`known`), the ready ones none drains."""
    rows = sql.rows(conn, "ui_queues", {"cap": CAP})
    limited = {fill["queue"]: fill for fill in fills(conn)}
    no_task = set(admin.due(conn, [], known=known).no_task) if known is not None else set()
    held = {pause.queue for pause in pauses.paused(conn)}
    found = [_queue(row, limited, no_task, held) for row in rows]
    now = rows[0][10] if rows else None
    capped = (bool(rows[0][8]), bool(rows[0][9])) if rows else (False, False)
    return Queues(found, *capped, read_at=now, checked_tasks=known is not None)


def _queue(row: tuple[Any, ...], limited: dict[str, Fill], no_task: set[str],
           held: set[str]) -> Queue:
    name, queued, ready, oldest, running, expired, failed, done = row[:8]
    return Queue(name, queued, ready, oldest, running, expired, failed, done,
                 fill=limited.get(name), no_task=name in no_task, paused=name in held)


@dataclass
class Group:
    queue: str
    error: str | None
    jobs: int
    latest: int
    first_failed: Any
    last_failed: Any


def failed_groups(conn: psycopg.Connection) -> tuple[list[Group], bool]:
    """The newest CAP failed jobs grouped by queue and error; whether older ones exist."""
    rows = sql.rows(conn, "ui_failed_groups", {"cap": CAP, "groups": GROUPS})
    return [Group(*row[:6]) for row in rows], bool(rows and rows[0][6])


def failed_group(conn: psycopg.Connection, queue: str, error: str | None) -> list[int]:
    """The ids of one group of the failures page, newest first."""
    return [row[0] for row in sql.rows(conn, "ui_failed_group",
                                       {"cap": CAP, "queue": queue, "error": error})]


@dataclass
class Listed:
    id: int
    queue: str
    state: str
    attempts: int
    max_attempts: int
    run_at: str | None
    created_at: str | None
    last_error: str | None
    key: str | None
    priority: int


@dataclass
class Page:
    jobs: list[Listed]
    older: int | None  # the `before` of the next page; None: no older jobs
    read: int  # jobs read for this page (at most CAP)


@dataclass
class Filters:
    queue: str | None = None
    state: str | None = None  # one of FILTERS
    key: str | None = None
    error: str | None = None  # text the last error contains (any case)
    before: int | None = None


def jobs(conn: psycopg.Connection, f: Filters) -> Page:
    """A page of the jobs list, newest first; the next page starts before `older`."""
    status, cancelled = FILTERS.get(f.state or "", (None, None))
    rows = sql.rows(conn, "ui_jobs", {
        "status": status, "cancelled": cancelled, "queue": f.queue, "key": f.key,
        "error": f.error, "before": f.before, "cap": CAP, "limit": PAGE + 1, "now": None})
    read, oldest = rows[0][10:12]  # one row at least: these two
    listed = [Listed(*row[:10]) for row in rows[:PAGE] if row[0] is not None]
    if len(listed) == PAGE and len(rows) > PAGE:
        older: int | None = listed[-1].id
    elif read >= CAP:  # the window ran out before the page filled: look further
        older = oldest
    else:
        older = None
    return Page(listed, older, read)


@dataclass
class Shown:
    row: dict[str, Any]
    state: str  # as the dashboard names it; "archived" for a job in the archive
    lease_left: float | None  # seconds (negative: ran out)

    def json(self, column: str) -> str:
        value = self.row.get(column)
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)

    @property
    def earlier_errors(self) -> list[Any]:
        """Errors of earlier attempts, when meta keeps them (an "errors" list)."""
        meta = self.row.get("meta")
        kept = meta.get("errors") if isinstance(meta, dict) else None
        return kept if isinstance(kept, list) else []


def job(conn: psycopg.Connection, job_id: int) -> Shown | None:
    """One job whole, from jobs or the archive (`show`'s statements); None if neither
    has it."""
    found = sql.row(conn, "show_job", {"id": job_id})
    state = None
    if found is not None:
        named = sql.row(conn, "ui_job_state", {"id": job_id, "now": None})
        state = None if named is None else named[0]  # None: archived just now
    elif sql.features(conn).archive:
        found = sql.row(conn, "show_archived_job", {"id": job_id})
        state = "archived"
    if found is None:
        return None
    try:
        row = json.loads(found[0])
    except (ValueError, RecursionError):  # a payload Python's json cannot load
        row = {"id": job_id, "row": found[0]}
    return Shown(row, state or "archived", found[1])


def schedule_list(conn: psycopg.Connection) -> list[dict[str, Any]]:
    """Every stored schedule, as `drainer schedules` lists them."""
    return schedules.listed(conn)
