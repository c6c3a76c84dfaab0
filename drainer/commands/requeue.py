"""`requeue`: failed jobs (of a queue, or by id) back to queued with a fresh budget of
attempts; the ids it had to leave alone are named, with why."""

import argparse

from ..errors import ConfigError
from ..storage import admin
from .common import emit, log, open_db


def cmd_requeue(args: argparse.Namespace) -> None:
    if bool(args.ids) == bool(args.queue):
        raise ConfigError("give failed job ids or --queue Q (one of the two)")
    with open_db(args) as conn:
        ids = admin.requeue(conn, queue=args.queue, ids=args.ids)
    for job_id, holder in ids.held.items():
        log.warning("job %d not requeued: job %d holds its key", job_id, holder)
    for job_id, until in ids.waiting.items():
        log.warning("job %d not requeued: cancelled while running, its handler may run "
                    "until its lease ends at %s; requeue it then", job_id, until.isoformat())
    held = {"held": [{"id": i, "holder": h} for i, h in ids.held.items()]} if ids.held else {}
    waiting = ({"waiting": [{"id": i, "until": u.isoformat()} for i, u in ids.waiting.items()]}
               if ids.waiting else {})
    emit({"requeued": len(ids), "ids": ids, **held, **waiting})
