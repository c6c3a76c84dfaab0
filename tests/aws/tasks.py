"""Tasks for the in-process Lambda tests (queue "aws"): the payload says what to do."""

import time

import boto3

from drainer import task

SEEN: list[set[str]] = []  # the wake-up group's schedule names, as each "look" job saw them


@task("aws")
def work(job):
    if "look" in job.payload:
        group = boto3.client("scheduler").list_schedules(GroupName=job.payload["look"])
        SEEN.append({s["Name"] for s in group["Schedules"]})
    if "sleep" in job.payload:
        time.sleep(job.payload["sleep"])
    if "fail" in job.payload:
        raise RuntimeError(job.payload["fail"])
