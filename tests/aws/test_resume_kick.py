"""A resume kicks the drainer function when --kick (DRAINER_KICK_FUNCTION) names it:
`drainer resume` and the dashboard's Resume, after the resume committed, only when
the queue was paused, and never failing the resume. The command runs in this
process, so that the Stubber answers its invoke."""

import json

import psycopg
import pytest
import uvicorn
from starlette.testclient import TestClient

import drainer
from drainer.aws import events
from drainer.storage import pauses
from tests.aws.helpers import FUNCTION
from tests.commands.test_bad_input import in_process
from tests.ui.conftest import TOKEN
from tests.ui.test_routes import csrf_of


def is_paused(conn: psycopg.Connection, queue: str) -> bool:
    return queue in [p.queue for p in pauses.paused(conn)]


def resume(db_url: str, queue: str, *args: str) -> tuple[int, dict, str]:
    code, out, err = in_process("resume", queue, "--database-url", db_url, *args)
    return code, json.loads(out), err


def test_a_resume_kicks_the_function_once_it_has_committed(conn, db_url, invokes):
    pauses.pause(conn, "mail")
    seen = []
    invokes.on_call = lambda: seen.append(is_paused(conn, "mail"))  # another session's view
    invokes.expect(events.kick("mail"), function=FUNCTION)
    code, out, _ = resume(db_url, "mail", "--kick", FUNCTION)
    assert (code, out) == (0, {"queue": "mail", "paused": False, "changed": True})
    assert invokes.events() == [events.kick("mail")]
    assert seen == [False]  # at the moment of the call, the queue was resumed
    invokes.stubber.assert_no_pending_responses()


def test_a_queue_that_was_not_paused_kicks_nothing(conn, db_url, invokes):
    code, out, err = resume(db_url, "mail", "--kick", FUNCTION)
    assert (code, out["changed"]) == (0, False) and "was not paused" in err
    assert invokes.sent == [] and "kick" not in err  # (an unexpected call is only logged)


def test_a_failed_kick_is_logged_once_and_the_queue_stays_resumed(conn, db_url, invokes):
    pauses.pause(conn, "mail")
    invokes.fail_next()
    code, out, err = resume(db_url, "mail", "--kick", FUNCTION)
    assert (code, out["changed"]) == (0, True) and not is_paused(conn, "mail")
    assert "kick of drainer failed (TooManyRequestsException" in err and "backstop" in err
    assert "sending it again" not in err  # the process exits: no retry is promised
    assert len(invokes.sent) == 1


def test_the_function_may_come_from_the_environment(conn, db_url, invokes, monkeypatch):
    monkeypatch.setenv("DRAINER_KICK_FUNCTION", FUNCTION)
    pauses.pause(conn, "mail")
    invokes.expect(events.kick("mail"), function=FUNCTION)
    assert resume(db_url, "mail")[:2] == (0, {"queue": "mail", "paused": False,
                                              "changed": True})
    assert invokes.events() == [events.kick("mail")]


@pytest.fixture
def dashboard(db_url, monkeypatch) -> TestClient:
    """`drainer ui --kick drainer` run in this process, its app kept instead of served,
    and a client that visited its URL."""
    apps = []

    def keep(server: uvicorn.Server, sockets: list) -> None:
        apps.append(server.config.app)
        for sock in sockets:
            sock.close()

    monkeypatch.setattr(uvicorn.Server, "run", keep)
    monkeypatch.setenv("DRAINER_UI_TOKEN", TOKEN)
    code, _, err = in_process("ui", "--port", "0", "--database-url", db_url, "--kick", FUNCTION)
    assert code == 0 and len(apps) == 1, err
    client = TestClient(apps[0], follow_redirects=False)
    assert client.get(f"/?token={TOKEN}").status_code == 303
    return client


def test_the_dashboards_resume_kicks_the_function(conn, dashboard, invokes, caplog):
    drainer.enqueue(conn, "mail", {})  # the queues page shows a queue that has jobs
    seen = []
    invokes.on_call = lambda: seen.append(is_paused(conn, "mail"))
    with dashboard:
        csrf = csrf_of(dashboard.get("/").text)
        for action, queue in (("pause", "mail"), ("resume", "sms")):  # sms: not paused
            answer = dashboard.post(f"/queues/{action}", data={"csrf": csrf, "queue": queue})
            assert answer.status_code == 303
        assert invokes.sent == [] and "kick" not in caplog.text  # neither kicks
        invokes.expect(events.kick("mail"), function=FUNCTION)
        answer = dashboard.post("/queues/resume", data={"csrf": csrf, "queue": "mail"})
        assert answer.status_code == 303
    assert invokes.events() == [events.kick("mail")] and seen == [False]
    invokes.stubber.assert_no_pending_responses()
