"""How many more drains a backlog calls for: a pure decision, shared by the cloud
entry points and the simulator in `bench/`, beside `wake.after_run`.

It knows no count of the backlog (that would be a scan of the table): only what
the drain's last claim said (how many jobs it took, and whether it came back full,
so more are ready), how long the drain has worked, and how fast it goes. A backlog
that has lasted a drain this long is taken to last about as long again; the fleet
doubles at most per decision while claims come back full, so it reaches a useful
width in a few of a drain's starts, and never goes past the cap, the queues' own
concurrency limits, nor the database's session budget.
"""

import math
from dataclasses import dataclass

# Seconds a new drain takes before its first claim (a cold start and its first
# session): a backlog one drain clears sooner than that gains nothing from another.
STARTUP = 2.0


@dataclass(frozen=True)
class Load:
    """What one drain knows when it decides.

    `taken`: jobs its last claim took; `full`: that claim came back full; `done`:
    jobs it has worked so far; `rate`: jobs a second it works; `left`: seconds it
    has left; `running`: the fleet's members, running or asked for, itself
    included; `cap`: the most members (max_width); `allowed`: the most members the
    queues' own concurrency limits keep busy (None: no limit); `budget`: how many
    more sessions the database's budget gives drainer."""

    taken: int
    full: bool
    done: int
    rate: float
    left: float
    running: int
    cap: int
    allowed: int | None
    budget: int


def wanted(load: Load) -> int:
    """The members the backlog calls for, before the cap and budget: none beyond the
    running ones unless the last claim came back full (else it took every ready job,
    and nothing is left for another drain) and the backlog, as estimated, outlasts a
    new drain's start."""
    if not load.full or load.rate <= 0:
        return load.running
    # The backlog has lasted the fleet this long: about as much again as its members,
    # each about as fast as this one, have worked (this one's work times their
    # number); so the fleet doubles at each decision while claims come back full.
    backlog = max(load.taken, load.done) * load.running
    per_member = load.rate * STARTUP  # what a member works while another starts
    if backlog <= per_member:
        return load.running
    # Enough that the estimate would be done by the time more could start, at most
    # double; and at least enough to finish it within the time left.
    quick = min(2 * load.running, math.ceil(backlog / per_member))
    in_time = math.ceil(backlog / (load.rate * load.left)) if load.left > 0 else quick
    return max(load.running, quick, in_time)


def more_members(load: Load) -> int:
    """How many more members to start now: what the backlog calls for, within the
    cap, the queues' limits and the session budget."""
    ceiling = min(load.cap, load.running + load.budget)
    if load.allowed is not None:
        ceiling = min(ceiling, load.allowed)
    return max(0, min(wanted(load), ceiling) - load.running)


def allowed(concurrency_limits: list[int | None], per_member: int) -> int | None:
    """The most members the queues' concurrency limits (jobs at once across every
    drainer; None: a queue without one) keep busy, each member running up to
    `per_member` jobs at once; None when any queue is unlimited."""
    if not concurrency_limits or any(limit is None for limit in concurrency_limits):
        return None
    return math.ceil(sum(limit for limit in concurrency_limits if limit) / per_member)
