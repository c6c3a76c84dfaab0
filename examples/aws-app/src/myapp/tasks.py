"""The app's background jobs, one @task per queue. The function imports this module
on its first run (DRAINER_TASKS=myapp.tasks in template.yaml) and drains every
queue that has a task; the app enqueues into them in its own transactions."""

import logging

from drainer import Job, task

log = logging.getLogger(__name__)


@task("email", timeout=30)
def send_welcome_email(job: Job) -> None:
    """Send the welcome email of a new account, `{"to": address}`.

    Returning completes the job; raising retries it with backoff, and fails it for
    good at max_attempts with the error as its last_error. The timeout lets the
    function judge whether a job still fits in its remaining time. A run that dies
    mid-job leaves the job to run again after its lease, so keep this idempotent
    (your mail provider's idempotency key: the job's id).
    """
    address = job.payload["to"]
    # Your mail provider's API call goes here.
    log.info("welcome email to %s (job %d, attempt %d of %d)", address, job.id, job.attempts,
             job.max_attempts)
