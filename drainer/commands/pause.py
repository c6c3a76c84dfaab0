"""`pause`: no drainer claims the queue's jobs from its next claim on; they wait."""

import argparse

from ..storage import pauses
from .common import emit, log, open_db

HELP = """\
A paused queue's jobs stay queued: no drainer claims them, from each drainer's next
claim on (a running drain or `work` included: jobs it claimed already finish). Its
jobs wake nothing up while it is paused: a drain's next_due and the wake-ups leave
it out, so a paused queue costs nothing. Everything else goes on: enqueues, its
schedules' slots (they wait too), the reaper and archiving. `drainer stats` and
`doctor` show the paused queues; `drainer resume QUEUE` lets its jobs run.

The pause lives in the database (`drainer migrate` creates its table), so every
drainer sees it; pausing a queue already paused changes nothing.

  drainer pause email      # prints {"queue": "email", "paused": true, "changed": true}
  drainer resume email"""


def cmd_pause(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        changed = pauses.pause(conn, args.queue)
        [ready] = [p.ready for p in pauses.paused(conn) if p.queue == args.queue]
    if not changed:
        log.info("queue %r was paused already", args.queue)
    if not ready:  # a queue need not exist to be paused: a mistyped name would be
        log.info("queue %r has no ready job (is the name right?); it is paused all the "
                 "same", args.queue)
    emit({"queue": args.queue, "paused": True, "changed": changed})
