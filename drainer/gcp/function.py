"""The Cloud Run function's run: drain within the function's timeout, then act on
`drainer.wake.after_run` as the Lambda function does: continue in a fresh run (a
Cloud Tasks task now), wait a few seconds and drain again, arm a wake-up (a task
named after its minute), or stop; a run that stops deletes the lease wake-ups its
end makes stale.

Every connection is closed before a wait and before returning, so the database
sees no session from the function between runs and can suspend.
"""

import logging
from dataclasses import replace
from datetime import UTC, datetime

from .. import clock, cloud
from ..errors import ConfigError
from ..tasks import select
from ..wake import Next, switch_at
from . import wakeups
from .events import Trigger
from .settings import Settings

log = logging.getLogger(__name__)


def run(trigger: Trigger, settings: Settings, started: float) -> dict[str, object]:
    """One request, begun at `started` (on the clock seam's monotonic scale): the
    run's summary and what it did next, or the migration's result."""
    if trigger.kind == "migrate":
        return cloud.migrate(settings)
    return _drain(trigger, settings, _deadline(settings, started))


def _deadline(settings: Settings, started: float) -> float:
    if settings.timeout <= settings.margin:
        raise ConfigError(f"DRAINER_FUNCTION_TIMEOUT ({settings.timeout:g} s) must be above "
                          f"the safety margin of {settings.margin:g} s: set it to the "
                          "function's --timeout, or lower DRAINER_SAFETY_MARGIN")
    return started + settings.timeout - settings.margin


def _drain(trigger: Trigger, settings: Settings, deadline: float) -> dict[str, object]:
    handlers, queues = select(settings.drain.tasks, settings.drain.queues)
    settings = replace(settings, drain=replace(settings.drain, queues=queues))
    began = clock.monotonic()
    log.info("run started by %s", trigger.kind, extra={"data": {
        "event": "start", "trigger": trigger.kind, "depth": trigger.depth}})
    ran = cloud.drains(
        lambda: cloud.first_session(settings, deadline), lambda: cloud.open_session(settings),
        handlers, settings.options(deadline), depth=trigger.depth,
        max_depth=settings.max_depth, on_claim=lambda: _arm_switch(settings))
    decision, now = ran.decision, ran.now
    assert decision is not None and now is not None  # no fleet here: a run always decides
    total = replace(ran.total, seconds=clock.monotonic() - began)
    outcome = _act(decision, trigger, settings, now, ready=total.next_due is not None)
    pruned = _prune(decision, settings)
    log.info("run ended: %s", outcome, extra={"data": {"event": "end", **total.as_json()}})
    return {**total.as_json(), "trigger": trigger.kind, "depth": trigger.depth,
            "next": decision.action, "at": decision.at.isoformat() if decision.at else None,
            "lease": decision.lease, "outcome": outcome, "pruned": pruned}


def _arm_switch(settings: Settings) -> None:
    """The run's dead-man's switch, armed once it holds jobs and before any handler
    starts: a lease wake-up for the minute its first claim's lease ends, so the jobs
    of a run that dies (out of memory, the function's timeout) are reaped then."""
    if settings.wakeups is None:
        return
    from google.api_core.exceptions import GoogleAPIError

    now = datetime.fromtimestamp(clock.wall(), UTC)
    try:
        wakeups.arm(switch_at(now, settings.lease), settings.wakeups, now=now, lease=True)
    except GoogleAPIError as exc:
        log.error("could not arm the run's lease wake-up: %s; if the run dies, the backstop "
                  "reaps its jobs", exc, extra={"data": {"event": "switch_failed"}})


def _act(decision: Next, trigger: Trigger, settings: Settings, now: datetime, *,
         ready: bool) -> str:
    """Carry out the decision (`ready`: the last drain left a job due). A failed call
    is logged, not raised: the jobs are safe in the table and the backstop will
    drain them."""
    if decision.action == "none":
        if ready:
            log.warning("jobs are still ready but the continuation depth is at its "
                        "limit (DRAINER_MAX_DEPTH=%d); the backstop takes over",
                        settings.max_depth, extra={"data": {"event": "max_depth"}})
        return "none"
    if settings.wakeups is None:
        log.warning("%s wanted but wake-ups are not configured (DRAINER_TASKS_QUEUE, "
                    "DRAINER_WAKE_URL, DRAINER_TASKS_SERVICE_ACCOUNT); the backstop "
                    "will run what is due", decision.action,
                    extra={"data": {"event": "wake_unconfigured", "at": decision.at}})
        return "not armed"
    from google.api_core.exceptions import GoogleAPIError

    try:
        if decision.action == "continue":
            wakeups.continuation(trigger.depth + 1, settings.wakeups)
            outcome = "continued"
        else:
            assert decision.at is not None  # a wake-up is for a moment
            created = wakeups.arm(decision.at, settings.wakeups, now=now,
                                  lease=decision.lease)
            outcome = "armed" if created else "already armed"
    except GoogleAPIError as exc:
        log.error("could not %s: %s; the backstop will drain what is left",
                  decision.action, exc, extra={"data": {"event": f"{decision.action}_failed"}})
        return "failed"
    log.info("%s (%s)", outcome, decision.at.isoformat() if decision.at else "now",
             extra={"data": {"event": outcome.replace(" ", "_"), "at": decision.at,
                             "lease": decision.lease}})
    return outcome


def _prune(decision: Next, settings: Settings) -> list[str]:
    """Delete the lease wake-ups the run's end makes stale. A failure is logged, not
    raised: a stale wake-up costs one run that finds nothing."""
    if settings.wakeups is None:
        return []
    from google.api_core.exceptions import GoogleAPIError

    target = settings.wakeups
    return cloud.prune_logged(lambda: wakeups.prune(decision, target), (GoogleAPIError,))
