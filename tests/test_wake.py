"""The after-run decision, by table."""

from datetime import UTC, datetime, timedelta

import pytest

from drainer.run import Summary
from drainer.wake import Next, after_run, ceil_minute

NOW = datetime(2026, 12, 2, 12, 0, 30, tzinfo=UTC)
S = timedelta(seconds=1)


@pytest.mark.parametrize("due, depth, remaining, expected", [
    (None, 0, 600 * S, Next("none")),
    (NOW, 0, 600 * S, Next("continue")),
    (NOW, 3, 600 * S, Next("none")),  # at the depth limit the backstop takes over
    (NOW + 20 * S, 0, 600 * S, Next("wait", NOW + 20 * S)),
    (NOW + 20 * S, 0, 10 * S, Next("wake", datetime(2026, 12, 2, 12, 1, tzinfo=UTC))),
    (NOW + 160 * S, 0, 600 * S, Next("wake", datetime(2026, 12, 2, 12, 4, tzinfo=UTC))),
])
def test_after_run(due, depth, remaining, expected):
    summary = Summary(next_due=due, stopped="deadline" if due == NOW else "empty")
    assert after_run(summary, now=NOW, depth=depth, max_depth=3, remaining=remaining) == expected


def test_ceil_minute_never_rounds_down():
    assert ceil_minute(datetime(2026, 1, 1, 8, 0, tzinfo=UTC)) == datetime(2026, 1, 1, 8, 0,
                                                                          tzinfo=UTC)
    assert ceil_minute(datetime(2026, 1, 1, 8, 0, 0, 1, tzinfo=UTC)) == datetime(
        2026, 1, 1, 8, 1, tzinfo=UTC)
