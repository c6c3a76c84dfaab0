"""The drainer tasks the bench drains (`--tasks drainer_tasks`): a no-op, the same on
a queue limited to 50 running jobs across drainers, and one that sleeps 10 ms."""

import time

from drainer import task


@task("bench_noop")
def noop(job):
    pass


@task("bench_limited", concurrency=50)
def limited(job):
    pass


@task("bench_sleep")
def sleep(job):
    time.sleep(0.01)
