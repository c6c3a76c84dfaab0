"""Claims staged for tests of several modules: a limits lock held and a claim waiting
for it, and another party's trigger that refuses every claim."""

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta

import psycopg

import drainer
from drainer import model
from drainer.storage import claim, roundtrip
from drainer.storage.limits import Limits
from tests.helpers import wait_until

POOL = ThreadPoolExecutor(max_workers=1)
LEASE = timedelta(minutes=5)

# Another party's trigger that refuses every claim: as the claim runs, or at its commit
# (a deferred constraint: the transaction's COMMIT fails).
REFUSALS = {
    "as_it_runs": "CREATE TRIGGER refuse_claims BEFORE UPDATE ON jobs FOR EACH ROW",
    "at_commit": "CREATE CONSTRAINT TRIGGER refuse_claims AFTER UPDATE ON jobs "
                 "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW",
}


@contextmanager
def limit_held(db_url: str, queue_name: str) -> Iterator[psycopg.Connection]:
    """A transaction holding queue_name's limits lock, as a drainer's claim does."""
    with psycopg.connect(db_url) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('drainer.limit'), hashtext(%s))",
                       (queue_name,))
        yield holder


def claim_waiting_for_the_lock(conn, claimer: psycopg.Connection,
                               limited: Limits) -> "Future[list[model.Job]]":
    """A claim by `claimer` on another thread, once it waits for the limits lock."""
    pid = claimer.info.backend_pid
    claiming = POOL.submit(roundtrip.claim, claimer, [], 10, timedelta(minutes=5),
                           limited=[limited], take=10)
    wait_until(lambda: conn.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s",
                                    (pid,)).fetchone() == ("advisory",))
    return claiming


def claimed_spec(conn: psycopg.Connection, limited: bool, jobs: int
                 ) -> tuple[list[model.Job], claim.Claim]:
    """`jobs` jobs of queue q claimed, and the spec of the next claim, on a queue with a
    concurrency limit or none."""
    from drainer.storage.limits import Limits
    drainer.enqueue_many(conn, "q", [{}] * jobs)
    capped = [Limits("q", concurrency=10)] if limited else []
    spec = claim.Claim([] if limited else ["q"], 10, LEASE, capped, 10)
    return roundtrip.claim(conn, spec.queues, 10, LEASE, limited=capped, take=10), spec


def refuse_claims(conn: psycopg.Connection, when: str) -> None:
    conn.execute(f"""
        CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'claims refused'; END $$;
        {REFUSALS[when]}
        WHEN (OLD.status = 'queued' AND NEW.status = 'running') EXECUTE FUNCTION refuse_claims();
    """)
