"""The database's session budget: how many more sessions drainer may open when it
widens to work off a backlog, so a fleet of drains never exhausts the connections
the application needs (nor hits a role's or the database's connection limit).

Each drain holds one session. Directly on PostgreSQL the budget is read from the
server, once per decision (`session_budget`); behind a pooler the server's view says
little about the pool (its server sessions are shared, and its clients beyond the
pool wait rather than fail), so the pool's size, a setting, stands for it instead.
"""

import math
from dataclasses import dataclass

import psycopg

from .. import defaults
from . import sql


@dataclass(frozen=True)
class Budget:
    """What the server takes and holds: client sessions it takes (`usable`: less its
    reserved slots), the role's and the database's limits (None: none), and the
    sessions open in all, for the role and for the database; or, behind a pooler,
    the pool's size (`pool`). `share`: the part of it drainer may use, the rest left
    to the application."""

    usable: int = 0
    role_limit: int | None = None
    database_limit: int | None = None
    open: int = 0
    open_role: int = 0
    open_database: int = 0
    pool: int | None = None
    share: float = defaults.BUDGET_SHARE

    @property
    def free(self) -> int:
        """Sessions that may open now: the fewest the server, the role and the
        database still take."""
        rooms = [self.usable - self.open]
        if self.role_limit is not None:
            rooms.append(self.role_limit - self.open_role)
        if self.database_limit is not None:
            rooms.append(self.database_limit - self.open_database)
        return max(0, min(rooms))

    def more(self, running: int = 0, pending: int = 0) -> int:
        """How many more sessions drainer may open: `share` of what its `running`
        drains hold (one session each, open) and what is free, or of the pool, less
        what they hold and what the `pending` ones, started and not connected yet,
        will. The share is of the whole, not of what is left, so widening again and
        again never takes more."""
        whole = self.pool if self.pool is not None else self.free + running
        return max(0, math.floor(self.share * whole) - running - pending)


def session_budget(conn: psycopg.Connection, *, pool_size: int | None = None,
                   share: float = defaults.BUDGET_SHARE) -> Budget:
    """The budget as `conn`'s server sees it now, read in one statement; behind a
    pooler, `pool_size` names the pool's size and nothing is read."""
    if pool_size is not None:
        return Budget(pool=pool_size, share=share)
    found = sql.row(conn, "session_budget")
    assert found is not None  # this very session is a client backend of the role
    usable, role_limit, db_limit, open_all, open_role, open_db = found
    return Budget(usable, None if role_limit < 0 else role_limit,
                  None if db_limit < 0 else db_limit, open_all, open_role, open_db,
                  share=share)
