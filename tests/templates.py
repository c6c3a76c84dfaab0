"""The SAM templates, infra/template.yaml and the example app's, read offline: their
functions, the code `sam build` would package, a handler resolved as the Lambda
runtime resolves it, and the translation CloudFormation makes on deploy. Shared by
tests/test_infra.py, tests/test_example_app.py and the AWS tests."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from samtranslator.translator.transform import transform

from tests.helpers import ROOT

TEMPLATE = ROOT / "infra" / "template.yaml"
EXAMPLE = ROOT / "examples" / "aws-app"
EXAMPLE_TEMPLATE = EXAMPLE / "template.yaml"

# What `sam build` (aws-lambda-builders' Python pip workflow) leaves out when it
# copies a function's CodeUri directory into the artifact, matched against every
# file and directory name with shutil.ignore_patterns, as it does. Everything else
# there is packaged, and requirements.txt's dependencies are installed beside it.
SAM_EXCLUDES = (
    ".aws-sam", ".chalice", ".git", ".gitignore", "*.pyc", "__pycache__", "*.so", ".Python",
    "*.egg-info", "*.egg", "pip-log.txt", "pip-delete-this-directory.txt", "htmlcov", ".tox",
    ".nox", ".coverage", ".cache", ".pytest_cache", ".python-version", ".mypy_cache",
    ".dmypy.json", ".pyre", ".env", ".venv", "venv", "venv.bak", "env.bak", "ENV", "env",
    ".vscode", ".idea",
)


class NoNetwork:
    """The managed-policy map: bundled with the translator; never fetched from IAM."""

    def load(self) -> dict:
        raise AssertionError("the translator wanted to list IAM policies")


def functions(template: dict) -> dict[str, dict]:
    return {name: r["Properties"] for name, r in template["Resources"].items()
            if r["Type"] == "AWS::Serverless::Function"}


def the_function(template: dict) -> dict:
    """The properties of the template's one function."""
    [props] = functions(template).values()
    return props


def artifact_input(code: Path) -> set[str]:
    """The files `sam build` copies from the CodeUri directory `code` into the
    artifact, as paths relative to it (SAM_EXCLUDES left out, links followed)."""
    ignore = shutil.ignore_patterns(*SAM_EXCLUDES)
    files = set()
    for directory, dirs, names in os.walk(code, followlinks=True):
        skip = ignore(directory, [*dirs, *names])
        dirs[:] = [d for d in dirs if d not in skip]
        files |= {Path(directory, n).relative_to(code).as_posix() for n in names
                  if n not in skip}
    return files


def code_dir(template: Path, props: dict) -> Path:
    """The directory a function's CodeUri names, relative to its template."""
    return (template.parent / props["CodeUri"]).resolve()


def imports_in(code: Path, handler: str) -> subprocess.CompletedProcess:
    """Resolve `handler` as the Lambda runtime does, with `code` as the task root
    (first on sys.path) and the interpreter's installed packages after it: the
    module is `a.b` for `a/b` or `a.b`, the function the part after the last dot.
    Isolated (-I): neither this checkout nor PYTHONPATH is on the path."""
    module, _, function = handler.rpartition(".")
    check = (f"import importlib, sys; sys.path.insert(0, {str(code)!r}); "
             f"m = importlib.import_module({module.replace('/', '.')!r}); "
             f"assert callable(m.{function}), 'not callable'")
    return subprocess.run([sys.executable, "-I", "-c", check], cwd=code, capture_output=True,
                          text=True)


def translated(sam: dict, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The CloudFormation `sam deploy` would make of the template, offline."""
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # pseudo parameters, offline
    monkeypatch.delenv("AWS_PROFILE", raising=False)  # no profile or config of the machine's
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    for props in functions(sam).values():  # what `sam package` does to a local CodeUri
        props["CodeUri"] = "s3://drainer-artifacts/drainer.zip"
    return transform(sam, {"Tasks": "myapp.tasks"}, NoNetwork())
