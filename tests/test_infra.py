"""infra/template.yaml, validated offline: translated by aws-sam-translator (as
CloudFormation does on deploy), the result linted by cfn-lint (which does not
look inside SAM resources itself), and every handler it names importable."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cfnlint.api import ManualArgs, lint
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "infra" / "template.yaml"
SUSPEND_AFTER_MINUTES = 10  # the seed: polling more often keeps the compute awake


class NoNetwork:
    """The managed-policy map: bundled with the translator; never fetched from IAM."""

    def load(self) -> dict:
        raise AssertionError("the translator wanted to list IAM policies")


@pytest.fixture
def sam() -> dict:
    return yaml_parse(TEMPLATE.read_text())


def functions(template: dict) -> dict[str, dict]:
    return {name: r["Properties"] for name, r in template["Resources"].items()
            if r["Type"] == "AWS::Serverless::Function"}


def translated(sam: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # pseudo parameters, offline
    monkeypatch.delenv("AWS_PROFILE", raising=False)  # no profile or config of the machine's
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    for props in functions(sam).values():  # what `sam package` does to a local CodeUri
        props["CodeUri"] = "s3://drainer-artifacts/drainer.zip"
    return transform(sam, {"Tasks": "myapp.tasks"}, NoNetwork())


def test_the_template_translates_and_lints_clean(sam, monkeypatch):
    cfn = translated(sam, monkeypatch)
    matches = lint(json.dumps(cfn), config=ManualArgs(regions=["us-east-1"]))
    assert [str(m) for m in matches] == []
    types = {r["Type"] for r in cfn["Resources"].values()}
    assert {"AWS::Lambda::Function", "AWS::Lambda::Alias", "AWS::Lambda::EventInvokeConfig",
            "AWS::Scheduler::Schedule", "AWS::Scheduler::ScheduleGroup",
            "AWS::IAM::ManagedPolicy"} <= types


def test_every_handler_it_names_imports(sam):
    for props in functions(sam).values():
        module, _, function = props["Handler"].rpartition(".")
        code = (TEMPLATE.parent / props["CodeUri"]).resolve()
        assert (code / f"{module}.py").is_file()
        # As the Lambda runtime does: the package root on sys.path, `a/b` as `a.b`.
        check = (f"import importlib; m = importlib.import_module({module.replace('/', '.')!r}); "
                 f"assert callable(m.{function})")
        proc = subprocess.run([sys.executable, "-c", check], cwd=code, capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr


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
    [event] = props["Events"].values()
    assert event["Type"] == "ScheduleV2"
    assert json.loads(event["Properties"]["Input"]) == {"source": "drainer.cron"}


def test_every_variable_it_sets_is_one_drainer_reads(sam):
    [props] = functions(sam).values()
    source = "\n".join(p.read_text() for p in (ROOT / "drainer").rglob("*.py"))
    for name in props["Environment"]["Variables"]:
        assert f'"{name}"' in source, f"{name} is set by the template but never read"


def test_the_package_requirements_are_the_projects_dependencies():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert [line for line in lines if line and not line.startswith("#")] == project[
        "dependencies"]
