"""Test tasks: an async handler that ignores cancellation past its timeout, and a
quick one."""

import asyncio
import contextlib

from drainer import task


@task("stubborn", timeout=1)
async def stubborn(job):
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)


@task("quick")
async def quick(job):
    await asyncio.sleep(0.01)
