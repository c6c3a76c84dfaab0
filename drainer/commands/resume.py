"""`resume`: a paused queue's jobs may be claimed again; the drainers are told."""

import argparse

from ..storage import pauses
from .common import emit, log, open_db

HELP = """\
The queue's waiting jobs may be claimed again. Resuming sends a NOTIFY, as an
enqueue does, so every `drainer work` that drains the queue starts at once. On AWS
Lambda, the function's next wake-up or its backstop drains the queue; to start it
now, invoke it as a producer's kick does:

  drainer resume email
  aws lambda invoke --function-name drainer --invocation-type Event \\
      --cli-binary-format raw-in-base64-out \\
      --payload '{"source": "drainer.enqueue", "queue": "email"}' /dev/null

Resuming a queue that is not paused changes nothing."""


def cmd_resume(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        changed = pauses.resume(conn, args.queue)
    if not changed:
        log.info("queue %r was not paused", args.queue)
    emit({"queue": args.queue, "paused": False, "changed": changed})
