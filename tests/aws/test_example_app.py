"""The example app's function end to end: the handler string and environment its
template deploys, its own tasks module, the backstop schedule's event, moto and a
real PostgreSQL."""

import importlib
import json
import sys
from collections.abc import Iterator

import pytest
from samtranslator.yaml_helper import yaml_parse

from drainer import enqueue, testing
from tests.aws.helpers import FakeContext, settled_sessions
from tests.helpers import count
from tests.templates import EXAMPLE_TEMPLATE, code_dir, the_function


@pytest.fixture
def example_function(function_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """The example's function as deployed: its code directory first on sys.path (the
    task root), its template's DRAINER_TASKS and no queue filter, in the stack's
    wake-up group. The task registry is per process, so the example's tasks are
    registered apart from the other tests' and forgotten afterwards."""
    props = the_function(yaml_parse(EXAMPLE_TEMPLATE.read_text()))
    monkeypatch.syspath_prepend(str(code_dir(EXAMPLE_TEMPLATE, props)))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ in the example
    monkeypatch.setenv("DRAINER_TASKS", props["Environment"]["Variables"]["DRAINER_TASKS"])
    monkeypatch.delenv("DRAINER_QUEUES")
    with testing.separate_tasks():
        yield props
    for name in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
        del sys.modules[name]


def test_the_backstop_run_drains_the_example_apps_queue(example_function, conn, capsys):
    module, _, name = example_function["Handler"].rpartition(".")
    handler = getattr(importlib.import_module(module), name)
    [schedule] = example_function["Events"].values()
    event = json.loads(schedule["Properties"]["Input"])  # what the backstop sends
    for n in range(3):
        enqueue(conn, "email", {"to": f"user{n}@example.com"})
    enqueue(conn, "email", {}, max_attempts=1)  # no address: the task raises
    result = handler(event, FakeContext(120))
    assert (result["trigger"], result["claimed"], result["done"], result["failed"]) == (
        "cron", 4, 3, 1)
    assert (result["next"], result["next_due"]) == ("none", None)
    assert count(conn, "status = 'done'") == 3
    [error] = conn.execute("SELECT last_error FROM jobs WHERE status = 'failed'").fetchone()
    assert error.startswith("KeyError")
    assert settled_sessions(conn) == 0
    metric = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "_aws" in line]
    assert [(m["done"], m["failed"]) for m in metric] == [(3, 1)]
