"""The drainer tasks the bench drains (`--tasks drainer_tasks`): a no-op, and 10 ms of
waiting in a thread (`time.sleep`), each also on a queue limited to 50 running jobs
across drainers, and 10 ms of waiting on the event loop (`async def`,
`asyncio.sleep`).

With BENCH_DRAINER_FILE set, it writes there the path of the drainer it imported:
`python -m bench.speed --against REV` asks each side's first drain which tree it ran.
"""

import asyncio
import os
import time

import drainer
from drainer import task

if _probe := os.environ.get("BENCH_DRAINER_FILE"):
    with open(_probe, "w") as _out:
        _out.write(drainer.__file__ or "")


@task("bench_noop")
def noop(job):
    pass


@task("bench_sleep")
def sleep(job):
    time.sleep(0.01)


def limited(job):
    pass


def limited_sleep(job):
    time.sleep(0.01)


try:
    task("bench_limited", concurrency=50)(limited)
    task("bench_limited_sleep", concurrency=50)(limited_sleep)
except TypeError:  # an earlier commit's drainer, before limits (`--against`): no limited queue
    pass


@task("bench_async_sleep")
async def async_sleep(job):
    await asyncio.sleep(0.01)
