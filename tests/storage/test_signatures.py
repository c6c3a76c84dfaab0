"""The signed HTTP requests seen: a signature is new once, then a replay, until its
time has passed; passed ones go with the next one remembered."""

from datetime import timedelta

from drainer.storage import signatures

MINUTE = timedelta(minutes=1)


def test_a_signature_is_new_once_then_a_replay(conn):
    assert signatures.remember(conn, "a" * 64, MINUTE)
    assert not signatures.remember(conn, "a" * 64, MINUTE)
    assert signatures.remember(conn, "b" * 64, MINUTE)


def test_signatures_whose_time_has_passed_go(conn):
    assert signatures.remember(conn, "old", MINUTE)
    conn.execute("UPDATE drainer_signatures SET expires_at = now() - interval '1 second'")
    assert signatures.remember(conn, "new", MINUTE)
    kept = [s for (s,) in conn.execute("SELECT signature FROM drainer_signatures")]
    assert kept == ["new"]
