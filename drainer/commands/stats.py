"""`stats`: what is in the queue, how fast it is done, and whether vacuum keeps up."""

import argparse
from typing import TypedDict

import psycopg

from ..storage import fleets, pauses, sql
from ..storage.limits import Fill, describe, fills
from .common import emit, open_db
from .text import age, one_line


class QueueStatus(TypedDict):
    queue: str
    status: str
    jobs: int
    oldest_ready_seconds: float | None
    expired_leases: int


class TopError(TypedDict):
    error: str
    jobs: int
    latest_id: int


class TableHealth(TypedDict):
    n_live_tup: int | None
    n_dead_tup: int | None
    last_autovacuum: str | None
    last_vacuum: str | None


class PriorityCount(TypedDict):
    queue: str
    priority: int
    status: str
    jobs: int


class Paused(TypedDict):
    queue: str
    paused_at: str
    paused_by: str
    ready: int  # at most pauses.MORE_READY


class FleetStatus(TypedDict):
    fleet: str  # its queues, comma-joined
    running: int  # members running now (their leases not over)
    starting: int  # members asked for, not running yet
    target: int  # the width its members aim for
    peak: int  # the most ever running at once


class Stats(TypedDict):
    queues: list[QueueStatus]
    paused: list[Paused]
    fleets: list[FleetStatus]
    priorities: list[PriorityCount] | None
    done_last_hour: dict[str, int] | None
    top_errors: dict[str, list[TopError]]
    table: TableHealth
    limits: list[Fill]


def stats(conn: psycopg.Connection) -> Stats:
    """Per queue and status: jobs, oldest ready age, expired leases; jobs done in the
    last hour (None without migration 5's done_at column); each queue's most frequent
    errors; table health; jobs by priority in the queues that use priorities other
    than 0 (None without migration 6's priority column); each limited queue's
    limits, how full they are and the jobs they hold back; the paused queues; and the
    fleets of drains that widen together (none without migration 14's table)."""
    rows = sql.rows(conn, "stats")
    errors = sql.rows(conn, "top_errors", {"top": TOP_ERRORS})
    health = sql.row(conn, "table_health")
    done = dict(sql.rows(conn, "done_last_hour")) if sql.features(conn).done_at else None
    priorities: list[PriorityCount] | None = [
        {"queue": q, "priority": p, "status": status, "jobs": n}
        for q, p, status, n in sql.rows(conn, "stats_priorities")
    ] if sql.features(conn).priority else None
    queues: list[QueueStatus] = [
        {"queue": q, "status": status, "jobs": jobs,
         "oldest_ready_seconds": None if age is None else round(float(age), 1),
         "expired_leases": expired}
        for q, status, jobs, age, expired in rows
    ]
    live, dead, autovacuum, vacuum = health or (None, None, None, None)
    table: TableHealth = {"n_live_tup": live, "n_dead_tup": dead,
                          "last_autovacuum": autovacuum.isoformat() if autovacuum else None,
                          "last_vacuum": vacuum.isoformat() if vacuum else None}
    top: dict[str, list[TopError]] = {}
    for q, error, jobs, latest in errors:
        top.setdefault(q, []).append({"error": error, "jobs": jobs, "latest_id": latest})
    return {"queues": queues, "done_last_hour": done, "top_errors": top, "table": table,
            "priorities": priorities, "limits": fills(conn), "paused": paused_queues(conn),
            "fleets": fleet_status(conn)}


def fleet_status(conn: psycopg.Connection) -> list[FleetStatus]:
    return [{"fleet": f.name, "running": f.running, "starting": f.pending,
             "target": f.target, "peak": f.peak} for f in fleets.fleets(conn)]


def paused_queues(conn: psycopg.Connection) -> list[Paused]:
    return [{"queue": p.queue, "paused_at": p.paused_at.isoformat(), "paused_by": p.paused_by,
             "ready": p.ready} for p in pauses.paused(conn)]


def format_stats(data: Stats) -> str:
    """A terminal table of `stats()`."""
    head = ("queue", "status", "jobs", "oldest ready", "expired leases")
    rows = [(r["queue"], r["status"], str(r["jobs"]), age(r["oldest_ready_seconds"]),
             str(r["expired_leases"])) for r in data["queues"]]
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in (head, *rows)]
    if not rows:
        lines.append("(no jobs)")
    lines += ["", *_rates(data["done_last_hour"]), *_chart(data["queues"]),
              *_by_priority(data.get("priorities") or []),
              *_limits(data.get("limits") or []), *_paused(data.get("paused") or []),
              *_fleets(data.get("fleets") or []),
              *_top_errors(data.get("top_errors") or {})]
    t = data["table"]
    lines.append("")
    # The rows are counted now (the table above); pg_stat_user_tables lags, and reads
    # 0 live tuples right after a burst of inserts, so it is labelled as an estimate.
    lines.append(f"jobs table: {sum(r['jobs'] for r in data['queues']):,} rows")
    lines.append(f"vacuum statistics (PostgreSQL's estimate, updated lazily): "
                 f"{t['n_live_tup']} live, {t['n_dead_tup']} dead tuples; "
                 f"last autovacuum {t['last_autovacuum'] or 'never'}, "
                 f"last vacuum {t['last_vacuum'] or 'never'}")
    return "\n".join(lines)


CHART_WIDTH = 40
TOP_ERRORS = 3  # distinct errors shown per queue
ERRORS_WIDTH = 120  # characters of an error line
DEPTH = ("queued", "running", "failed")  # done rows are history, not depth


def _rates(done: dict[str, int] | None) -> list[str]:
    if done is None:
        return ["done in the last hour: unknown (run `drainer migrate` to record done_at)"]
    total = sum(done.values())
    per_queue = "".join(f", {q} {n:,}" for q, n in sorted(done.items()))
    return [f"done in the last hour: {total:,} ({total / 3600:.2f}/s){per_queue}"]


def _chart(rows: list[QueueStatus]) -> list[str]:
    """Queue depth by status per queue: one bar per status, on one scale."""
    depth = {(r["queue"], r["status"]): r["jobs"] for r in rows if r["status"] in DEPTH}
    if not depth:
        return []
    top = max(depth.values())
    name_width = max(len(q) for q, _ in depth)
    digits = len(f"{top:,}")
    lines = ["", "queue depth (bars share one scale; done jobs are not depth):"]
    previous = None
    for (q, status), jobs in sorted(depth.items(), key=lambda i: (i[0][0], DEPTH.index(i[0][1]))):
        bar = "#" * max(1, round(CHART_WIDTH * jobs / top))
        label = q if q != previous else ""
        lines.append(f"{label:<{name_width}}  {status:<7}  {jobs:>{digits},}  {bar}")
        previous = q
    return lines


def _by_priority(rows: list[PriorityCount]) -> list[str]:
    """Queued, running and failed jobs per priority, for the queues that use them."""
    if not rows:
        return []
    counts: dict[tuple[str, int], dict[str, int]] = {}
    for r in rows:
        counts.setdefault((r["queue"], r["priority"]), {})[r["status"]] = r["jobs"]
    head = ("queue", "priority", *DEPTH)
    table = [(q, str(p), *(f"{c.get(s, 0):,}" for s in DEPTH)) for (q, p), c in counts.items()]
    widths = [max(len(c) for c in col) for col in zip(head, *table, strict=True)]
    return ["", "by priority (higher first; queues that use priorities other than 0):",
            *("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                        enumerate(zip(row, widths, strict=True))).rstrip()
              for row in (head, *table))]


def _limits(found: list[Fill]) -> list[str]:
    if not found:
        return []
    return ["", "limits (across every drainer, as the latest drain of each queue declared "
                "them):", *(f"  {describe(fill)}" for fill in found)]


def paused_line(p: Paused) -> str:
    """One paused queue: since when, by whom, the jobs that wait, and how to resume it."""
    ready = (f"more than {pauses.MORE_READY - 1:,}" if p["ready"] >= pauses.MORE_READY
             else f"{p['ready']:,}")
    return (f"{p['queue']}: paused since {p['paused_at']} by {p['paused_by']}; {ready} "
            f"ready job(s) wait (`drainer resume {p['queue']}`)")


def _paused(found: list[Paused]) -> list[str]:
    if not found:
        return []
    return ["", "paused queues (no drainer claims their jobs):",
            *(f"  {paused_line(p)}" for p in found)]


def _fleets(found: list[FleetStatus]) -> list[str]:
    if not found:
        return []
    return ["", "fleets (drains of a queue set working a backlog together):", *(
        f"  {f['fleet']}: {f['running']} running"
        + (f", {f['starting']} starting" if f["starting"] else "")
        + f", target width {f['target']} (most at once: {f['peak']})" for f in found)]


def _top_errors(top: dict[str, list[TopError]]) -> list[str]:
    """Each queue's most frequent errors, one line each with how many jobs hold it and
    the newest of them: `retried 14` in a summary says nothing of why; this does."""
    if not top:
        return []
    name_width = max(len(q) for q in top)
    digits = max(len(f"{e['jobs']:,}") for errors in top.values() for e in errors)
    ids = max(len(str(e["latest_id"])) for errors in top.values() for e in errors)
    lines = ["", "most frequent errors (failed and retrying jobs; `drainer show ID` for the "
                 "newest of each):"]
    for q, errors in sorted(top.items()):
        for n, e in enumerate(errors):
            text = (f"{q if n == 0 else '':<{name_width}}  {e['jobs']:>{digits},}  "
                    f"job {e['latest_id']:<{ids}}  {one_line(e['error'])}")
            lines.append(text if len(text) <= ERRORS_WIDTH else text[: ERRORS_WIDTH - 1] + "…")
    return lines


def cmd_stats(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        data = stats(conn)
    if args.json:
        emit(data)
    else:
        print(format_stats(data))
