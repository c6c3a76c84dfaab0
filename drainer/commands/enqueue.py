"""`enqueue`: one job from the command line, or one job per JSON line on stdin (all
or nothing)."""

import argparse
import json
import sys
from typing import TextIO

from ..errors import BadInput, ConfigError
from ..storage import enqueue
from .common import emit, log, open_db


def _read_lines(stream: TextIO) -> list[object]:
    """Every stdin line as a payload, or BadInput naming the first bad line.
    Blank lines carry no job and are skipped; line numbers still count them."""
    payloads = []
    for number, raw in enumerate(stream.buffer, 1):
        if not raw.strip():
            continue
        try:
            # Without its newline the line is the whole document: an error's position
            # is then a column of this line, never a second line number.
            payloads.append(_payload(raw.decode("utf-8").rstrip("\r\n")))
        except (UnicodeDecodeError, BadInput) as exc:
            reason = "is not UTF-8" if isinstance(exc, UnicodeDecodeError) else f"- {exc}"
            raise BadInput(f"stdin line {number} {reason}; nothing was enqueued") from None
    return payloads


def _payload(text: str) -> object:
    """A JSON document that jsonb can store, or BadInput saying why not."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        raise BadInput(f"the payload is not valid JSON: {exc.msg} at {at}") from None
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"the payload is not valid JSON: {exc}") from None
    enqueue.encode_payload(payload)
    return payload


def cmd_enqueue(args: argparse.Namespace) -> None:
    enqueue.check_queue(args.queue)
    if args.replace and args.key is None:
        raise ConfigError("--replace needs --key")
    when = {"run_at": args.run_at, "delay": args.delay, "max_attempts": args.max_attempts,
            "priority": args.priority}
    if args.payload is not None:
        payload = _payload(args.payload)  # refuse bad input before connecting
        with open_db(args) as conn:
            job = enqueue.enqueue_keyed(conn, args.queue, payload, key=args.key,
                                      replace=args.replace, **when)
        if job.outcome in ("queued", "running"):
            log.info("job %d (%s) holds key %r of queue %r: nothing enqueued%s", job.id,
                     job.outcome, args.key, args.queue,
                     "; a running job keeps its payload" if args.replace else "")
        emit({"id": job.id})
        return
    if args.key is not None:
        raise ConfigError("--key names one job: give its JSON as an argument, not on stdin")
    if sys.stdin.isatty():  # a user who forgot the JSON argument would wait in silence
        log.info("reading jobs for queue %r from stdin: one JSON document per line; "
                 "Ctrl-D on a line of its own to finish (nothing is enqueued before)",
                 args.queue)
    payloads = _read_lines(sys.stdin)
    with open_db(args) as conn:
        count = enqueue.enqueue_many(conn, args.queue, payloads, **when)
    log.info("enqueued %d jobs on %r", count, args.queue)
    emit({"enqueued": count})
