"""Test tasks with `async def` handlers: the payload says what each does."""

import asyncio
import os
from pathlib import Path

from drainer import task


@task("async")
async def wait(job):
    if "touch" in job.payload:  # lets a test see that the handler started
        Path(job.payload["touch"]).write_text(str(os.getpid()))
    if "loop" in job.payload:  # which event loop runs the handlers
        Path(job.payload["loop"]).write_text(type(asyncio.get_running_loop()).__module__)
    await asyncio.sleep(job.payload.get("sleep", 0))
    if "fail" in job.payload:
        raise RuntimeError(job.payload["fail"])


@task("sync")
def plain(job):
    pass
