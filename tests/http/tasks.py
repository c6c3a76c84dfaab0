"""Tasks for the HTTP entry point's tests (queue "web"): the payload says what to do."""

from drainer import task


@task("web")
def work(job):
    if "fail" in job.payload:
        raise RuntimeError(job.payload["fail"])
