"""The Cloud Run functions entry points that ship in the package (Functions
Framework): deploy with `--entry-point drain_http` or `--entry-point drain_pubsub`
from an app whose main.py imports them (`from drainer.gcp.entry import drain_http`),
or from this repository's `handlers/gcp.py`.

- `drain_http`: an HTTP function, for Cloud Scheduler (the backstop), the Cloud
  Tasks wake-ups and continuations, and a producer's kick; answers with the run's
  summary as JSON. Google's front end checks the caller's token and its invoker
  role before the function sees the request (deploy it without unauthenticated
  access).
- `drain_pubsub`: a CloudEvent function for a Pub/Sub topic, whose message data is
  the same JSON (a Cloud Scheduler job that publishes, or a producer's kick).

Both are configured by the environment (DRAINER_TASKS, DATABASE_URL or
DRAINER_DATABASE_SECRET, DRAINER_FUNCTION_TIMEOUT, ...; see infra/gcp/README.md).
"""

import base64
import binascii
import contextlib
import logging

import functions_framework
from cloudevents.http import CloudEvent
from flask import Request

from .. import clock
from ..errors import BadInput, DrainerError, redact
from . import events, function, logs
from .settings import Settings

log = logging.getLogger(__name__)


def run(body: bytes, execution_id: str | None) -> dict[str, object]:
    """One request's run, from its body. A user-fixable error is logged as one JSON
    line and raised without its chain or a password."""
    started = clock.monotonic()
    logs.setup(execution_id)
    try:
        trigger = events.parse(body)
        return function.run(trigger, Settings.from_env(), started)
    except DrainerError as exc:
        message = redact(str(exc))
        log.error(message, extra={"data": {"event": "error", "exit_code": exc.exit_code}})
        failed = type(exc)(message)
        failed.summary = exc.summary
        raise failed from None


@functions_framework.http
def drain_http(request: Request) -> tuple[dict[str, object], int]:
    """The summary with 200; 400 for a body that is not a trigger, 500 for any other
    failure, with the error and its exit code (the command line's)."""
    try:
        return run(request.get_data(), request.headers.get("Function-Execution-Id")), 200
    except DrainerError as exc:
        status = 400 if isinstance(exc, BadInput) else 500
        return {"error": str(exc), "exit_code": exc.exit_code, "summary": exc.summary}, status


@functions_framework.cloud_event
def drain_pubsub(cloud_event: CloudEvent) -> None:
    """A message that is not a trigger is logged and dropped (a retry would not
    change it); any other failure is raised, so the delivery counts as failed."""
    data = cloud_event.get_data()
    message = data.get("message", {}) if isinstance(data, dict) else {}
    try:
        body = base64.b64decode(message.get("data", ""), validate=True)
    except (binascii.Error, TypeError):
        body = b"\0"  # not base64: refused as a body that is not JSON
    with contextlib.suppress(BadInput):  # logged by run()
        run(body, cloud_event.get("id"))
