"""Test tasks with a task's options: a kept result, and a retry policy."""

from drainer import Constant, task


@task("sums", keep_result=True)
def add(job):
    return {"sum": sum(job.payload)}


@task("hooks", retry_on=ConnectionError, backoff=Constant(30), max_attempts=3)
def deliver(job):
    raise (ConnectionError if job.payload.get("transient") else ValueError)(job.payload["why"])
