"""The code's shape, kept: rooms small enough to hold in one's head. A module of
drainer/ stays within 600 lines, a class within 250, a statement file within 500
(the generated claims too: one file per family of claims), and drainer.testing uses
no private name of the engine or run."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "drainer"
MAX_MODULE, MAX_CLASS, MAX_SQL = 600, 250, 500


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def too_long_modules(package: Path) -> list[str]:
    return [f"{p.relative_to(package)}: {lines(p)} lines" for p in sorted(package.rglob("*.py"))
            if lines(p) > MAX_MODULE]


def too_long_classes(package: Path) -> list[str]:
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS:
                    found.append(f"{path.relative_to(package)}: class {node.name}, {size} lines")
    return found


def too_long_statement_files(package: Path) -> list[str]:
    return [f"{p.relative_to(package)}: {lines(p)} lines" for p in sorted(package.rglob("*.sql"))
            if lines(p) > MAX_SQL]


def private_imports(path: Path, modules: tuple[str, ...]) -> list[str]:
    """`from M import _x` or `M._x` for M among `modules` (their last part)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] in modules:
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_")]
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_")
              and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
              and node.value.id in modules):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_class_or_statement_file_outgrows_its_room():
    assert too_long_modules(PACKAGE) == []
    assert too_long_classes(PACKAGE) == []
    assert too_long_statement_files(PACKAGE) == []


def test_testing_uses_no_private_name_of_the_drain():
    assert private_imports(PACKAGE / "testing.py",
                           ("run", "batch", "drain", "session", "runners", "queue")) == []


@pytest.mark.parametrize("check", ["module", "class", "sql", "private"])
def test_each_check_finds_what_it_is_for(tmp_path, check):
    """Each check above finds a room grown too big, so it cannot pass by looking at
    nothing."""
    if check == "module":
        (tmp_path / "big.py").write_text("x = 1\n" * (MAX_MODULE + 1))
        assert too_long_modules(tmp_path) == [f"big.py: {MAX_MODULE + 1} lines"]
    elif check == "class":
        body = "    x = 1\n" * MAX_CLASS
        (tmp_path / "c.py").write_text(f"class Big:\n{body}")
        assert too_long_classes(tmp_path) == [f"c.py: class Big, {MAX_CLASS + 1} lines"]
    elif check == "sql":
        (tmp_path / "q.sql").write_text("SELECT 1;\n" * (MAX_SQL + 1))
        (tmp_path / "q.generated.sql").write_text("SELECT 1;\n" * MAX_SQL)
        assert too_long_statement_files(tmp_path) == [f"q.sql: {MAX_SQL + 1} lines"]
    else:
        (tmp_path / "t.py").write_text("from .run import _steps\nfrom . import batch\n"
                                       "batch._spawn()\n")
        assert private_imports(tmp_path / "t.py", ("run", "batch")) == [
            "from run import _steps", "batch._spawn"]
