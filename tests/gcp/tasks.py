"""Tasks for the Cloud Run function's tests (queue "gcp"): the payload says what to do."""

import time

from drainer import task


@task("gcp")
def work(job):
    if "sleep" in job.payload:
        time.sleep(job.payload["sleep"])
    if "fail" in job.payload:
        raise RuntimeError(job.payload["fail"])
