"""`cancel`: withdraw queued or running jobs by id; the ids that were not cancelled
are named, and an id that is no job makes the exit status 1."""

import argparse

import psycopg

from ..errors import DrainerError
from ..storage import admin, sql
from .common import emit, log, open_db


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


def cmd_cancel(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        ids = admin.cancel(conn, args.ids)
        left = sorted(set(args.ids) - set(ids))
        known, where = statuses(conn, left) if left else ({}, "jobs")
    missing = [job_id for job_id in left if job_id not in known]
    if known:
        log.warning("not cancelled, already finished: %s",
                    ", ".join(f"{job_id} ({status})" for job_id, status in sorted(known.items())))
    emit({"cancelled": len(ids), "ids": ids, **({"not_found": missing} if missing else {})})
    if missing:  # a mistyped id: as `show` does, exit 1 (what exists is cancelled)
        raise DrainerError(f"no job {', '.join(map(str, missing))} in {where}; "
                           f"{len(ids)} of {len(set(args.ids))} cancelled")
