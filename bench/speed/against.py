"""`python -m bench.speed --against REV`: the drain scenarios of the speed goals run
with an earlier commit's code beside the current code's, interleaved, with an A/A
pair (the current code against itself) to show how far two runs of the same code
differ on this machine right now.

Three sides drain every scenario, each from a database of its own on one server:
`before` (REV: a clean `git archive` of it under bench/.cache/commits/, installed
into a virtualenv of its own, kept per commit), `after` (the working tree the bench
runs from) and `after, A/A` (the working tree again). Each side's database is
migrated and filled by its own code (programs/seed_jobs.py). In each pair, the
scenarios run one after another, each on the three sides back to back, in turn
forwards and backwards, so a change of the machine's load hits them alike.
"""

import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from . import measure, pg, venvs
from .report import _table, summary
from .systems import LOADS, PROGRAMS, Drainer, DrainerKeyed, DrainerLimited, Load, System, clean_env

ROOT = Path(__file__).resolve().parent.parent.parent
COMMITS = venvs.CACHE / "commits"
SEED = PROGRAMS / "seed_jobs.py"
PROBE = "BENCH_DRAINER_FILE"  # programs/drainer_tasks.py writes drainer's path there
# The current environment's versions of drainer's dependencies, and of the optional
# ones that change how it runs (uvloop: the loop of async handlers; tracing), pinned in
# an earlier commit's virtualenv when installed here: the sides differ by drainer alone.
PINNED = ("psycopg", "psycopg-binary", "cronsim", "tzdata", "uvloop", "opentelemetry-api")

Log = Callable[[str], None]


@dataclass(frozen=True)
class Scenario:
    """A drain figure of one of the bench's systems, named by the goal it serves."""

    name: str
    title: str
    figure: str
    make: Callable[[pg.Server], Drainer]


SCENARIOS = {s.name: s for s in [
    Scenario("noop_1", "no-op, 1 process", "noop_1", Drainer),
    Scenario("noop_4", "no-op, 4 processes", "noop_4", Drainer),
    Scenario("limited_1", "no-op, queue limited to 50 running, 1 process", "noop_1",
             lambda server: DrainerLimited(server, True)),
    Scenario("keys_1", "no-op, keys and priorities, 1 process", "noop_1", DrainerKeyed),
    Scenario("keys_4", "no-op, keys and priorities, 4 processes", "noop_4", DrainerKeyed),
    Scenario("sleep_1", "10 ms jobs, 8 threads, 1 process", "sleep_1", Drainer),
]}


@dataclass
class Side:
    """One side of the comparison: the tree whose drainer it runs, with which Python."""

    key: str  # "before", "after", "aa": its databases' suffix
    label: str
    rev: str
    tree: Path
    python: str
    drainer_file: str | None = None  # what its first drain imported
    probe: Path | None = None  # where its drains write that, until one has

    def env(self) -> dict[str, str]:
        """The bench's environment, drainer imported from this side's tree (PYTHONPATH;
        PYTHONSAFEPATH keeps the working directory off the path, so a side cannot
        import the tree the bench runs from by accident)."""
        env = clean_env(PYTHONPATH=os.pathsep.join([str(PROGRAMS), str(self.tree)]),
                        PYTHONSAFEPATH="1")
        return {**env, PROBE: str(self.probe)} if self.probe else env

    def read_probe(self, log: Log) -> None:
        """After a drain: which drainer it imported, logged once."""
        if self.probe and self.probe.exists():
            self.drainer_file = self.probe.read_text()
            self.probe = None
            log(f"debug: {self.label}: its drain imported {self.drainer_file}")

    def describe(self) -> dict:
        return {"label": self.label, "rev": self.rev, "tree": str(self.tree),
                "python": self.python, "drainer_file": self.drainer_file}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


class UnknownRevision(Exception):
    """--against names no commit of this repository."""


def resolve(rev: str) -> str:
    """The full hash of a revision."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        raise UnknownRevision(f"{rev} is not a commit of this repository") from None


def checkout(sha: str) -> Path:
    """A clean tree of the commit (git archive), extracted once and kept."""
    target = COMMITS / sha
    if (target / "drainer" / "__init__.py").exists():
        return target
    COMMITS.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", sha],
                             check=True, capture_output=True).stdout
    partial = Path(tempfile.mkdtemp(prefix=f".{sha}-", dir=COMMITS))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(partial, filter="data")
    partial.rename(target)  # whole or not at all: an interrupted one is not reused
    return target


def interpreter(sha: str, tree: Path) -> str:
    """The Python of the commit's own virtualenv: the tree installed (editable) with
    this environment's versions of drainer's dependencies."""
    pins = []
    for name in PINNED:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return str(venvs.ensure(f"drainer-{sha[:12]}", ["-e", str(tree), *pins]) / "python")


def sides(rev: str, python: str | None, log: Log) -> list[Side]:
    """before (REV's checkout), after and its A/A twin (the bench's own tree)."""
    sha = resolve(rev)
    tree = checkout(sha)
    log(f"before: {rev} = {sha[:12]}, checked out in {tree}")
    if python is None:
        log(f"before: its virtualenv, built once, under {venvs.CACHE}")
        python = interpreter(sha, tree)
    else:
        log(f"before: run by {python}, {tree} first on its PYTHONPATH")
    current = git("describe", "--always", "--dirty")
    return [Side("before", f"before ({git('rev-parse', '--short', sha)})", sha, tree, python),
            Side("after", f"after ({current})", current, ROOT, sys.executable),
            Side("aa", f"after, A/A ({current})", current, ROOT, sys.executable)]


def compile_tree(side: Side) -> None:
    """Its bytecode, and the bench programs', written by its Python before any timing."""
    subprocess.run([side.python, "-m", "compileall", "-q", str(side.tree / "drainer"),
                    str(PROGRAMS)], env=side.env(), check=True, stdout=subprocess.DEVNULL)


class OnSide(System):
    """A scenario's system run by one side: its interpreter and tree for the drains,
    its code for the schema and the jobs."""

    def __init__(self, server: pg.Server, scenario: Scenario, side: Side):
        super().__init__(server)
        self.inner = scenario.make(server)
        self.side = side
        self.name = f"{scenario.name} {side.key}"
        self.priorities = list(getattr(self.inner, "PRIORITIES", ()))

    def prepare(self) -> None:
        super().prepare()
        self.inner.url = self.url
        self._seed_program({"migrate": True})

    def seed(self, kind: str, jobs: int) -> None:
        self._seed_program({"queue": self.inner.queue_of(kind), "jobs": jobs,
                            "priorities": self.priorities})

    def _seed_program(self, spec: dict) -> None:
        argv = [self.side.python, str(SEED), json.dumps({"url": self.url, **spec})]
        proc = subprocess.run(argv, env=self.side.env(), capture_output=True, text=True,
                              timeout=600)
        if proc.returncode:
            tail = " | ".join(proc.stderr.strip().splitlines()[-2:])
            raise measure.Failed(f"{self.side.label}: seed_jobs.py failed: {tail}")

    def argvs(self, load: Load, jobs: int) -> list[list[str]]:
        return [[self.side.python, *argv[1:]] for argv in self.inner.argvs(load, jobs)]

    def env(self) -> dict[str, str]:
        return self.side.env()

    def left(self) -> int:
        return self.inner.left()


def compare(server: pg.Server, all_sides: list[Side], scenarios: list[Scenario],
            pairs: int, jobs: dict[str, int], log: Log) -> list[dict]:
    """Every scenario on every side, `pairs` times, interleaved; one row per scenario
    (see `row`). `jobs`: jobs per drain by kind of job (noop, sleep)."""
    for side in all_sides[:2]:  # the A/A twin's tree is the after side's
        compile_tree(side)
    with tempfile.TemporaryDirectory(prefix="bench-against-") as probes:
        for side in all_sides:
            side.probe = Path(probes) / side.key
        return _interleave(server, all_sides, scenarios, pairs, jobs, log)


def _interleave(server: pg.Server, all_sides: list[Side], scenarios: list[Scenario],
                pairs: int, jobs: dict[str, int], log: Log) -> list[dict]:
    systems = {(sc.name, side.key): OnSide(server, sc, side)
               for sc in scenarios for side in all_sides}
    values: dict[tuple[str, str], list[float]] = {key: [] for key in systems}
    failed: dict[str, str] = {}
    for i in range(pairs):
        order = all_sides if i % 2 == 0 else all_sides[::-1]
        for sc in scenarios:
            for side in order:
                if sc.name in failed:
                    break
                try:
                    rate = _drain(systems[sc.name, side.key], sc, jobs, first=i == 0)
                except measure.Failed as exc:
                    failed[sc.name] = str(exc)
                    log(f"{sc.name} {side.label}: n/a, {exc}")
                    break
                values[sc.name, side.key].append(rate)
                side.read_probe(log)
                log(f"pair {i + 1}/{pairs} {sc.name:<9} {side.label}: {rate:,.0f} jobs/s")
    return [failed_row(sc, failed[sc.name]) if sc.name in failed else
            row(sc, *(values[sc.name, side.key] for side in all_sides)) for sc in scenarios]


def _drain(system: OnSide, scenario: Scenario, jobs: dict[str, int], first: bool) -> float:
    """Jobs/s of one drain (its database made ready at its first)."""
    if first:
        system.prepare()
    load = LOADS[scenario.figure]
    count = jobs[load.kind]
    timed, _ = measure.drain(system, load, count)
    return count / timed.seconds


def row(scenario: Scenario, before: list[float], after: list[float],
        twin: list[float]) -> dict:
    """A scenario's medians, after / before as a ratio of medians, its range over the
    pairs, and the A/A spread: the smallest and largest ratio of the two after sides'
    drains in a pair, taken both ways round (which copy comes first is chance). A
    ratio outside that spread differs by more than this run's noise."""
    ratio = statistics.median(after) / statistics.median(before)
    aa = [t / a for a, t in zip(after, twin, strict=True)]
    low, high = min(*aa, *(1 / r for r in aa)), max(*aa, *(1 / r for r in aa))
    pair_ratios = [a / b for b, a in zip(before, after, strict=True)]
    verdict = ("faster" if ratio > high else "slower" if ratio < low else "within the noise")
    return {"scenario": scenario.name, "title": scenario.title, "figure": scenario.figure,
            "before": summary(before), "after": summary(after), "aa": summary(twin),
            "ratio": ratio, "pair_ratios": pair_ratios, "aa_ratios": aa,
            "aa_spread": [low, high], "outside_aa": not low <= ratio <= high,
            "verdict": verdict}


def failed_row(scenario: Scenario, why: str) -> dict:
    return {"scenario": scenario.name, "title": scenario.title, "figure": scenario.figure,
            "unavailable": why}


def table(rows: list[dict], labels: list[str]) -> str:
    """One line per scenario: jobs/s of each side, median (min – max), then the ratios."""
    def rate(stats: dict) -> str:
        low, med, high = (f"{stats[k]:,.0f}" for k in ("min", "median", "max"))
        return med if low == high else f"{med} ({low} – {high})"

    def span(values: list[float]) -> str:
        return f"{min(values):.3f} – {max(values):.3f}"

    header = ["scenario", f"{labels[0]}, jobs/s", f"{labels[1]}, jobs/s",
              "after / before", "per pair", "A/A spread", "after vs before"]
    body, notes = [], []
    for r in rows:
        name = f"{r['scenario']}: {r['title']}"
        if "unavailable" in r:
            body.append([name, "n/a", "n/a", "n/a", "", "", ""])
            notes.append(f"- {r['scenario']}: n/a, {r['unavailable']}")
            continue
        body.append([name, rate(r["before"]), rate(r["after"]), f"{r['ratio']:.3f}",
                     span(r["pair_ratios"]), span(r["aa_spread"]), r["verdict"]])
    return "\n".join([_table(header, body), *([""] + notes if notes else [])])

