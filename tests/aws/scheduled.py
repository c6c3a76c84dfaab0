"""A task module with a schedule, for the function's tests (queue "nightly"): a job
at 03:00 Paris time every day. tests/aws/test_schedules.py imports it afresh for
each test, in a task registry of the test's own, so its state starts empty."""

from collections.abc import Callable
from datetime import datetime

from drainer import task

RAN: list[datetime | None] = []  # job.scheduled_for of each job run, in order
DURING: list[Callable[[], None]] = []  # called while a job runs


@task("nightly", cron="0 3 * * *", tz="Europe/Paris")
def nightly(job):
    RAN.append(job.scheduled_for)
    for call in DURING:
        call()
