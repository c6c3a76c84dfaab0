"""The drainer tasks the bench drains (`--tasks drainer_tasks`): a no-op, and 10 ms of
waiting in a thread (`time.sleep`), each also on a queue limited to 50 running jobs
across drainers, and 10 ms of waiting on the event loop (`async def`,
`asyncio.sleep`)."""

import asyncio
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


@task("bench_limited_sleep", concurrency=50)
def limited_sleep(job):
    time.sleep(0.01)


@task("bench_async_sleep")
async def async_sleep(job):
    await asyncio.sleep(0.01)
