"""Tasks for the in-process Lambda tests (queue "aws"): the payload says what to do."""

import time

from drainer import task


@task("aws")
def work(job):
    if "sleep" in job.payload:
        time.sleep(job.payload["sleep"])
    if "fail" in job.payload:
        raise RuntimeError(job.payload["fail"])
