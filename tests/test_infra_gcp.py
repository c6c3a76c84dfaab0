"""infra/gcp/, checked offline: the script run with a stand-in `gcloud` that records
its calls, the entry points its commands (and the README's) name loaded by the
Functions Framework with their trigger's signature, and every variable they set
one that drainer reads and accepts."""

import json
import os
import re
import shlex
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import functions_framework
import pytest
from cronsim import CronSim
from functions_framework import _function_registry

from drainer import settings
from drainer.gcp import events
from drainer.gcp.settings import Settings
from tests.helpers import ROOT

RECIPE = ROOT / "infra" / "gcp"
SCRIPT, README = RECIPE / "deploy.sh", RECIPE / "README.md"
SUSPEND_AFTER_MINUTES = 10  # a backstop more often than this keeps the database awake
SIGNATURES = {"--trigger-http": "http", "--trigger-topic": "cloudevent"}
# A stand-in for gcloud: each call's arguments as a JSON line; nothing exists yet
# (every describe fails) but the project, whose number it prints.
GCLOUD = """#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["GCLOUD_LOG"], "a") as log:
    log.write(json.dumps({"args": args, "stdin": "" if sys.stdin.isatty() else
                          sys.stdin.read() if "--data-file=-" in args else ""}) + "\\n")
if "describe" in args:
    if "projects" in args:
        print("123456789")
        sys.exit(0)
    sys.exit(1)
"""


def deploys(text: str) -> list[list[str]]:
    """The `gcloud functions deploy` commands of a text, as argument lists."""
    joined = text.replace("\\\n", " ")
    return [shlex.split(line[line.index("functions deploy"):])
            for line in joined.splitlines() if "functions deploy" in line]


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def env_vars(value: str) -> dict[str, str]:
    """--set-env-vars' value, with gcloud's ^DELIM^ escape."""
    delimiter = ","
    if match := re.match(r"\^(.)\^", value):
        delimiter, value = match[1], value[match.end():]
    return dict(pair.split("=", 1) for pair in value.split(delimiter))


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """What the script needs of this checkout, and a task package myapp/."""
    root = tmp_path / "checkout"
    for name in ("drainer", "handlers", "infra"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("requirements.txt", "pyproject.toml"):
        shutil.copy2(ROOT / name, root)
    (root / "myapp").mkdir()
    (root / "myapp" / "__init__.py").write_text("")
    (root / "myapp" / "tasks.py").write_text("from drainer import task\n")
    return root


def run_script(checkout: Path, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess,
                                                                   list[dict]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "gcloud").write_text(GCLOUD)
    (bin_dir / "gcloud").chmod(0o755)
    log = tmp_path / "gcloud.log"
    proc = subprocess.run(
        ["bash", str(checkout / "infra" / "gcp" / "deploy.sh")], capture_output=True,
        text=True, stdin=subprocess.DEVNULL,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GCLOUD_LOG": str(log),
             **env})
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def test_the_script_stages_the_code_and_deploys_it_with_its_resources(checkout, tmp_path,
                                                                     monkeypatch):
    proc, calls = run_script(checkout, tmp_path, PROJECT="proj", REGION="europe-west1",
                             TASKS="myapp.tasks", DATABASE_URL="postgresql://app@db/app")
    assert proc.returncode == 0, proc.stderr
    staged = checkout / "build" / "gcp"
    assert (staged / "handlers" / "gcp.py").is_file()
    assert (staged / "drainer" / "gcp" / "entry.py").is_file()
    assert (staged / "myapp" / "tasks.py").is_file()
    assert not (staged / "infra").exists()
    requirements = (staged / "requirements.txt").read_text()
    assert "functions-framework" in requirements and "google-cloud-tasks" in requirements
    called = [" ".join(c["args"]) for c in calls]
    for expected in ("secrets create", "tasks queues create", "functions deploy",
                     "functions add-invoker-policy-binding", "scheduler jobs create http"):
        assert any(expected in c for c in called), (expected, called)
    [secret] = [c for c in calls if "create" in c["args"] and "secrets" in c["args"]]
    assert secret["stdin"] == "postgresql://app@db/app"  # never on the command line
    assert not [c for c in calls if "postgresql://app@db/app" in " ".join(c["args"])]
    [deploy] = [c["args"] for c in calls if "deploy" in c["args"]]
    variables = env_vars(option(deploy, "--set-env-vars"))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    configured = Settings.from_env()  # every value accepted, as the function reads it
    assert configured.wakeups is not None
    assert configured.wakeups.url == "https://drainer-123456789.europe-west1.run.app"
    assert configured.timeout == float(option(deploy, "--timeout"))
    [job] = [c["args"] for c in calls if "jobs" in c["args"] and "create" in c["args"]]
    assert option(job, "--uri") == option(job, "--oidc-token-audience") == (
        configured.wakeups.url)
    assert events.parse(option(job, "--message-body").encode()).kind == "cron"
    ticks = CronSim(option(job, "--schedule"), datetime(2026, 3, 3, tzinfo=UTC))
    first = next(ticks)
    assert (next(ticks) - first).total_seconds() / 60 > SUSPEND_AFTER_MINUTES


def test_the_script_names_what_is_missing(checkout, tmp_path):
    proc, calls = run_script(checkout, tmp_path, PROJECT="proj", REGION="europe-west1")
    assert proc.returncode != 0 and "TASKS" in proc.stderr
    assert calls == []


def main_py(text: str, tmp_path: Path) -> Path:
    """The README's main.py for an app of one's own, written out."""
    [code] = re.findall(r"```python\n# main.py\n(.*?)```", text, re.S)
    (tmp_path / "main.py").write_text(code)
    return tmp_path / "main.py"


@pytest.mark.parametrize("path", [SCRIPT, README], ids=lambda p: p.name)
def test_every_entry_point_it_deploys_loads_with_its_trigger_s_signature(path, tmp_path,
                                                                         monkeypatch):
    monkeypatch.delenv("FUNCTION_SIGNATURE_TYPE", raising=False)  # the framework sets it
    text = path.read_text()
    commands = deploys(text)
    assert commands
    for args in commands:
        if "--set-build-env-vars" in args:  # this checkout's
            build = env_vars(option(args, "--set-build-env-vars"))
            source = ROOT / build["GOOGLE_FUNCTION_SOURCE"]
        else:  # an app's own main.py
            source = main_py(text, tmp_path)
        trigger = next((a for a in args if a in SIGNATURES), "--trigger-http")
        entry = option(args, "--entry-point")
        assert functions_framework.create_app(entry, str(source), SIGNATURES[trigger])
        # The type its decorator declares, which wins over the deploy's.
        assert _function_registry.get_func_signature_type(entry, None) == SIGNATURES[trigger]


@pytest.mark.parametrize("path", [SCRIPT, README], ids=lambda p: p.name)
def test_every_variable_it_sets_is_one_drainer_reads(path):
    declared = {s.env for s in vars(settings).values() if isinstance(s, settings.Setting)}
    found = set(re.findall(r"\b(DRAINER_[A-Z_]+)=", path.read_text()))
    assert found and found <= declared, found - declared
