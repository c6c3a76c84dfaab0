"""The producer's kick: after the commit, never after a rollback, coalesced, harmless."""

import time
from contextlib import nullcontext

import psycopg
import pytest

from drainer import enqueue
from drainer.aws import events, kick
from drainer.aws.kick import Kicker
from tests.aws.helpers import FUNCTION
from tests.helpers import count, wait_until


def test_the_kick_is_sent_after_the_commit(db_url, conn, invokes):
    seen = []
    invokes.on_call = lambda: seen.append(count(conn))  # another session's view
    invokes.expect(events.kick("email"), function=FUNCTION)
    # Not autocommit, as applications' connections are.
    with psycopg.connect(db_url) as producer, Kicker(FUNCTION).transaction(producer, "email"):
        enqueue(producer, "email", {"to": "a@example.com"})
        assert not invokes.sent  # nothing sent before the commit
    assert seen == [1]  # at the moment of the call, the job was visible
    invokes.stubber.assert_no_pending_responses()


@pytest.mark.parametrize("abort", [RuntimeError("the order failed"), psycopg.Rollback()])
def test_no_kick_after_a_rollback(db_url, conn, invokes, abort):
    expected = pytest.raises(RuntimeError) if isinstance(abort, RuntimeError) else nullcontext()
    with psycopg.connect(db_url, autocommit=True) as producer, expected, \
            Kicker(FUNCTION).transaction(producer, "email"):
        enqueue(producer, "email", {})
        raise abort
    assert count(conn) == 0 and invokes.sent == []


def test_inside_an_open_transaction_it_refuses_rather_than_kick_early(db_url, invokes):
    with psycopg.connect(db_url) as producer:
        producer.execute("SELECT 1")  # a transaction is open now
        with pytest.raises(RuntimeError, match="already in one"), \
                Kicker(FUNCTION).transaction(producer, "email"):
            pass
    assert invokes.sent == []


def test_kicks_are_coalesced_to_one_per_interval_with_one_trailing(invokes):
    for _ in range(2):
        invokes.expect(events.kick("email"), function=FUNCTION)
    kicker = Kicker(FUNCTION, interval=0.3)
    assert kicker.kick("email") is True  # sent at once
    assert [kicker.kick("email"), Kicker(FUNCTION, interval=0.3).kick("email")] == [False, False]
    assert len(invokes.sent) == 1  # folded, the other Kicker of the same function too
    wait_until(lambda: len(invokes.sent) == 2)  # one trailing kick ends the interval
    time.sleep(0.4)
    assert len(invokes.sent) == 2  # only one, for the two folded kicks
    invokes.stubber.assert_no_pending_responses()


def test_a_failed_kick_never_fails_the_producer_and_is_sent_again(db_url, conn, invokes,
                                                                  caplog, monkeypatch):
    monkeypatch.setattr(kick, "RETRY_DELAYS", (0.05,))
    invokes.fail_next()
    invokes.expect(events.kick("email"), function=FUNCTION)
    with psycopg.connect(db_url) as producer, Kicker(FUNCTION).transaction(producer, "email"):
        enqueue(producer, "email", {})
    assert count(conn) == 1  # committed, whatever the kick did
    wait_until(lambda: len(invokes.sent) == 2)
    invokes.stubber.assert_no_pending_responses()
    assert "TooManyRequestsException" in caplog.text and "sending it again" in caplog.text
    assert "backstop" not in caplog.text


def test_a_kick_that_keeps_failing_is_left_to_the_backstop(invokes, caplog, monkeypatch):
    monkeypatch.setattr(kick, "RETRY_DELAYS", (0.01, 0.01))
    for _ in range(3):
        invokes.fail_next()
    Kicker(FUNCTION).kick("email")
    wait_until(lambda: "backstop" in caplog.text)
    assert len(invokes.sent) == 3 and "failed (TooManyRequestsException" in caplog.text
    invokes.stubber.assert_no_pending_responses()
