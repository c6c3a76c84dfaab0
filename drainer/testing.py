"""For tests of code that runs drainer in the test process: put drainer's
per-process state back between tests.

drainer keeps some state for the life of a process, as a long-running worker or a
warm Lambda container wants: the threads that run handlers, and with drainer.aws
its boto3 clients, cached database secrets, the producers' pending kicks and the
Lambda log handler. A test suite is one process for many tests, so each test
should start from none of it: call `reset()` after each test (from an autouse
fixture, say). Task registrations are kept: a module registers its tasks when it
is first imported, and a cleared registry would not see them again; give a test
tasks of its own with `separate_tasks()`.

Not imported by `import drainer`, and importable without the aws extra.
"""

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from . import clock, hooks, schedules, tasks


def reset() -> None:
    """Drop drainer's per-process state: cancel pending kicks, forget clients and
    secrets, remove the Lambda log handler, end idle handler threads."""
    # The AWS modules hold state only once imported: one that is not has nothing to
    # drop, and importing it here would only cost time.
    if "drainer.aws.kick" in sys.modules:
        from .aws import kick

        kick.cancel_all()
    if "drainer.aws.clients" in sys.modules:
        from .aws import clients

        clients.clear()
    if "drainer.aws.credentials" in sys.modules:
        from .aws import credentials

        credentials.forget_secrets()
    if "drainer.aws.logs" in sys.modules:
        from .aws import logs

        logs.teardown()
    clock.end_threads()


@contextmanager
def separate_tasks() -> Iterator[None]:
    """Within the block, a task registry (and declared schedules, and global hooks) of
    its own: empty at first, and after it, what was registered before is back and what
    the block registered is gone."""
    previous = tasks.replace_registry({})
    declared = schedules.replace_declared({})
    alerting = hooks.replace_registered([], [])
    try:
        yield
    finally:
        tasks.replace_registry(previous)
        schedules.replace_declared(declared)
        hooks.replace_registered(*alerting)
