"""Test tasks: the payload says what the handler does."""

import os
import sys
import time
from pathlib import Path

from drainer import task


@task("default")
def behave(job):
    p = job.payload
    if "touch" in p:  # lets a test see that the handler started
        Path(p["touch"]).write_text(f"{os.getpid()} {job.attempts}")
    if "sleep" in p:
        time.sleep(p["sleep"])
    if "wait_for" in p:  # lets a test say when the handler ends (at most a minute)
        deadline = time.monotonic() + 60
        while not Path(p["wait_for"]).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    if "sleep_first" in p and job.attempts == 1:  # hangs the first attempt only
        time.sleep(p["sleep_first"])
    if "exit" in p:
        sys.exit(p["exit"])
    if "fail" in p:
        raise RuntimeError(p["fail"])


@task("other")
def other(job):
    pass
