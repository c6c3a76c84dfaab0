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


@task("bench_limited", concurrency=50)
def limited(job):
    pass


@task("bench_sleep")
def sleep(job):
    time.sleep(0.01)


@task("bench_limited_sleep", concurrency=50)
def limited_sleep(job):
    time.sleep(0.01)


@task("bench_async_sleep")
async def async_sleep(job):
    await asyncio.sleep(0.01)
