"""Every statement drainer sends goes through one gateway (`drainer.storage.sql`, and
the driver adapters under it, `drainer.storage.adapters`): no other module of drainer
calls a cursor's or a connection's execute, nor opens a cursor. And the schema's
features are cached once per connection, whichever path reads them."""

import ast
from pathlib import Path

import psycopg

import drainer
from drainer.storage import schema, sql

PACKAGE = Path(drainer.__file__).parent
GATEWAY = {PACKAGE / "storage" / "sql.py", PACKAGE / "storage" / "adapters.py"}
# What sends a statement (or opens the cursor that would), on a driver's object.
SENDING = {"execute", "executemany", "exec_driver_sql", "cursor", "pipeline"}


def _gateway_names(tree: ast.Module) -> set[str]:
    """The names a module binds to the gateway module (`from .storage import sql`)."""
    return {alias.asname or alias.name
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[-1] in ("", "storage")
            for alias in node.names if alias.name == "sql"}


def stray_calls(source: str) -> list[str]:
    """`receiver.execute(...)` and the like in `source`, but the gateway's own functions
    (`sql.execute`, `sql.pipeline`)."""
    tree = ast.parse(source)
    gateway = _gateway_names(tree)
    return [f"line {node.lineno}: {ast.unparse(node.func)}(...)" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in SENDING
            and not (isinstance(node.func.value, ast.Name) and node.func.value.id in gateway)]


def test_the_scan_finds_a_stray_call_and_lets_the_gateway_be():
    assert stray_calls("conn.cursor().execute('SELECT 1')") == [
        "line 1: conn.cursor().execute(...)", "line 1: conn.cursor(...)"]
    assert stray_calls("import x\nx.execute('SELECT 1')") == ["line 2: x.execute(...)"]
    assert stray_calls("from .storage import sql\nsql.execute(conn, 'SELECT 1')") == []
    assert stray_calls("sql.execute(conn, 'SELECT 1')") == [  # not the gateway's sql
        "line 1: sql.execute(...)"]


def test_no_module_outside_the_gateway_sends_a_statement():
    modules = sorted(set(PACKAGE.rglob("*.py")) - GATEWAY)
    assert len(modules) > 20  # the whole package was scanned
    found = {str(path.relative_to(PACKAGE)): calls for path in modules
             if (calls := stray_calls(path.read_text(encoding="utf-8")))}
    assert found == {}


def test_one_features_cache_for_the_drain_and_enqueue(empty_db_url, db_url):
    # A connection that saw no schema, then migrated from another connection: the
    # enqueue finds the key column anyway (it reads the catalog again when the cached
    # features lack what it uses), and what it read is the connection's features,
    # the drain's functions' too.
    with psycopg.connect(empty_db_url, autocommit=True) as stale, \
            psycopg.connect(empty_db_url, autocommit=True) as other:
        assert not sql.features(stale).key
        schema.migrate(other)
        drainer.enqueue(stale, "q", {}, key="k")
        assert sql.features(stale).key
