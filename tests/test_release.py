"""What a release is made of, read from the checkout: one version (drainer.__version__,
which the build and `drainer --version` read), the changelog's entry for it with
notes for every migration, the licence, and install lines that work while the name is
not on PyPI. tests/test_wheel.py checks the built artifacts themselves."""

import re
import tomllib

import pytest

import drainer
from drainer.storage.sql import MIGRATIONS
from tests.helpers import ROOT, run_cli

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CHANGELOG = (ROOT / "CHANGELOG.md").read_text() if (ROOT / "CHANGELOG.md").exists() else ""
# Each `pip install` command in the user guide and the examples.
DOCS = [ROOT / "README.md", *sorted((ROOT / "examples").rglob("*.md"))]
REQUIREMENTS = sorted((ROOT / "examples").rglob("requirements*.txt"))


def test_the_version_has_one_source():
    """The build reads drainer.__version__ (no second copy in pyproject.toml), and so
    does `drainer --version`."""
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "drainer.__version__"}
    proc = run_cli("--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"drainer {drainer.__version__}")


def test_the_changelog_opens_with_the_current_version():
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\S+)$", CHANGELOG, re.M)
    assert releases, "CHANGELOG.md has no release entry"
    assert releases[0][0] == drainer.__version__
    assert re.search(r"^## \[Unreleased\]$", CHANGELOG, re.M)


def test_the_changelog_has_upgrade_notes_for_every_migration():
    """One row per migration in the upgrade notes' table: a migration added without
    its notes fails here."""
    rows = [int(n) for n in re.findall(r"^\| (\d+) \|", CHANGELOG, re.M)]
    assert rows == sorted(MIGRATIONS)


def test_the_licence_is_mit():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "the drainer authors" in text
    assert PYPROJECT["project"]["license"] == "MIT"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]


def pip_installs(text: str) -> list[str]:
    """The arguments of each `pip install` command in `text`."""
    return [m.group(1) for m in re.finditer(r"pip install ([^\n`;&|)#]*)", text)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_install_lines_name_a_checkout_or_a_built_wheel(doc):
    """drainer is not on PyPI yet: a bare `drainer` (`pip install drainer`,
    `'drainer[otel]'`) cannot install; `-e .`, `.[extra]`, a path or a wheel can."""
    for args in pip_installs(doc.read_text()):
        for arg in args.split():
            name = arg.strip("'\"")
            assert not re.fullmatch(r"drainer(\[[\w,]+\])?([<>=!~].*)?", name), (
                f"{doc.name}: `pip install {args.strip()}` names drainer on PyPI")


@pytest.mark.parametrize("path", REQUIREMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_requirements_install_a_built_wheel(path):
    lines = [line.strip() for line in path.read_text().splitlines()]
    [drainer_line] = [line for line in lines if line.startswith("drainer")]
    assert re.fullmatch(r"drainer @ file:///\S+/drainer-[\d.]+-py3-none-any\.whl", drainer_line)


def test_the_wheels_named_are_of_this_version():
    """A wheel's file name in the docs and examples is this version's: bumping the
    version without them fails here."""
    named = set()
    for path in [*DOCS, *REQUIREMENTS, ROOT / "docs" / "releasing.md"]:
        named |= set(re.findall(r"drainer-(\d[\w.]*?)(?:-py3-none-any\.whl|\.tar\.gz)",
                                path.read_text()))
    assert named == {drainer.__version__}
