"""The systems the bench drains with: how each installs its schema, enqueues the
bench's jobs, is started as processes, and says how many jobs it left unfinished.

Every system gets a database of its own on the same server, and the same jobs:
`noop` (a handler that returns at once), `sleep` (one that sleeps 10 ms: in a thread
with `time.sleep` for drainer and the hand-written loop, `asyncio.sleep` for the
competitors) or `async_sleep` (`await asyncio.sleep(0.01)` in an `async def`).
"""

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg

import drainer
from drainer.storage.schema import migrate
from drainer.storage.sql import MIGRATIONS

from . import pg, venvs
from .programs.seed_jobs import seed as seed_jobs

PROGRAMS = Path(__file__).resolve().parent / "programs"
HANDWRITTEN = PROGRAMS / "handwritten.py"
SLEEP = 0.01  # seconds a sleeping handler sleeps (as programs/* have it)
SLEEP_CONCURRENCY = 8


@dataclass(frozen=True)
class Load:
    """What a drain figure runs: `processes` processes draining jobs of `kind`, each
    running `concurrency` handlers at once (None: the system's default); with
    `members`, each process is `drain --processes members` (that many members)."""

    kind: str
    processes: int = 1
    concurrency: int | None = None
    members: int | None = None

    @property
    def ideal(self) -> float:
        """Jobs/s if every handler slot of a sleep load slept all the time: the
        figure an I/O-bound workload is held to."""
        return self.processes * (self.members or 1) * (self.concurrency or 1) / SLEEP


# The drain figures, by name. The io_* ones are the I/O-bound workload (--workload io).
LOADS = {
    "noop_1": Load("noop", 1), "noop_4": Load("noop", 4),
    "sleep_1": Load("sleep", 1, SLEEP_CONCURRENCY),
    "sleep_4": Load("sleep", 4, SLEEP_CONCURRENCY),
    "io_sync_100": Load("sleep", 1, 100),
    "io_async_100": Load("async_sleep", 1, 100),
    "io_async_500": Load("async_sleep", 1, 500),
    **{f"width_{n}": Load("sleep", 1, SLEEP_CONCURRENCY, members=n) for n in (1, 2, 4, 8)},
}
IO_FIGURES = tuple(f for f in LOADS if f.startswith("io_"))
WIDTH_FIGURES = tuple(f for f in LOADS if f.startswith("width_"))
OPT_IN = (*IO_FIGURES, *WIDTH_FIGURES)  # figures only their workload measures
# The database's ceiling the width workload is held to: drainer's claim of 10 and
# batch complete from pgbench (a C client), 4 connections (bench/README.md says why).
CEILING = ("pgbench-10", "noop_4")
ASYNC_IO = tuple(f for f in IO_FIGURES if LOADS[f].kind == "async_sleep")


PYCACHE = venvs.CACHE / "pycache"


def clean_env(**extra: str) -> dict[str, str]:
    """Our environment without anything that would point a process elsewhere, and
    with bytecode caching on (kept under the bench's cache), as an installed package
    has it: compiling the sources at every start would count against the start."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DRAINER_", "PG", "PGQUEUER_", "PROCRASTINATE_"))
           and k not in ("DATABASE_URL", "PYTHONDONTWRITEBYTECODE")}
    return {**env, "PYTHONPATH": str(PROGRAMS), "PYTHONPYCACHEPREFIX": str(PYCACHE), **extra}


def compile_sources() -> None:
    """Write the bytecode of drainer and of the bench's programs before any timing."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(drainer.__file__).parent),
                    str(PROGRAMS)], env=clean_env(), check=True, stdout=subprocess.DEVNULL)


class System:
    """One way of draining. `figures` lists what the bench measures for it."""

    name = ""
    figures = ("noop_1", "noop_4", "sleep_1", "sleep_4", "cold_start")
    jobs_scale = 1.0  # a slow system drains fewer no-op and I/O-bound jobs: a shorter bench

    def __init__(self, server: pg.Server):
        self.server = server
        self.url = ""

    def prepare(self) -> None:
        """Create the database and schema; venvs.Unavailable when it cannot run here."""
        self.url = self.server.create(re.sub(r"\W+", "_", self.name).strip("_"))

    def seed(self, kind: str, jobs: int) -> None:
        """Empty the queue, enqueue `jobs` jobs of `kind`, VACUUM ANALYZE."""
        raise NotImplementedError

    def argvs(self, load: Load, jobs: int) -> list[list[str]]:
        return [self.argv(load.kind, load.concurrency)] * load.processes

    def argv(self, kind: str, concurrency: int | None = None) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return clean_env()

    def left(self) -> int:
        """Jobs not finished yet."""
        raise NotImplementedError


class JobsTable(System):
    """Systems that drain drainer's own `jobs` table (migrated, trigger included)."""

    def prepare(self) -> None:
        super().prepare()
        with psycopg.connect(self.url, autocommit=True) as conn:
            migrate(conn)

    def queue_of(self, kind: str) -> str:
        """The queue its jobs of `kind` go to (programs/drainer_tasks.py names them)."""
        return f"bench_{kind}"

    def seed(self, kind: str, jobs: int) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            seed_jobs(conn, self.queue_of(kind), jobs)

    def left(self) -> int:
        return pg.scalar(self.url, "SELECT count(*) FROM jobs WHERE status <> 'done'")


class Drainer(JobsTable):
    name = "drainer"
    figures = (*System.figures, *OPT_IN)

    def __init__(self, server: pg.Server, *extra: str):
        super().__init__(server)
        self.extra = list(extra)
        if extra:
            self.name = f"drainer {' '.join(extra)}"
            self.figures = ("noop_1", "noop_4")

    def argvs(self, load: Load, jobs: int) -> list[list[str]]:
        members = ["--processes", str(load.members)] if load.members else []
        return [[*self.argv(load.kind, load.concurrency), *members]] * load.processes

    def argv(self, kind: str, concurrency: int | None = None) -> list[str]:
        threads = ["--concurrency", str(concurrency)] if concurrency else []
        return [sys.executable, "-m", "drainer", "drain", "--database-url", self.url,
                "--tasks", "drainer_tasks", "--queue", self.queue_of(kind), *threads,
                *self.extra]


class DrainerAsyncio(Drainer):
    """drainer's async handlers on asyncio's own loop, where `drainer` runs them on
    uvloop (installed with the bench: --event-loop auto picks it)."""

    name = "drainer --event-loop asyncio"
    figures = ASYNC_IO

    def __init__(self, server: pg.Server):
        super().__init__(server)
        self.extra = ["--event-loop", "asyncio"]


class DrainerKeyed(Drainer):
    """drainer on jobs that each carry a unique key and one of four priorities: what
    the unique index and the claim's walk over priorities cost a drain."""

    name = "drainer, keys and priorities"
    figures = ("noop_1", "noop_4")
    PRIORITIES = (-10, 10, 20, 30)

    def seed(self, kind: str, jobs: int) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            seed_jobs(conn, self.queue_of(kind), jobs, self.PRIORITIES)


class DrainerLimited(Drainer):
    """drainer with 50 handler threads per process on a queue limited to 50 running
    jobs across all drainers (`@task(concurrency=50)`), against the same jobs with no
    limit, claimed 50 at a time (a limited queue can never claim more than its limit
    at once) or in adaptive batches (up to 500): what the limited claim (a transaction
    under an advisory lock, its room counted) costs, and what its smaller batches do.
    The limited one also drains 10 ms jobs at the threads of `drainer`'s own figure,
    with its limit above them: what its batches cost handlers that take time (each
    refilled as slots free up)."""

    def __init__(self, server: pg.Server, limited: bool, *extra: str):
        super().__init__(server)
        self.queue = "bench_limited" if limited else "bench_noop"
        self.extra = list(extra)
        self.figures = ("noop_1", "noop_4", "sleep_1") if limited else ("noop_1", "noop_4")
        self.name = ("drainer, concurrency limit 50" if limited else
                     f"drainer --concurrency 50{''.join(' ' + e for e in extra)}, no limit")

    def queue_of(self, kind: str) -> str:
        return self.queue if kind == "noop" else "bench_limited_sleep"

    def argv(self, kind: str, concurrency: int | None = None) -> list[str]:
        return [sys.executable, "-m", "drainer", "drain", "--database-url", self.url,
                "--tasks", "drainer_tasks", "--queue", self.queue_of(kind), "--concurrency",
                str(concurrency or 50), *self.extra]


class DrainerHandMade(Drainer):
    """drainer on the classic jobs table made by hand (migration 1 alone: no trigger,
    no priority, no key): the plain table the keyed one is compared with."""

    name = "drainer, hand-made table"
    figures = ("noop_1", "noop_4")

    def prepare(self) -> None:
        System.prepare(self)
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(MIGRATIONS[1], prepare=False)


class Handwritten(JobsTable):
    """bench/speed/programs/handwritten.py: claim 10, then complete each or the batch."""

    def __init__(self, server: pg.Server, complete: str):
        super().__init__(server)
        self.complete = complete
        self.name = f"loop-{complete}"

    def argv(self, kind: str, concurrency: int | None = None) -> list[str]:
        sleep = (["--sleep", str(SLEEP), "--concurrency", str(concurrency)]
                 if kind == "sleep" else [])
        return [sys.executable, str(HANDWRITTEN), self.url, self.queue_of(kind),
                "--complete", self.complete, *sleep]


class Pgbench(JobsTable):
    """The database's ceiling: drainer's claim and batch complete driven by pgbench, a
    C client, with `processes` connections in one process."""

    figures = ("noop_1", "noop_4")

    def __init__(self, server: pg.Server, size: int):
        super().__init__(server)
        self.size = size
        self.name = f"pgbench-{size}"
        if size > 10:
            self.figures = ("noop_1",)

    def prepare(self) -> None:
        if not (self.server.bin_dir / "pgbench").exists():
            raise venvs.Unavailable(f"no pgbench in {self.server.bin_dir}")
        super().prepare()

    def argvs(self, load: Load, jobs: int) -> list[list[str]]:
        cluster = self.server.cluster
        processes = load.processes
        per_client = -(-jobs // (self.size * processes))  # ceil: every job gets claimed
        return [[str(self.server.bin_dir / "pgbench"), "-n", "-M", "prepared",
                 "-c", str(processes), "-j", str(processes), "-t", str(per_client),
                 "-D", f"size={self.size}", "-f", str(PROGRAMS / "pgbench_claim_complete.sql"),
                 "-h", str(cluster.root), "-p", str(cluster.port), "-U", "postgres",
                 psycopg.conninfo.conninfo_to_dict(self.url)["dbname"]]]


class Competitor(System):
    """A queue from PyPI, in its own virtualenv; its programs read BENCH_DB_URL. Its
    handlers are all `async def`, so `sleep` and `async_sleep` are one handler."""

    figures = (*System.figures, *ASYNC_IO)
    requirements: list[str] = []
    clear = ""  # SQL that empties its queue
    unfinished = ""  # SQL that counts its unfinished jobs
    bin: Path

    def prepare(self) -> None:
        self.bin = venvs.ensure(self.name, self.requirements)
        super().prepare()
        self._setup(self.install_argv())

    def install_argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return clean_env(BENCH_DB_URL=self.url)

    def _setup(self, argv: list[str]) -> None:
        proc = subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=600)
        if proc.returncode:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise venvs.Unavailable(f"{Path(argv[0]).name} failed: {' '.join(tail)}")

    def seed(self, kind: str, jobs: int) -> None:
        pg.execute(self.url, self.clear)
        if jobs:
            self._setup([str(self.bin / "python"), str(PROGRAMS / f"{self.name}_app.py"),
                         "seed", self.handler(kind), str(jobs)])
        pg.execute(self.url, "VACUUM ANALYZE")

    def left(self) -> int:
        return pg.scalar(self.url, self.unfinished)

    @staticmethod
    def handler(kind: str) -> str:
        """The app's handler for jobs of `kind`."""
        return kind.removeprefix("async_")


class PgQueuer(Competitor):
    name = "pgqueuer"
    requirements = ["pgqueuer[asyncpg]==1.6.0", "typer<0.29"]  # pgq run crashes with typer 0.29
    clear = "TRUNCATE pgqueuer, pgqueuer_log"
    unfinished = "SELECT count(*) FROM pgqueuer"

    def install_argv(self) -> list[str]:
        return [str(self.bin / "pgq"), "--pg-dsn", self.url, "install"]

    def argv(self, kind: str, concurrency: int | None = None) -> list[str]:
        # It wants max_concurrent_tasks >= 2 x batch_size: 8 at once takes batches of 4.
        limit = (["--max-concurrent-tasks", str(concurrency),
                  "--batch-size", str(concurrency // 2)] if concurrency else [])
        return [str(self.bin / "pgq"), "run", f"pgqueuer_app:{self.handler(kind)}",
                "--mode", "drain", *limit]


class Procrastinate(Competitor):
    name = "procrastinate"
    requirements = ["procrastinate==3.10.0"]
    clear = "TRUNCATE procrastinate_jobs CASCADE"
    unfinished = "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
    jobs_scale = 0.25  # about 20x slower than the loop: a quarter of the jobs

    def install_argv(self) -> list[str]:
        return [str(self.bin / "procrastinate"), "--app", "procrastinate_app.app",
                "schema", "--apply"]

    def argv(self, kind: str, concurrency: int | None = None) -> list[str]:
        workers = ["--concurrency", str(concurrency)] if concurrency else []
        return [str(self.bin / "procrastinate"), "--app", "procrastinate_app.app", "worker",
                "--queues", "bench", "--one-shot", *workers]


def all_systems(server: pg.Server, *, competitors: bool = True) -> list[System]:
    systems = [Drainer(server), DrainerAsyncio(server), DrainerHandMade(server),
               DrainerKeyed(server),
               DrainerLimited(server, True), DrainerLimited(server, False),
               DrainerLimited(server, False, "--batch-size", "50"),
               Drainer(server, "--batch-size", "10"),
               Handwritten(server, "each"), Handwritten(server, "batch"),
               Pgbench(server, 10), Pgbench(server, 500)]
    if competitors:
        systems += [PgQueuer(server), Procrastinate(server)]
    return systems
