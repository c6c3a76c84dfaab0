"""Test tasks that misbehave: hang (with and without a timeout), exit, return junk."""

import sys
import time
from pathlib import Path

from drainer import task


@task("hang", timeout=1)
def hang(job):
    Path(job.payload["touch"]).touch()
    time.sleep(3600)  # never returns, as far as a test can tell


@task("hang_forever")
def hang_forever(job):
    Path(job.payload["touch"]).touch()
    time.sleep(3600)


@task("exit")
def leave(job):
    sys.exit(job.payload.get("code", 3))


@task("junk")
def junk(job):
    return object()  # not serialisable: ignored, the job is done
