"""`stats`: what is in the queue, and whether vacuum keeps up with it."""

import psycopg

from .errors import translated
from .sql import QUERIES


def stats(conn: psycopg.Connection) -> dict:
    """Per queue and status: jobs, oldest ready age, expired leases; and table health."""
    with translated():
        rows = conn.execute(QUERIES["stats"]).fetchall()
        health = conn.execute(QUERIES["table_health"]).fetchone()
    queues = [
        {"queue": q, "status": status, "jobs": jobs,
         "oldest_ready_seconds": None if age is None else round(float(age), 1),
         "expired_leases": expired}
        for q, status, jobs, age, expired in rows
    ]
    live, dead, autovacuum, vacuum = health or (None, None, None, None)
    table = {"n_live_tup": live, "n_dead_tup": dead,
             "last_autovacuum": autovacuum.isoformat() if autovacuum else None,
             "last_vacuum": vacuum.isoformat() if vacuum else None}
    return {"queues": queues, "table": table}


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def format_stats(data: dict) -> str:
    """A terminal table of `stats()`."""
    head = ("queue", "status", "jobs", "oldest ready", "expired leases")
    rows = [(r["queue"], r["status"], str(r["jobs"]), _age(r["oldest_ready_seconds"]),
             str(r["expired_leases"])) for r in data["queues"]]
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in (head, *rows)]
    if not rows:
        lines.append("(no jobs)")
    t = data["table"]
    lines.append("")
    lines.append(f"jobs table: {t['n_live_tup']} live, {t['n_dead_tup']} dead tuples; "
                 f"last autovacuum {t['last_autovacuum'] or 'never'}, "
                 f"last vacuum {t['last_vacuum'] or 'never'}")
    return "\n".join(lines)
