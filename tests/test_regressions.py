"""What a refactor could silently change: async handlers in shapes `@task` cannot
see, a DATABASE_URL libpq cannot read, a setting's message, users' triggers."""

import functools
from datetime import timedelta

import pytest

import drainer
from drainer import testing
from drainer.aws.settings import Settings
from drainer.errors import ConfigError
from drainer.run import Options, drain
from tests.helpers import clean_env, run_cli


def _status(conn, job_id):
    return conn.execute("SELECT status, attempts FROM jobs WHERE id = %s", [job_id]).fetchone()


async def _async_handler(job):
    _async_handler.ran = True


_async_handler.ran = False


def test_an_async_handler_given_to_drain_is_not_marked_done_unrun(conn):
    """`@task` refuses `async def`, but drain() takes handlers as a dict: called on a
    thread, it would only make a coroutine, and the job must not be marked done."""
    job_id = drainer.enqueue(conn, "q", {})
    _async_handler.ran = False
    try:
        drain(conn, {"q": _async_handler}, Options(queues=["q"]))
    except ConfigError:
        return  # refused up front: fine
    assert _async_handler.ran or _status(conn, job_id)[0] != "done", (
        "the job is 'done' though its handler never ran")


class _AsyncCallable:
    ran = False

    async def __call__(self, job):
        type(self).ran = True


def _sync_decorated(fn):
    @functools.wraps(fn)  # a common retry/metrics decorator: sync wrapper, coroutine out
    def wrapper(job):
        return fn(job)

    return wrapper


async def _async_gen(job):
    _async_gen.ran = True
    yield


_async_gen.ran = False


@pytest.mark.parametrize("make", [
    lambda: _async_gen,
    lambda: _AsyncCallable(),
    lambda: _sync_decorated(_async_handler),
], ids=["async-generator", "async-__call__", "wrapped-async-def"])
def test_an_async_task_in_another_shape_is_refused_or_not_done_unrun(conn, make):
    """inspect.iscoroutinefunction misses async generators, objects with an async
    __call__ and `async def` behind a functools.wraps decorator: @task may register
    them, but the drain must not mark their jobs done without running them."""
    handler = make()
    _async_handler.ran = _async_gen.ran = _AsyncCallable.ran = False
    job_id = drainer.enqueue(conn, "q", {})
    with testing.separate_tasks():
        try:
            drainer.task("q")(handler)
        except ConfigError:
            return  # refused: fine
        drain(conn, {"q": handler}, Options(queues=["q"]))
    ran = _async_handler.ran or _async_gen.ran or _AsyncCallable.ran
    assert ran or _status(conn, job_id)[0] != "done", (
        "the job is 'done' though its handler never ran")


def test_db_survives_a_database_url_that_is_not_utf8(tmp_path):
    """`db` reads DATABASE_URL only to decide on its note: a URL libpq cannot read
    (a byte that is not UTF-8) must not end `drainer db stop` in an unexpected error."""
    proc = run_cli("db", "stop", cwd=tmp_path,
                   env=clean_env(DATABASE_URL="postgresql://u:p\udcff@db.example/app"))
    assert "unexpected error" not in proc.stderr, proc.stderr
    assert proc.returncode != 1


def test_statement_timeout_message_is_unchanged(monkeypatch):
    """The function's settings say what they refuse in the words they always used."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@h/d")
    monkeypatch.setenv("DRAINER_STATEMENT_TIMEOUT", "0")
    with pytest.raises(ConfigError) as raised:
        Settings.from_env()
    assert str(raised.value) == ("DRAINER_STATEMENT_TIMEOUT='0': '0' must be a number of "
                                 "seconds above 0 (at most a century)")


def test_a_heartbeat_does_not_fire_a_users_status_trigger(conn):
    """A heartbeat sets locked_until only: a user's `AFTER UPDATE OF status` trigger
    (an audit log of status changes) must not fire every lease/3."""
    conn.execute("""
        CREATE TABLE status_log (job_id bigint, old text, new text);
        CREATE FUNCTION log_status() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO status_log VALUES (NEW.id, OLD.status, NEW.status); RETURN NULL; END $$;
        CREATE TRIGGER log_status AFTER UPDATE OF status ON jobs
        FOR EACH ROW EXECUTE FUNCTION log_status();""")
    drainer.enqueue(conn, "q", {})
    [job] = drainer.claim(conn, ["q"], 1, timedelta(minutes=5))
    conn.execute("DELETE FROM status_log")
    assert drainer.extend(conn, [job], timedelta(minutes=5)) == {job.id}
    assert conn.execute("SELECT count(*) FROM status_log").fetchone()[0] == 0
