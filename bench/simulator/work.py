"""The simulated jobs' task module: the function's run loads it by name, as it
loads an application's. Its handler is the replay's (`World.handle`)."""

from collections.abc import Callable

from drainer.model import Job
from drainer.tasks import task

QUEUE = "simulated"

# The replay under way: what runs a job (one replay at a time per process).
current: Callable[[Job], None] | None = None


@task(QUEUE)
def run(job: Job) -> None:
    assert current is not None, "no replay is under way"
    current(job)
