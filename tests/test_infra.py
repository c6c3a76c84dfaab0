"""infra/template.yaml, validated offline: translated by aws-sam-translator (as
CloudFormation does on deploy), the result linted by cfn-lint (which does not
look inside SAM resources itself), every handler it names importable, and its
artifact holding the function's code and nothing else of the checkout."""

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cfnlint.api import ManualArgs, lint
from samtranslator.yaml_helper import yaml_parse

from drainer import settings
from tests.helpers import ROOT
from tests.templates import TEMPLATE, artifact_input, code_dir, functions, imports_in, translated

# Idle minutes before a scale-to-zero database suspends: a backstop that polls more
# often keeps it awake.
SUSPEND_AFTER_MINUTES = 10


@pytest.fixture
def sam() -> dict:
    return yaml_parse(TEMPLATE.read_text())


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of this checkout as someone deploying it has it: drainer/, handlers/,
    infra/, requirements.txt and their task package myapp/, next to what must never
    reach the function: the embedded database under .drainer/, tests/, a .venv/
    and bytecode caches."""
    root = tmp_path / "checkout"
    for name in ("drainer", "handlers", "infra"):
        shutil.copytree(ROOT / name, root / name,
                        ignore=shutil.ignore_patterns("__pycache__", ".aws-sam"))
    shutil.copy2(ROOT / "requirements.txt", root)
    files = {
        "myapp/__init__.py": "",
        "myapp/tasks.py": "from drainer import task\n\n\n@task('email')\ndef send(job):\n"
                          "    pass\n",
        "myapp/__pycache__/tasks.cpython-312.pyc": "",
        ".drainer/pgdata/base/1/1259": "x" * 4096,
        "tests/test_myapp.py": "",
        ".venv/lib/python3.12/site-packages/psycopg/__init__.py": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def stage(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / "infra" / "stage.py"), *args],
                          capture_output=True, text=True)


def test_the_template_translates_and_lints_clean(sam, monkeypatch):
    cfn = translated(sam, monkeypatch)
    matches = lint(json.dumps(cfn), config=ManualArgs(regions=["us-east-1"]))
    assert [str(m) for m in matches] == []
    types = {r["Type"] for r in cfn["Resources"].values()}
    assert {"AWS::Lambda::Function", "AWS::Lambda::Alias", "AWS::Lambda::EventInvokeConfig",
            "AWS::Scheduler::Schedule", "AWS::Scheduler::ScheduleGroup",
            "AWS::IAM::ManagedPolicy"} <= types


def test_every_handler_it_names_imports_from_the_staged_code(sam, checkout):
    proc = stage(checkout, "myapp.tasks")
    assert proc.returncode == 0, proc.stderr
    for props in functions(sam).values():
        code = code_dir(checkout / "infra" / TEMPLATE.name, props)
        module = props["Handler"].rpartition(".")[0]
        assert (code / f"{module}.py").is_file()
        proc = imports_in(code, props["Handler"])
        assert proc.returncode == 0, proc.stderr


def test_the_artifact_holds_the_functions_code_and_nothing_else(sam, checkout):
    """The CodeUri is the staged directory, not the root: `sam build` would copy the
    root's .drainer/ (not among its exclusions), tests/ and all."""
    proc = stage(checkout, "myapp.tasks")
    assert proc.returncode == 0, proc.stderr
    [props] = functions(sam).values()
    code = code_dir(checkout / "infra" / TEMPLATE.name, props)
    assert code == checkout / "build" / "lambda"
    files = artifact_input(code)
    assert {f.split("/")[0] for f in files} == {"drainer", "handlers", "myapp",
                                                "requirements.txt"}
    assert {"drainer/storage/queries/schema.sql", "drainer/aws/lambda_handler.py",
            "handlers/aws_lambda.py", "myapp/tasks.py"} <= files
    assert not [f for f in files if f.startswith((".drainer/", "tests/", ".venv/", "infra/"))]
    assert (code / "requirements.txt").read_text() == (ROOT / "requirements.txt").read_text()


def test_staging_again_replaces_what_it_staged_and_nothing_else(checkout):
    (checkout / "other.py").write_text("")
    assert stage(checkout, "myapp.tasks", "other").returncode == 0
    out = checkout / "build" / "lambda"
    assert (out / "other.py").is_file()
    assert stage(checkout, "myapp.tasks").returncode == 0
    assert not (out / "other.py").exists()  # a module no longer named leaves the artifact
    mine = checkout / "mine"
    (mine / "keep").mkdir(parents=True)
    refused = stage(checkout, "myapp.tasks", "--out", str(mine))
    assert refused.returncode == 2 and "not made by" in refused.stderr
    assert (mine / "keep").is_dir()
    for bad in ("missing.tasks", "../myapp", ".drainer"):
        proc = stage(checkout, bad)
        assert proc.returncode == 2 and bad in proc.stderr, (bad, proc.stderr)


def test_the_function_is_configured_as_the_issue_requires(sam):
    [props] = functions(sam).values()
    params = sam["Parameters"]
    assert props["Runtime"] == "python3.12"
    assert props["EventInvokeConfig"]["MaximumRetryAttempts"] == 0
    assert props["EventInvokeConfig"]["MaximumEventAgeInSeconds"] <= 900
    for name, key in [("FunctionTimeout", "Timeout"), ("MemorySize", "MemorySize")]:
        assert props[key] == {"Ref": name} and name in params
    assert "ReservedConcurrency" in json.dumps(props["ReservedConcurrentExecutions"])
    rate = re.fullmatch(r"rate\((\d+) (minute|hour|day)s?\)", params["BackstopRate"]["Default"])
    minutes = int(rate[1]) * {"minute": 1, "hour": 60, "day": 1440}[rate[2]]
    assert minutes > SUSPEND_AFTER_MINUTES
    width = params["MaxWidth"]  # the cap on runs at once while a backlog lasts
    assert (width["Default"], width["MinValue"]) == (settings.MAX_WIDTH.default, 1)
    assert props["Environment"]["Variables"]["DRAINER_MAX_WIDTH"] == {"Ref": "MaxWidth"}
    [event] = props["Events"].values()
    assert event["Type"] == "ScheduleV2"
    assert json.loads(event["Properties"]["Input"]) == {"source": "drainer.cron"}


def test_every_variable_it_sets_is_one_drainer_reads(sam):
    """Each variable is a setting of drainer.settings, or named in the code as is."""
    [props] = functions(sam).values()
    source = "\n".join(p.read_text() for p in (ROOT / "drainer").rglob("*.py"))
    declared = {s.env for s in vars(settings).values() if isinstance(s, settings.Setting)}
    for name in props["Environment"]["Variables"]:
        assert name in declared or f'"{name}"' in source, (
            f"{name} is set by the template but never read")


def test_the_package_requirements_are_the_projects_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert [line for line in lines if line and not line.startswith("#")] == project[
        "dependencies"]
