"""The width decision (drainer.width): how many more drains a backlog calls for,
from what the last claim said, the rate, the time left, the cap, the queues' limits
and the session budget. A table: each row one situation and its answer."""

import pytest

from drainer.width import STARTUP, Load, allowed, more_members

RATE = 100.0  # jobs a second one drain works: a member works RATE * STARTUP while one starts
BASE = dict(taken=50, full=True, done=1_000, rate=RATE, left=600.0, running=1, cap=8,
            allowed=None, budget=100)

CASES = [
    # (why, changes to BASE, more members)
    ("a full claim, a backlog that outlasts a start: double", {}, 1),
    ("two running: double again", {"running": 2}, 2),
    ("four running: the fleet's estimate, 4 x 1,000 jobs, calls for 20: double",
     {"running": 4}, 4),
    ("four running: the fleet's estimate, 4 x 300 jobs, needs 6 at 200 each, not 8",
     {"running": 4, "done": 300}, 2),
    ("a claim not full took every ready job: none", {"full": False}, 0),
    ("nothing worked yet: no rate, none", {"rate": 0.0, "done": 0}, 0),
    ("a backlog one drain clears before another starts: none",
     {"done": int(RATE * STARTUP), "taken": 10}, 0),
    ("the cap holds", {"running": 7, "done": 100_000}, 1),
    ("at the cap: none", {"running": 8, "done": 100_000}, 0),
    ("the budget holds", {"running": 2, "done": 100_000, "budget": 1}, 1),
    ("no budget: none", {"running": 2, "done": 100_000, "budget": 0}, 0),
    ("the queues' limits keep 3 busy", {"running": 2, "done": 100_000, "allowed": 3}, 1),
    ("the queues' limits keep 1 busy: none", {"done": 100_000, "allowed": 1}, 0),
    ("little time left: enough to finish within it, past doubling",
     {"done": 5_000, "left": 10.0}, 4),
    ("little time left, and the cap still holds", {"done": 50_000, "left": 10.0}, 7),
    ("a cap of 1: never", {"cap": 1, "done": 100_000}, 0),
]


@pytest.mark.parametrize(("why", "changes", "more"), CASES, ids=[c[0] for c in CASES])
def test_the_width_decision(why, changes, more):
    assert more_members(Load(**{**BASE, **changes})) == more


@pytest.mark.parametrize(("limits", "per_member", "members"), [
    ([None], 4, None),  # a queue without a limit: no bound
    ([5, None], 4, None),
    ([], 4, None),
    ([5], 1, 5),
    ([5], 4, 2),  # 5 jobs at once across drainers: 2 members of 4 slots keep them busy
    ([2, 3], 2, 3),
])
def test_the_members_queues_limits_keep_busy(limits, per_member, members):
    assert allowed(limits, per_member) == members
