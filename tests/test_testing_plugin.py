"""The drainer.testing pytest plugin as a user runs it: a test file of theirs, in a
pytest process of its own (pytester), that enables the plugin in its conftest.py."""

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = '''
import pytest

import drainer
from drainer.testing import assert_enqueued, drain_now, enqueued, separate_tasks


@pytest.fixture(autouse=True)
def own_tasks():
    with separate_tasks():
        yield


def test_the_welcome_email_is_sent(drainer_conn):
    sent = []
    drainer.task("email")(lambda job: sent.append(job.payload["to"]))
    with drainer_conn.transaction():  # the app's transaction
        drainer.enqueue(drainer_conn, "email", {"to": "ada@example.com"})
        assert_enqueued(drainer_conn, "email", payload={"to": "ada@example.com"})
        summary = drain_now(drainer_conn, in_transaction=True)
    assert (summary.done, sent) == (1, ["ada@example.com"])
    assert enqueued(drainer_conn, "email") == []


def test_each_test_has_a_database_of_its_own(drainer_db, drainer_conn):
    assert enqueued(drainer_conn) == []
    assert drainer_conn.info.dbname in drainer_db


def test_the_wrong_address(drainer_conn):
    drainer.enqueue(drainer_conn, "email", {"to": "bob@example.com"})
    assert_enqueued(drainer_conn, "email", payload={"to": "ada@example.com"})
'''


@pytest.fixture
def user_project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest('pytest_plugins = ["drainer.testing"]\n')
    pytester.makepyfile(test_user=USER_TESTS)
    return pytester


def check_outcome(result: pytest.RunResult) -> None:
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*AssertionError: expected a job queued in 'email' with payload="
        "{'to': 'ada@example.com'}, found 0",
        "*queued in 'email' (1):",
        "*  id 1: payload={'to': 'bob@example.com'}",
    ])
    # The failure points at the user's line, not into the helper's code.
    result.stdout.fnmatch_lines([
        ">       assert_enqueued(drainer_conn, \"email\", payload={\"to\": \"ada@example.com\"})",
        "E       AssertionError: expected a job queued in 'email'*"])
    shown = result.stdout.str()
    assert "raise AssertionError" not in shown and "drainer/testing.py" not in shown


def databases(server) -> set[str]:
    with server.admin() as admin:
        return {name for (name,) in admin.execute("SELECT datname FROM pg_database")}


def test_a_users_tests_on_a_server_they_name(user_project, server, monkeypatch):
    monkeypatch.setenv("DRAINER_TEST_DATABASE_URL", server.admin_url)
    before = databases(server)
    check_outcome(user_project.runpytest_subprocess())
    assert databases(server) == before  # its template and databases dropped


@pytest.fixture
def tmpdir_for_servers() -> Iterator[Path]:
    """A TMPDIR the server's user can reach (pytest's tmp_path is its owner's alone,
    and as root the cluster runs as another user)."""
    path = Path(tempfile.mkdtemp(prefix="drainer-plugin-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_users_tests_on_an_embedded_server_stopped_at_the_end(user_project, monkeypatch,
                                                                 tmpdir_for_servers):
    for name in ("DRAINER_TEST_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmpdir_for_servers))
    check_outcome(user_project.runpytest_subprocess())
    assert os.listdir(tmpdir_for_servers) == []  # the cluster's directory removed


GIVE_IT_ONE = ["*Give it one: DRAINER_TEST_DATABASE_URL (else DATABASE_URL)*"
               "DRAINER_TEST_PG_BIN*(pip install 'drainer[[]embedded]')"]


def test_without_a_server_the_session_fails_saying_why(user_project, monkeypatch):
    monkeypatch.setenv("DRAINER_TEST_DATABASE_URL",
                       "postgresql://nobody:s3cret@127.0.0.1:1/nowhere")
    result = user_project.runpytest_subprocess()
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([
        "*drainer.testing: no PostgreSQL for the tests (the server "
        "DRAINER_TEST_DATABASE_URL names): *", *GIVE_IT_ONE])
    assert "s3cret" not in result.stdout.str()
    assert "During handling" not in result.stdout.str()  # the message, not a chain of errors


def test_a_bin_directory_with_no_server_is_named_with_what_to_set(user_project, monkeypatch,
                                                                  tmp_path):
    for name in ("DRAINER_TEST_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DRAINER_TEST_PG_BIN", str(tmp_path / "no-such-bin"))
    result = user_project.runpytest_subprocess()
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([
        "*no PostgreSQL for the tests (a throwaway server from DRAINER_TEST_PG_BIN's bin "
        "directory): *no-such-bin*", *GIVE_IT_ONE])
