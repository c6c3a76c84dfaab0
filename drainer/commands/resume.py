"""`resume`: a paused queue's jobs may be claimed again; the drainers are told."""

import argparse

from ..storage import pauses
from .common import emit, log, open_db

HELP = """\
The queue's waiting jobs may be claimed again. Resuming sends a NOTIFY, as an
enqueue does, so every `drainer work` that drains the queue starts at once. On AWS
Lambda, the function's next wake-up or its backstop drains the queue; with --kick
(or DRAINER_KICK_FUNCTION) naming the function, a resume that changed something
invokes it at once, as a producer's kick does, once the resume has committed (the
aws extra; one attempt: a failed invoke is logged, and the queue stays resumed):

  drainer resume email --kick drainer

Resuming a queue that is not paused changes nothing, and kicks nothing."""


def cmd_resume(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        changed = pauses.resume(conn, args.queue)
    if not changed:
        log.info("queue %r was not paused", args.queue)
    elif args.kick_function:
        from ..aws.kick import Kicker  # only with a kick: a resume without needs no AWS

        # One attempt, now: a retry in the background would die with this process.
        Kicker(args.kick_function, retry=False).kick(args.queue)
    emit({"queue": args.queue, "paused": False, "changed": changed})
