"""`drainer failed`: the newest failed jobs, one line each with their last error, so
that a user learns why jobs failed without psql.

Times come back as the database writes them (JSON text), never as Python datetimes:
another producer may have stored one Python cannot hold (year 10000, infinity), and
an inspection command must show such a row, not fail on it.
"""

import argparse
import re
import shutil
from typing import Any, TypedDict

import psycopg

from ..storage import sql
from .common import emit, open_db
from .text import one_line

DEFAULT_LIMIT = 20
DEFAULT_WIDTH = 120  # when stdout is no terminal and COLUMNS is unset
MIN_WIDTH = 40
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


def cmd_failed(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        data = failed(conn, queue_name=args.queue, limit=args.limit)
    if args.json:
        emit(data)
    else:
        print(format_failed(data, width()))
