"""drainer.testing: the reset of drainer's per-process state between tests, and a
task registry of a test's own. The AWS parts: tests/aws/test_reset.py."""

import subprocess
import sys
import threading

import drainer
from drainer import tasks, testing
from tests.helpers import clean_env, wait_until


def handler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "drainer-handler"]


def test_importing_drainer_leaves_it_out_and_reset_imports_nothing_more():
    check = ("import sys, drainer; assert 'drainer.testing' not in sys.modules; "
             "import drainer.testing; drainer.testing.reset(); "
             "print(sorted(m for m in sys.modules if m.startswith(('drainer.aws', 'boto'))))")
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          env=clean_env())
    assert (proc.returncode, proc.stdout) == (0, "[]\n"), proc.stderr


def test_reset_ends_the_handler_threads_kept_for_the_next_batch(conn):
    earlier = set(handler_threads())  # an earlier test's, still in a written-off handler
    drainer.enqueue_many(conn, "default", [{}] * 8)
    summary = drainer.drain(conn, {"default": lambda job: None},
                            drainer.Options(queues=["default"], concurrency=4))
    assert summary.done == 8 and set(handler_threads()) - earlier  # idle, kept
    testing.reset()
    wait_until(lambda: not set(handler_threads()) - earlier)
    drainer.enqueue(conn, "default", {})
    assert drainer.drain(conn, {"default": lambda job: None},
                         drainer.Options(queues=["default"])).done == 1  # new threads


def test_separate_tasks_hides_the_registry_and_forgets_what_the_block_registered():
    before = tasks.registered()
    with testing.separate_tasks():
        assert tasks.registered() == {}
        drainer.task("separate")(lambda job: None)
        assert list(tasks.registered()) == ["separate"]
    assert tasks.registered() == before
