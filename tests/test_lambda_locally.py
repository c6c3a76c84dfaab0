"""The README's "Try the function locally", run as it is written: its script and its
shell lines, in a tutorial-like project (src/myapp/tasks.py), against the embedded
database of that directory."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT, clean_env

SECTION = "#### Try the function locally"

TASKS = """
import drainer

@drainer.task("email")
def send_email(job):
    print("sending to", job.payload["to"])
"""


def blocks(language: str) -> list[str]:
    """The `language` code blocks of the README's section."""
    text = (ROOT / "README.md").read_text()
    section = re.split(r"\n#{2,4} ", text.split(SECTION, 1)[1], maxsplit=1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


@pytest.fixture
def project() -> Iterator[Path]:
    """A project directory with the tutorial's layout. Not under pytest's tmp_path: the
    embedded server may run as another user, who must reach its data directory."""
    path = Path(tempfile.mkdtemp(prefix="drainer-lambda-"))
    path.chmod(0o755)
    (path / "src" / "myapp").mkdir(parents=True)
    (path / "src" / "myapp" / "__init__.py").write_text("")
    (path / "src" / "myapp" / "tasks.py").write_text(textwrap.dedent(TASKS))
    # `python` and `drainer` as the tutorial's virtualenv has them: drainer importable
    # whatever PYTHONPATH the command sets (this checkout's, as if installed).
    bin_dir = path / "bin"
    bin_dir.mkdir()
    installed = f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{ROOT}" exec {sys.executable}'
    for name, command in (("python", installed), ("drainer", f"{installed} -m drainer")):
        (bin_dir / name).write_text(f'#!/bin/sh\n{command} "$@"\n')
        (bin_dir / name).chmod(0o755)
    yield path
    subprocess.run([sys.executable, "-m", "drainer", "db", "stop"], cwd=path, env=clean_env(),
                   capture_output=True, timeout=120)
    shutil.rmtree(path, ignore_errors=True)


def test_the_readme_runs_the_lambda_handler_locally(project):
    [script] = blocks("python")
    [shell] = blocks("sh")
    (project / "try_function.py").write_text(script)
    env = clean_env(PATH=os.pathsep.join([str(project / "bin"), os.environ["PATH"]]))
    del env["PYTHONPATH"]  # the app comes from src/ only, drainer as installed
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert "sending to ada@example.com" in lines
    returned = json.loads(lines[-1])
    assert (returned["done"], returned["trigger"], returned["next"]) == (1, "cron", "none")
    logged = [json.loads(line) for line in lines[:-1] if line.startswith("{")]
    assert any(entry.get("event") == "start" for entry in logged)
