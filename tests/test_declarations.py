"""Task declarations are checked where they are made: a queue has one handler, so a
second, different function for it is a ConfigError naming both; the same function
registered again (its module executed anew, as Django's autoreload or pytest's
importlib mode do) replaces it quietly."""

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import drainer
from drainer import schedules, tasks, testing
from tests.helpers import clean_env, run_cli

MODULE = '''
import drainer

@drainer.task("reports", cron="0 3 * * *")
def build(job):
    return "{version}"
'''


def execute(path: Path, name: str) -> ModuleType:
    """Run the module's file under `name`, afresh each time (pytest's importlib mode,
    a reloader)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_second_function_for_a_queue_is_refused_naming_both():
    def first(job):
        return "first"

    def second(job):
        return "second"

    with testing.separate_tasks():
        drainer.task("email")(first)
        with pytest.raises(drainer.ConfigError) as info:
            drainer.task("email", cron="@daily")(second)
        here = "tests.test_declarations.test_a_second_function_for_a_queue_is_refused_naming_both"
        assert f"{here}.<locals>.first" in str(info.value)
        assert f"{here}.<locals>.second" in str(info.value)
        assert tasks.registered()["email"].fn is first  # the first one still handles it
        assert schedules.declared() == {}  # the refused declaration left nothing behind


def test_the_same_function_registered_again_replaces_it_quietly(tmp_path):
    path = tmp_path / "reloaded.py"
    with testing.separate_tasks():
        path.write_text(MODULE.format(version="one"))
        execute(path, "reloaded")
        path.write_text(MODULE.format(version="two"))  # edited, then reloaded
        again = execute(path, "reloaded")
        assert tasks.registered()["reports"].fn is again.build.fn
        assert tasks.registered()["reports"](None) == "two"
        assert list(schedules.declared()) == ["reports"]
        # The same code under another module name is another function.
        with pytest.raises(drainer.ConfigError, match="elsewhere.build.*reloaded.build"):
            execute(path, "elsewhere")


def test_a_drain_whose_task_modules_share_a_queue_exits_2(tmp_path, db_url):
    for name in ("billing", "mailing"):
        (tmp_path / f"{name}.py").write_text(
            f"import drainer\n\n\n@drainer.task('email')\ndef send(job):\n    return {name!r}\n")
    result = run_cli("drain", "--database-url", db_url, "--tasks", "billing,mailing",
                     cwd=tmp_path, env=clean_env())
    assert result.returncode == 2, result.stderr
    assert "mailing.send: queue 'email' already has a task, billing.send" in result.stderr
