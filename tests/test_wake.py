"""The after-run decision, by table."""

from datetime import UTC, datetime, timedelta

import pytest

from drainer.run import Summary
from drainer.wake import Next, after_run, ceil_minute, switch_at

NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)
S = timedelta(seconds=1)


def minute(m: int) -> datetime:
    return datetime(2026, 12, 2, 12, m, tzinfo=UTC)


def summary(run_at: datetime | None, lease_end: datetime | None, claimed: int) -> Summary:
    """A drain's summary as `drainer.run.drain` fills it from `storage.admin.due`."""
    due = min((t for t in (run_at, lease_end) if t is not None), default=None)
    return Summary(claimed=claimed, next_due=None if due is None else max(due, NOW),
                   next_run_at=run_at, next_lease_end=lease_end,
                   stopped="deadline" if due == NOW else "empty")


@pytest.mark.parametrize("run_at, lease_end, claimed, depth, remaining, expected", [
    (None, None, 1, 0, 600 * S, Next("none")),
    (NOW, None, 1, 0, 600 * S, Next("continue")),
    (NOW, None, 1, 3, 600 * S, Next("none")),  # at the depth limit the backstop takes over
    (NOW + 20 * S, None, 1, 0, 600 * S, Next("wait", NOW + 20 * S)),
    (NOW + 20 * S, None, 1, 0, 10 * S, Next("wake", minute(1))),
    (NOW + 160 * S, None, 1, 0, 600 * S, Next("wake", minute(4))),
    # Another run's lease end: a wake-up of its own kind, never waited for (a live
    # holder extends or finishes), and stale once that lease is gone.
    (None, NOW + 160 * S, 1, 0, 600 * S, Next("wake", minute(4), lease=True,
                                              leases_from=minute(4))),
    (None, NOW + 20 * S, 1, 0, 600 * S, Next("wake", minute(1), lease=True,
                                             leases_from=minute(1))),
    (NOW + 400 * S, NOW + 160 * S, 1, 0, 600 * S, Next("wake", minute(4), lease=True,
                                                       leases_from=minute(4))),
    (NOW + 160 * S, NOW + 400 * S, 1, 0, 600 * S, Next("wake", minute(4),
                                                       leases_from=minute(8))),
    # A tie is the queued job's: a due wake-up, which nobody deletes.
    (NOW + 160 * S, NOW + 160 * S, 1, 0, 600 * S, Next("wake", minute(4),
                                                       leases_from=minute(4))),
    (NOW + 20 * S, NOW + 400 * S, 1, 0, 600 * S, Next("wait", NOW + 20 * S)),
    (NOW, NOW + 160 * S, 1, 3, 600 * S, Next("none", leases_from=minute(4))),
    # A drain that claimed nothing lost its race to a sibling: it arms the wake-up
    # (shared by name) rather than wait, so concurrent runs do not all wait.
    (NOW + 20 * S, None, 0, 0, 600 * S, Next("wake", minute(1))),
    (NOW + 20 * S, NOW + 400 * S, 0, 0, 600 * S, Next("wake", minute(1),
                                                      leases_from=minute(8))),
    # Due a moment from now by the database's clock (a wake-up that fired on the
    # minute, ahead of it): any run waits it out, a minute already begun cannot be armed.
    (NOW + 2 * S, None, 0, 0, 600 * S, Next("wait", NOW + 2 * S)),
    (NOW + 2 * S, None, 0, 0, 1 * S, Next("wake", minute(1))),
    (NOW, None, 0, 0, 600 * S, Next("continue")),  # all released at the deadline
    (None, None, 0, 0, 600 * S, Next("none")),
])
def test_after_run(run_at, lease_end, claimed, depth, remaining, expected):
    assert after_run(summary(run_at, lease_end, claimed), now=NOW, depth=depth, max_depth=3,
                     remaining=remaining) == expected


@pytest.mark.parametrize("decision, stale, kept", [
    (Next("none"), [minute(1), minute(59)], []),  # no lease is held: every one is stale
    (Next("wake", minute(2), leases_from=minute(4)), [minute(1), minute(3)],
     [minute(4), minute(5)]),
    (Next("wake", minute(4), lease=True, leases_from=minute(4)), [minute(3)], [minute(4)]),
    (Next("none", leases_from=minute(4)), [minute(3)], [minute(4)]),
    # A run that drains again soon decides then.
    (Next("wait", NOW + 20 * S), [], [minute(1)]),
    (Next("continue"), [], [minute(1)]),
])
def test_which_lease_wake_ups_are_stale(decision, stale, kept):
    assert [m for m in stale + kept if decision.stale(m)] == stale


def test_ceil_minute_never_rounds_down():
    assert ceil_minute(datetime(2026, 1, 1, 8, 0, tzinfo=UTC)) == datetime(2026, 1, 1, 8, 0,
                                                                          tzinfo=UTC)
    assert ceil_minute(datetime(2026, 1, 1, 8, 0, 0, 1, tzinfo=UTC)) == datetime(
        2026, 1, 1, 8, 1, tzinfo=UTC)


def test_a_run_s_switch_fires_on_the_minute_after_its_lease_can_end():
    claimed = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)
    assert switch_at(claimed, timedelta(minutes=5)) == datetime(2026, 12, 2, 12, 6, tzinfo=UTC)
    on_the_minute = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert switch_at(on_the_minute, timedelta(minutes=5)) == on_the_minute + timedelta(minutes=5)
