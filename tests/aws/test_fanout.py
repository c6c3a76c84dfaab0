"""Scale-out on Lambda, as Lambda runs it: several `python -m awslambdaric` processes
poll one stand-in of the Runtime API (tests/aws/runtime_api.py), which hands each
asynchronous Invoke the function makes (a fan-out, a continuation) to the next free
process, as Lambda runs one execution environment per invocation at once. The
database is the real PostgreSQL; the fleet's row, the jobs and the sessions are read
back from it.

A backlog widens the fleet to its cap and the fleet returns to zero; a fan-out
delivered twice adds no member; and on a database whose role allows fewer sessions
than the cap, the width stays within the session budget and no connection is
refused."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from drainer import enqueue_many
from drainer.storage import fleets
from tests.aws.helpers import FUNCTION, FUNCTION_ARN, REGION
from tests.aws.runtime_api import FunctionProcess, RuntimeApi, lambda_env
from tests.aws.test_runtime_client import (  # noqa: F401 - fixtures
    aws_client,
    deployed,
    infra_root,
    moto_endpoint,
    runtime_client,
)
from tests.helpers import count, limited_login
from tests.storage.test_least_privilege import ROLES_SQL
from tests.templates import TEMPLATE

TASKS = "tests.aws.tasks"
CRON = {"source": "drainer.cron"}
LOGIN = "drainer_fleet_login"


class Pool:
    """`size` function processes polling one Runtime API that delivers every
    asynchronous Invoke (`repeat` times)."""

    def __init__(self, api: RuntimeApi, processes: list[FunctionProcess]):
        self.api, self.processes = api, processes

    def run(self, event: object, timeout: float = 180) -> None:
        """Invoke the function with `event`, and wait until every invocation it led
        to has answered."""
        self.api.invoke(event, self.api.seconds)
        assert self.api.wait_idle(timeout), "\n".join(self.lines()[-40:])
        assert all(p.proc.poll() is None for p in self.processes)

    def lines(self) -> list[str]:
        return [line for p in self.processes
                for line in p._stdout.read_text().splitlines()]

    def bodies(self) -> list[dict]:
        """Every invocation's response; an error fails the test."""
        outcomes = self.api.outcomes()
        assert all(o.kind == "response" for o in outcomes), [o.body for o in outcomes]
        return [o.body for o in outcomes]


@pytest.fixture
def pool(tmp_path: Path, moto_endpoint: str,  # noqa: F811
         infra_root: Path) -> Iterator[Callable[..., Pool]]:  # noqa: F811
    made: list[Pool] = []

    def start(size: int, *, url: str, repeat: int = 1, env: dict[str, str] | None = None,
              **parameters: str) -> Pool:
        props, resolve = deployed(TEMPLATE, Tasks=TASKS, DatabaseUrl=url, **parameters)
        limit = float(resolve(props["Timeout"]))
        api = RuntimeApi(FUNCTION_ARN, deliver=True, repeat=repeat, seconds=limit)
        variables = {name: resolve(v) for name, v in props["Environment"]["Variables"].items()}
        # No wake-ups: the jobs are all ready, and moto's Scheduler is not this test's.
        variables.pop("DRAINER_SCHEDULE_GROUP")
        process_env = lambda_env(api=api, function=FUNCTION, handler=props["Handler"],
                                 task_root=infra_root, runtime=props["Runtime"],
                                 memory=int(resolve(props["MemorySize"])), region=REGION,
                                 aws_endpoint=moto_endpoint, **{**variables, **(env or {})})
        made.append(Pool(api, [
            FunctionProcess(api, props["Handler"], infra_root, process_env,
                            tmp_path / f"stdout-{n}.log", limit=limit) for n in range(size)]))
        return made[-1]

    yield start
    for started in made:
        for process in started.processes:
            process.stop()
        started.api.close()


def done_once(conn: psycopg.Connection, jobs: int) -> bool:
    """Every job done, each in one attempt."""
    return (count(conn, "status = 'done'"), count(conn, "attempts <> 1")) == (jobs, 0)


def test_a_backlog_widens_to_the_cap_and_returns_to_zero(pool, db_url, conn):
    jobs = 1200
    enqueue_many(conn, "aws", [{"sleep": 0.05}] * jobs)
    started = pool(4, url=db_url, MaxWidth="3", env={"DRAINER_CONCURRENCY": "4"})
    started.run(CRON)
    bodies = started.bodies()
    assert done_once(conn, jobs)
    fleet = fleets.read(conn, "aws")
    assert fleet.peak == 3  # widened to the cap, with a process to spare
    assert started.api.peak <= 3
    assert (fleet.running, fleet.pending, fleet.target) == (0, 0, 0)  # back to zero
    fanouts = [i for i in started.api.invokes if i.payload["source"] == "drainer.fanout"]
    assert sum(b.get("widened", 0) for b in bodies) == len(fanouts) >= 2
    assert {b["trigger"] for b in bodies} <= {"cron", "fanout", "continue"}
    assert sum(b["done"] for b in bodies) == jobs


def test_a_fanout_delivered_twice_adds_no_member(pool, db_url, conn):
    jobs = 600
    enqueue_many(conn, "aws", [{"sleep": 0.05}] * jobs)
    started = pool(4, url=db_url, repeat=2, MaxWidth="2", env={"DRAINER_CONCURRENCY": "4"})
    started.run(CRON)
    bodies = started.bodies()
    assert done_once(conn, jobs)
    fanouts = [i for i in started.api.invokes if i.payload["source"] == "drainer.fanout"]
    refused = [b for b in bodies if b.get("outcome") == "not needed"]
    assert fanouts and len(refused) == len(fanouts)  # each second delivery: no member
    assert all(b["claimed"] == 0 for b in refused)
    assert fleets.read(conn, "aws").peak == 2


@pytest.fixture
def limited_url(server, db_url) -> Iterator[str]:
    """A login holding drainer_worker whose role takes at most 4 sessions."""
    with limited_login(server, db_url, LOGIN, 4, setup=ROLES_SQL,
                       member_of="drainer_worker") as url:
        yield url


def test_eight_runs_on_a_role_below_the_cap_stay_within_its_sessions(pool, limited_url, conn):
    jobs = 2000
    enqueue_many(conn, "aws", [{"sleep": 0.05}] * jobs)
    # All of the role's sessions may go to the fleet: the budget is then the limit itself,
    # and one session more would be refused.
    started = pool(8, url=limited_url, MaxWidth="8",
                   env={"DRAINER_CONCURRENCY": "4", "DRAINER_BUDGET_SHARE": "1"})
    started.run(CRON)
    bodies = started.bodies()
    assert done_once(conn, jobs)
    records = [json.loads(line) for line in started.lines()]
    refused = [r for r in records if "waiting for the database" in r.get("message", "")
               or "too many" in r.get("message", "")]
    assert refused == []
    fleet = fleets.read(conn, "aws")
    assert 2 <= fleet.peak <= 4 and started.api.peak <= 4  # the role's 4, not the cap's 8
    assert (fleet.running, fleet.target) == (0, 0)
    assert sum(b["done"] for b in bodies) == jobs
