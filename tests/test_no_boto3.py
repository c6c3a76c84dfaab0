"""The command line never imports boto3 nor Google's libraries (a few hundred ms of
start-up each): only drainer.aws and drainer.gcp do, when they first need them. Nor
the dashboard's libraries (Starlette, Jinja2, uvicorn): only `drainer ui` does. A
resume loads drainer.aws only when it kicks the function. A drain of one process
imports neither what `--processes` needs nor what only schedules do."""

import json

from drainer.storage import pauses
from tests.helpers import clean_env, run_cli


def imported(stderr: str) -> set[str]:
    """Top-level packages named by `-X importtime` lines (PYTHONPROFILEIMPORTTIME)."""
    return {line.rsplit("|", 1)[-1].strip().split(".")[0]
            for line in stderr.splitlines() if line.startswith("import time:")}


def test_a_local_drain_imports_no_cloud_library(db_url):
    env = clean_env(PYTHONPROFILEIMPORTTIME="1")
    run_cli("enqueue", "default", "{}", "--database-url", db_url, env=env)
    proc = run_cli("drain", "--database-url", db_url, "--tasks", "behave", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["done"] == 1
    modules = imported(proc.stderr)
    assert {"drainer", "psycopg"} <= modules  # the profile did record imports
    assert not modules & {"boto3", "botocore", "moto"}
    assert not modules & {"starlette", "jinja2", "uvicorn", "anyio", "markupsafe"}
    assert not modules & {"google", "functions_framework", "grpc", "flask", "cloudevents"}
    assert "cronsim" not in modules
    assert "drainer.commands.members" not in proc.stderr


def test_a_resume_without_a_kick_imports_no_cloud_library(conn, db_url):
    pauses.pause(conn, "mail")
    env = clean_env(PYTHONPROFILEIMPORTTIME="1")
    proc = run_cli("resume", "mail", "--database-url", db_url, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["changed"], proc.stderr
    assert "drainer" in imported(proc.stderr)  # the profile did record imports
    assert not imported(proc.stderr) & {"boto3", "botocore"}
    assert "drainer.aws" not in proc.stderr
