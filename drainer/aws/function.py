"""The Lambda function's run: recognise the trigger, drain within the function's
remaining time, then act on `drainer.wake.after_run`: continue in a fresh
invocation, wait a few seconds and drain again, arm a wake-up, or stop; a run that
stops deletes the lease wake-ups its end makes stale.

Every connection is closed before a wait and before returning, so the database
sees no session from the function between runs and can suspend.
"""

import logging
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from .. import clock, cloud
from ..errors import ConfigError, DrainerError, redact
from ..run import Summary
from ..tasks import select
from ..wake import Next, switch_at
from . import clients, events, logs, schedule
from .events import Trigger
from .fanout import Member
from .settings import Settings

log = logging.getLogger(__name__)


def run_lambda(event: Any, context: Any) -> dict[str, object]:
    """One invocation, configured by the environment; returns the run's summary and
    what it did next. A user-fixable error is logged as one JSON line and raised
    without its chain, so the invocation shows as failed."""
    logs.setup(getattr(context, "aws_request_id", None))
    try:
        settings = Settings.from_env()
        trigger = events.recognise(event)
        if trigger.kind == "migrate":
            return cloud.migrate(settings)
        return _drain(trigger, context, settings)
    except DrainerError as exc:
        message = redact(str(exc))
        log.error(message, extra={"data": {"event": "error", "exit_code": exc.exit_code}})
        raise type(exc)(message) from None


def _deadline(context: Any, margin: float) -> float:
    """When to stop claiming, on the clock seam's monotonic scale."""
    left: float = context.get_remaining_time_in_millis() / 1000
    if left <= margin:
        raise ConfigError(f"the function starts with {left:.0f} s left, no more than its "
                          f"safety margin of {margin:.0f} s: raise the function's timeout or "
                          "lower DRAINER_SAFETY_MARGIN")
    return clock.monotonic() + left - margin


def _drain(trigger: Trigger, context: Any, settings: Settings) -> dict[str, object]:
    handlers, queues = select(settings.tasks, settings.queues)
    began = clock.monotonic()
    deadline = _deadline(context, settings.margin)
    log.info("run started by %s", trigger.kind, extra={"data": {
        "event": "start", "trigger": trigger.kind, "depth": trigger.depth,
        "queue": trigger.queue}})
    member = Member(settings, trigger, queues, handlers, context.invoked_function_arn, deadline)
    ran = cloud.drains(
        lambda: cloud.first_session(settings, deadline), lambda: cloud.open_session(settings),
        handlers, settings.options(queues, deadline), depth=trigger.depth,
        max_depth=settings.max_depth, on_claim=lambda: _arm_switch(context, settings),
        member=member)
    if ran.decision is None:  # a fan-out's member the fleet no longer needed
        return {**ran.total.as_json(), "trigger": trigger.kind, "depth": trigger.depth,
                "outcome": "not needed"}
    total, decision = replace(ran.total, seconds=clock.monotonic() - began), ran.decision
    outcome = _act(decision, trigger, ran.continuation, context, settings, total)
    pruned = _prune(decision, settings)
    logs.print_metrics(total, namespace=settings.namespace, function=context.function_name,
                       trigger=trigger.kind, depth=trigger.depth, next=decision.action,
                       outcome=outcome)
    return {**total.as_json(), "trigger": trigger.kind, "depth": trigger.depth,
            "next": decision.action, "at": decision.at.isoformat() if decision.at else None,
            "lease": decision.lease, "outcome": outcome, "pruned": pruned,
            "widened": member.started}


def _arm_switch(context: Any, settings: Settings) -> None:
    """The run's dead-man's switch, armed once it holds jobs and before any handler
    starts: a lease wake-up for the minute its first claim's lease ends. Should the
    run die (out of memory, a crash, the function's timeout), the wake-up reaps its
    jobs, with no backstop needed; should it fire while the run lives, the woken run
    sees the extended leases and arms the next one. A run that stops deletes it with
    the other stale lease wake-ups. Timed by the function's clock, which is close to
    the database's: a wake-up that fires a little early finds the lease held and arms
    one for its real end."""
    scheduler = settings.scheduler
    if scheduler is None:
        return
    from botocore.exceptions import BotoCoreError, ClientError

    now = datetime.fromtimestamp(clock.wall(), UTC)
    try:
        _arm(switch_at(now, settings.lease), True, context, scheduler)
    except (BotoCoreError, ClientError) as exc:
        log.error("could not arm the run's lease wake-up: %s; if the run dies, the backstop "
                  "schedule reaps its jobs", exc, extra={"data": {"event": "switch_failed"}})


def _arm(at: datetime, lease: bool, context: Any, scheduler: tuple[str, str]) -> bool:
    """`schedule.arm` for this function, in its group, with its Scheduler role."""
    group, role = scheduler
    return schedule.arm(at, target_arn=context.invoked_function_arn, role_arn=role,
                        group=group, lease=lease)


def _act(decision: Next, trigger: Trigger, continuation: events.ContinueEvent | None,
         context: Any, settings: Settings, total: Summary) -> str:
    """Carry out the decision (a continuation with `continuation`; None: the fleet's
    other members drain what is left). A failed AWS call is logged, not raised: the
    jobs are safe in the table and the backstop schedule will drain them."""
    if decision.action == "none":
        if total.next_due is not None:
            log.warning("jobs are still ready but the continuation depth is at its limit "
                        "(DRAINER_MAX_DEPTH=%d); the backstop schedule takes over",
                        settings.max_depth, extra={"data": {"event": "max_depth"}})
        return "none"
    if decision.action == "continue" and continuation is None:
        log.info("the fleet's other members drain what is left",
                 extra={"data": {"event": "left_to_fleet"}})
        return "left to the fleet"
    scheduler = settings.scheduler
    if decision.action == "wake" and scheduler is None:
        log.warning("a job is due at %s but wake-ups are not configured "
                    "(DRAINER_SCHEDULE_GROUP, DRAINER_SCHEDULER_ROLE_ARN); the backstop "
                    "schedule will run it", decision.at.isoformat() if decision.at else "?",
                    extra={"data": {"event": "wake_unconfigured"}})
        return "not armed"
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        if decision.action == "continue":
            assert continuation is not None
            clients.invoke_async(context.invoked_function_arn, continuation)
            outcome = "continued"
        else:
            assert decision.at is not None and scheduler is not None  # a wake-up, armable
            created = _arm(decision.at, decision.lease, context, scheduler)
            outcome = "armed" if created else "already armed"
    except (BotoCoreError, ClientError) as exc:
        log.error("could not %s: %s; the backstop schedule will drain what is left",
                  decision.action, exc, extra={"data": {"event": f"{decision.action}_failed"}})
        return "failed"
    log.info("%s (%s)", outcome, decision.at.isoformat() if decision.at else "now",
             extra={"data": {"event": outcome.replace(" ", "_"), "at": decision.at,
                             "lease": decision.lease,
                             "depth": trigger.depth + (decision.action == "continue")}})
    return outcome


def _prune(decision: Next, settings: Settings) -> list[str]:
    """Delete the lease wake-ups that the run's end makes stale; returns their names.
    A failure is logged, not raised: a stale wake-up costs one run that finds nothing."""
    if not (decision.stops and settings.schedule_group):
        return []
    from botocore.exceptions import BotoCoreError, ClientError

    group = settings.schedule_group
    return cloud.prune_logged(lambda: schedule.prune(decision, group=group),
                              (BotoCoreError, ClientError))
