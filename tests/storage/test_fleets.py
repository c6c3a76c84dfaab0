"""Fleets (drainer.storage.fleets): one row per queue set, changed only by
compare-and-set, whose members join once per ticket, leave, and expire by their
lease; and the share of the database's sessions a fleet keeps to."""

import psycopg

from drainer.db import connect
from drainer.storage import fleets
from drainer.storage.fleets import Fleet, change, fleet_of, read


def test_the_fleet_is_its_queue_set():
    assert fleet_of(["b", "a", "b"]) == fleet_of(["a", "b"]) == "a,b"


def test_a_ticket_adds_one_member_however_often_it_is_delivered(conn):
    _, first = change(conn, "q", lambda f: f.joined("m1", 300))
    assert first is not None and (first.running, first.target) == (1, 1)
    issued: list[str] = []

    def widen(f: Fleet) -> Fleet:
        f, tickets = f.widened(2, 60)
        issued[:] = tickets
        return f

    _, wider = change(conn, "q", widen)
    assert wider is not None and (wider.running, wider.pending, wider.target) == (1, 2, 3)
    seen, joined = change(conn, "q", lambda f: f.joined("m2", 300, issued[0]))
    assert joined is not None and (joined.running, joined.pending) == (2, 1)
    seen, again = change(conn, "q", lambda f: f.joined("m3", 300, issued[0]))  # delivered twice
    assert again is None and issued[0] not in seen.tickets
    assert (read(conn, "q").running, read(conn, "q").peak) == (2, 2)


def test_drains_that_decide_at_once_do_not_each_widen(conn, db_url):
    """Two drains read the fleet at width 1 and both want 2 more; the second's write
    finds the version changed, reads again, and sees the first's members asked for."""
    change(conn, "q", lambda f: f.joined("m1", 300))
    seen_by: list[int] = []

    def widen_to_3(other: psycopg.Connection | None):
        def edit(f: Fleet) -> Fleet | None:
            seen_by.append(f.running + f.pending)
            if other is not None and len(seen_by) == 1:
                change(other, "q", widen_to_3(None))  # the other drain wins the race
            more = 3 - (f.running + f.pending)
            return f.widened(more, 60)[0] if more > 0 else None
        return edit

    with connect(db_url) as other:
        change(conn, "q", widen_to_3(other))
    fleet = read(conn, "q")
    assert (fleet.running + fleet.pending, fleet.target) == (3, 3)
    assert seen_by == [1, 1, 3]  # ours, the other's, ours again: it asked for none


def test_a_member_killed_without_leaving_stops_counting_when_its_lease_ends(conn):
    change(conn, "q", lambda f: f.joined("dead", -1))  # its lease ended already
    change(conn, "q", lambda f: f.joined("alive", 300))
    fleet = read(conn, "q")
    assert set(fleet.members) == {"alive"} and fleet.peak == 1
    _, lapsed = change(conn, "q", lambda f: f.widened(1, -1)[0])
    assert lapsed is not None and read(conn, "q").pending == 0  # a lapsed ticket too


def test_leaving_on_empty_brings_the_target_back_to_zero(conn):
    for member in ("a", "b", "c"):
        change(conn, "q", lambda f, m=member: f.joined(m, 300))
    change(conn, "q", lambda f: f.left("a", empty=False))  # cut by its deadline
    assert (read(conn, "q").running, read(conn, "q").target) == (2, 3)
    change(conn, "q", lambda f: f.left("b", empty=True))
    assert read(conn, "q").target == 1
    change(conn, "q", lambda f: f.left("c", empty=True))
    fleet = read(conn, "q")
    assert (fleet.running, fleet.target, fleet.peak) == (0, 0, 3)
    assert [f.name for f in fleets.fleets(conn)] == ["q"]
