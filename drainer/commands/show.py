"""`drainer show ID`: one job whole, from jobs or the archive, so that a user sees why
it failed (or what it holds) without psql.

The row comes back as the database's JSON text, as in `failed`: a time Python
cannot hold (year 10000, infinity) is shown as written, never a failure.
"""

import argparse
import json
from typing import NamedTuple

import psycopg

from ..errors import DrainerError
from ..storage import sql
from .common import emit, open_db
from .text import age

JSON_COLUMNS = ("payload", "result", "meta")  # pretty-printed by `show`


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
        first, *rest = column_text(key, value).split("\n")
        lines.append(f"{key.ljust(pad)}{first}".rstrip())
        lines += [" " * pad + line for line in rest]
    lease = lease_note(row.get("status"), shown.lease_left)
    if lease:
        lines += ["", lease]
    if row.get("status") == "failed" and not archived:
        lines += ["", f"`drainer requeue {row['id']}` runs it again with a fresh budget of "
                      "attempts"]
    return "\n".join(lines)


def column_text(key: str, value: object) -> str:
    """A column's value as shown: the payload, result and meta as indented JSON."""
    if key == "payload" or (key in JSON_COLUMNS and value is not None):
        return json.dumps(value, indent=2, ensure_ascii=False)
    return _value(value)


def lease_note(status: object, left: float | None) -> str | None:
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


def _value(value: object) -> str:
    return "-" if value is None else str(value)


def cmd_show(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        shown = job(conn, args.id)
    if args.json:
        emit(shown.row)
    else:
        print(format_job(shown))
