"""`drainer failed` and `drainer show ID`: why jobs failed, without psql.

Times come back as the database writes them (JSON text), never as Python datetimes:
another producer may have stored one Python cannot hold (year 10000, infinity), and
an inspection command must show such a row, not fail on it.
"""

import json
import re
import shutil
from typing import Any, NamedTuple, TypedDict

import psycopg

from .errors import DrainerError
from .storage import sql

DEFAULT_LIMIT = 20
DEFAULT_WIDTH = 120  # when stdout is no terminal and COLUMNS is unset
MIN_WIDTH = 40
JSON_COLUMNS = ("payload", "result", "meta")  # pretty-printed by `show`
_FRACTION = re.compile(r"\.\d+(?=[+-]|$)")


class FailedJob(TypedDict):
    id: int
    queue: str
    attempts: int
    max_attempts: int | None
    created_at: str | None  # JSON text, as the database writes it
    last_error: str | None


class Failed(TypedDict):
    jobs: list[FailedJob]
    more: bool


def failed(conn: psycopg.Connection, *, queue_name: str | None = None,
           limit: int = DEFAULT_LIMIT) -> Failed:
    """The newest `limit` failed jobs (of one queue, or all), each with its full last
    error; `more` says whether older ones were left out."""
    rows = sql.rows(conn, "failed_jobs", {"queue": queue_name, "limit": limit + 1})
    return {"jobs": [_failed_job(row) for row in rows[:limit]], "more": len(rows) > limit}


def _failed_job(row: tuple[Any, ...]) -> FailedJob:
    id_, queue, attempts, max_attempts, created_at, last_error = row
    return {"id": id_, "queue": queue, "attempts": attempts, "max_attempts": max_attempts,
            "created_at": created_at, "last_error": last_error}


def width() -> int:
    """The terminal's width (COLUMNS first), else DEFAULT_WIDTH."""
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(error: str | None) -> str:
    """An error's text on one line (whitespace runs, newlines included, as one space)."""
    return "-" if error is None else " ".join(error.split())


def _seconds(moment: str | None) -> str:
    """An ISO time without its fraction of a second: a list needs no more."""
    return "-" if moment is None else _FRACTION.sub("", moment)


def format_failed(data: Failed, columns: int) -> str:
    """One line per job, cut to `columns` characters: id, queue, attempts/max, created,
    the last error on one line."""
    if not data["jobs"]:
        return "(no failed jobs)"
    head = ("id", "queue", "attempts", "created", "last error")
    rows = [(str(j["id"]), j["queue"],
             f"{j['attempts']}/{'-' if j['max_attempts'] is None else j['max_attempts']}",
             _seconds(j["created_at"]), one_line(j["last_error"])) for j in data["jobs"]]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(4)]
    lines = [_cut("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)),
                             row[4]]), columns) for row in (head, *rows)]
    if data["more"]:
        lines.append(f"(the newest {len(rows)} shown; --limit N shows more)")
    return "\n".join(lines)


class Shown(NamedTuple):
    """`drainer show`'s job: its row, whether it came from the archive, and the seconds
    its lease has left (negative: it ran out; None: it has none that ends)."""

    row: dict[str, object]
    archived: bool
    lease_left: float | None


def job(conn: psycopg.Connection, job_id: int) -> Shown:
    """Every column of the job's row, in table order, and where it came from;
    DrainerError (exit 1) when neither table has it."""
    row = sql.row(conn, "show_job", {"id": job_id})
    archived = row is None and sql.features(conn).archive
    if archived:
        row = sql.row(conn, "show_archived_job", {"id": job_id})
    if row is None:
        where = "jobs or jobs_archive" if archived else "jobs"
        raise DrainerError(f"no job {job_id} in {where}; `drainer failed` lists failed jobs")
    return Shown(_loads(row[0]), archived, row[1])


def statuses(conn: psycopg.Connection, ids: list[int]) -> tuple[dict[int, str], str]:
    """The status of each of `ids` that is a job (an archived one's says so), and where
    the others were looked for, for a message naming them."""
    found = {job_id: status for job_id, status in sql.rows(conn, "job_statuses", {"ids": ids})}
    if not sql.features(conn).archive:
        return found, "jobs"
    rest = [job_id for job_id in ids if job_id not in found]
    archived = sql.rows(conn, "archived_job_statuses", {"ids": rest}) if rest else []
    return found | {job_id: f"{status}, archived" for job_id, status in archived}, \
        "jobs or jobs_archive"


def _loads(text: str) -> dict[str, object]:
    """The row's JSON; a row Python's json cannot load (a payload nested too deep, a
    number too long) is shown as the database's JSON text."""
    try:
        row: dict[str, object] = json.loads(text)  # row_to_json: always an object
        return row
    except (ValueError, RecursionError):
        return {"row": text}


def format_job(shown: Shown) -> str:
    """`key  value` lines in column order; the payload, result and meta pretty-printed
    and every value in full, continued lines indented under the first; then what its
    lease and status mean."""
    row, archived = shown.row, shown.archived
    pad = max(len(key) for key in row) + 2
    lines = [f"job {row.get('id', '?')}" + (" (archived: in jobs_archive)" if archived else "")]
    for key, value in row.items():
        text = (json.dumps(value, indent=2, ensure_ascii=False)
                if key == "payload" or (key in JSON_COLUMNS and value is not None)
                else _value(value))
        first, *rest = text.split("\n")
        lines.append(f"{key.ljust(pad)}{first}".rstrip())
        lines += [" " * pad + line for line in rest]
    lease = _lease(row.get("status"), shown.lease_left)
    if lease:
        lines += ["", lease]
    if row.get("status") == "failed" and not archived:
        lines += ["", f"`drainer requeue {row['id']}` runs it again with a fresh budget of "
                      "attempts"]
    return "\n".join(lines)


def _lease(status: object, left: float | None) -> str | None:
    """What a running job's lease (locked_until) means now, by the database clock; and
    a job cancelled while running, whose handler may run until its lease ends."""
    if left is None:
        return None
    if status == "running" and left > 0:
        return (f"lease: ends in {age(left)} (locked_until, by the database clock); its "
                "drain renews it while the handler runs, and if that drain dies the job "
                "is taken back once it ends")
    if status == "running":
        return (f"lease: ran out {age(-left)} ago (locked_until): its drain is gone or "
                "stuck; the next drain (or `drainer reap`) puts the job back to queued, "
                "or fails it after its last attempt")
    if status == "failed" and left > 0:
        return (f"lease: ends in {age(left)}: cancelled while running, its handler may "
                "run on until then")
    return None


def age(seconds: float | None) -> str:
    """A duration for a person: 42.0s, 3.5m, 2.0h, 1.2d."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def _value(value: object) -> str:
    return "-" if value is None else str(value)
