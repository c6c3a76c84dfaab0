"""Deliberate breaks: does the suite catch them?

Each break is a small textual change to the shipped SQL (or code), such as
dropping SKIP LOCKED from a claim, that some named tests must catch. For each break
this copies the tree to a temporary directory, applies the change there, and runs
its tests in one pytest process with PYTHONPATH pointing at the copy (subprocesses
the tests start import the broken copy too). A break is caught when pytest exits 1
with one of its own tests failing (not only erring in a fixture). First a baseline:
the same tests, unbroken, must pass, or the results would mean nothing.

    python -m tests.breaks --list            # the breaks, their groups and tests
    python -m tests.breaks guards            # a group (CI runs this one)
    python -m tests.breaks attempts-done     # one break by name

Exits 1 when a break survives, when a break's text is no longer found as many times
as it says (the code changed: the break must be written again, not silently
skipped), when a test it names does not exist, or when the baseline fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The named statements, a file per role; a break names its statement, not its file.
QUERIES = "drainer/storage/queries"
SCHEMA = f"{QUERIES}/schema.sql"
# Not copied: what is not the tree's own, or is big and rebuilt on demand.
IGNORED = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "*.egg-info",
                                 ".drainer", ".pytest_cache", ".mypy_cache",
                                 ".ruff_cache", ".hypothesis")
RUN_TIMEOUT = 1200  # seconds for one pytest process; pytest-timeout bounds each test


@dataclass(frozen=True)
class Edit:
    """Replace `old` by `new` in `path`, within the statement named `statement` when
    given (`-- name: ...` of a .sql file); `old` must occur exactly `count` times
    there, all of them replaced."""

    path: str
    old: str
    new: str
    count: int = 1
    statement: str | None = None

    def apply(self, text: str) -> str:
        """`text` with the edit made; ValueError when `old` is not there `count` times."""
        start, end = self._span(text)
        part = text[start:end]
        found = part.count(self.old)
        if found != self.count:
            raise ValueError(f"{self.where()}: {self.old!r} found {found} times, "
                             f"expected {self.count}")
        return text[:start] + part.replace(self.old, self.new) + text[end:]

    def where(self) -> str:
        return self.path + (f" (statement {self.statement})" if self.statement else "")

    def _span(self, text: str) -> tuple[int, int]:
        if self.statement is None:
            return 0, len(text)
        head = f"-- name: {self.statement}\n"
        start = text.find(head)
        if start < 0:
            raise ValueError(f"{self.where()}: no such statement")
        end = text.find("\n-- name: ", start + len(head))
        return start, len(text) if end < 0 else end


@dataclass(frozen=True)
class Break:
    name: str
    what: str
    edits: tuple[Edit, ...]
    tests: tuple[str, ...]  # pytest node ids; any of them failing catches the break
    groups: frozenset[str] = field(default_factory=frozenset)


def sql(statement: str, old: str, new: str, count: int = 1) -> Edit:
    return Edit(statement_file(statement), old, new, count, statement)


def statement_file(statement: str) -> str:
    """The file of QUERIES that holds the named statement (its path from ROOT);
    ValueError when none does."""
    head = f"-- name: {statement}\n"
    for path in sorted((ROOT / QUERIES).glob("*.sql")):
        if not path.name.endswith(".generated.sql") and head in path.read_text():
            return f"{QUERIES}/{path.name}"
    raise ValueError(f"{QUERIES}: no statement {statement}")


def unguarded(target: str) -> Edit:
    """settle's attempts guard dropped for the rows going to `target` only."""
    return sql("settle", "j.attempts = t.attempts",
               f"(j.attempts = t.attempts OR t.target = '{target}')")


LOCKED_ROWS = "tests/test_claim_race.py::test_a_drain_skips_rows_another_session_holds_locked"
LIMITS = "tests/storage/test_limits.py"
LIMITED_LOCKED_ROWS = f"{LIMITS}::test_a_limited_claim_skips_locked_rows"
REAPED = "tests/test_ownership.py::test_a_reaped_workers_result_is_not_written"
TAKEOVER = "tests/test_lifecycle.py::test_stale_completion_after_takeover_changes_nothing"
GUARDED = "tests/test_lifecycle.py::test_complete_is_guarded_by_attempts"
LIMITED_PRIORITY = f"{LIMITS}::test_a_limited_claim_takes_higher_priority_first"
GROUP_PRIORITY = f"{LIMITS}::test_a_group_limited_claim_takes_higher_priority_first"
CANCELLED = "tests/storage/test_cancelled_running.py"
PAUSES = "tests/storage/test_pauses.py"


def _breaks() -> list[Break]:
    guards = frozenset({"guards"})
    skip = guards | {"skip-locked"}
    attempts = guards | {"attempts"}
    priority = guards | {"priority"}
    cancelled = frozenset({"cancelled-running"})
    paused = frozenset({"pauses"})
    return [
        Break("skip-locked-claim-oldest", "the plain claim on a table without priorities "
              "waits for locked rows", (sql("claim_oldest", "SKIP LOCKED", ""),),
              (f"{LOCKED_ROWS}[hand_made]",), skip),
        Break("skip-locked-claim-by-priority", "the plain claim waits for locked rows",
              (sql("claim_by_priority", "SKIP LOCKED", ""),), (f"{LOCKED_ROWS}[migrated]",),
              skip),
        Break("skip-locked-limited-free", "a limited claim (no per_group) waits for "
              "locked rows", (sql("limited_free", "SKIP LOCKED", ""),),
              (LIMITED_LOCKED_ROWS,), skip),
        Break("skip-locked-limited-first", "a per-group claim waits for locked rows among "
              "its first ready jobs", (sql("limited_arms", "SKIP LOCKED)\n", ")\n"),),
              (LIMITED_LOCKED_ROWS,), skip),
        Break("skip-locked-limited-heads", "a per-group claim waits for locked rows among "
              "the groups' heads", (sql("limited_arms", "SKIP LOCKED) AS heads",
                                        ") AS heads"),),
              (LIMITED_LOCKED_ROWS,), skip),
        Break("attempts-done", "completion writes a job another claim owns now",
              (unguarded("done"),), (GUARDED, REAPED, TAKEOVER), attempts),
        Break("attempts-retry", "a failure to retry writes a job another claim owns now",
              (unguarded("retry"),), (REAPED, TAKEOVER), attempts),
        Break("attempts-failed", "a failure for good writes a job another claim owns now",
              (unguarded("failed"),), (REAPED,), attempts),
        Break("attempts-release", "a release gives back another claim's attempt",
              (unguarded("queued"),), (REAPED, TAKEOVER), attempts),
        Break("attempts-extend", "a heartbeat extends another claim's lease",
              (sql("extend", " AND j.attempts = t.attempts", ""),), (REAPED, TAKEOVER),
              attempts),
        Break("attempts-result", "a kept result is written to another claim's job",
              (sql("keep_results", " AND j.attempts = t.attempts", ""),), (REAPED,),
              attempts),
        Break("attempts-extend-cancelled", "the heartbeat of a cancelled claim extends a "
              "later claim's kept places",
              (sql("extend_cancelled", " AND j.attempts = t.attempts", ""),),
              ("tests/storage/test_limits_admin.py::"
               "test_let_go_of_an_old_claim_never_touches_the_claim_after_cancel_requeue",),
              attempts),
        Break("priority-claim", "the plain claim takes the oldest jobs, not the highest "
              "priority", (sql("claim_by_priority", "c.priority DESC, ", "", count=2),),
              ("tests/storage/test_priorities.py::"
               "test_a_high_priority_job_enqueued_last_is_among_the_first_claimed",),
              priority),
        Break("priority-claim-shares", "a claim of many queues shares its batch out by age, "
              "not priority", (sql("claim_shares", "c.priority DESC, ", ""),),
              ("tests/storage/test_many_queues.py::"
               "test_a_claim_of_many_queues_takes_the_highest_priority_first",),
              priority),
        Break("priority-limited", "a limited queue takes its oldest jobs first",
              (sql("limited_free", "j.priority DESC, ", ""),), (LIMITED_PRIORITY,), priority),
        Break("priority-limited-queues", "of several limited queues, the free slots go to "
              "the oldest jobs", (sql("claim_limited", "c.priority DESC, ", ""),),
              (LIMITED_PRIORITY,), priority),
        Break("priority-limited-groups", "a per-group queue takes its oldest startable "
              "jobs first", (sql("limited_arms", "j.priority DESC, ", "", count=2),),
              (GROUP_PRIORITY,), priority),
        Break("priority-limited-ready", "a per-group queue looks at its oldest ready jobs "
              "first", (sql("limited_ready", "priority DESC, ", ""),), (GROUP_PRIORITY,),
              priority),
        Break("schedule-slot-cas", "a schedule's slot advance ignores what another drainer "
              "wrote since it read", (sql("schedule_enqueue", "(last_slot IS NULL OR "
                                          "last_slot < (SELECT min(slot) FROM picked))",
                                          "true"),),
              ("tests/test_schedules.py::test_the_slot_advance_refuses_a_stale_read",),
              guards | {"schedules"}),
        Break("cancelled-running-column", "a job cancelled while running is not read by its "
              "column (cancelled_running_until)",
              (sql("cancelled_running", "cancelled_running_until > coalesce(%(now)s, now())",
                   "false"),),
              (f"{CANCELLED}::test_the_column_alone_keeps_the_places_until_its_time",),
              cancelled),
        Break("cancelled-running-old-form", "a job an older release cancelled (its lease "
              "kept) is not read as cancelled while running",
              (sql("cancelled_running", "OR (:cancelled_running_before_11)", "OR false"),),
              (f"{CANCELLED}::test_an_old_drainers_writes_are_read_as_cancelled_running",),
              cancelled),
        Break("cancelled-running-unmigrated", "on a schema without migration 11, a job "
              "cancelled while running is not read as such",
              (sql("cancelled_running_unmigrated", "AND (:cancelled_running_before_11)",
                   "AND false"),),
              (f"{CANCELLED}::test_a_schema_without_the_migration_keeps_working_as_before",),
              cancelled),
        Break("cancelled-running-lease-live", "a lease that ended, or one no time ends, "
              "marks a job cancelled while running",
              (sql("lease_live", " AND locked_until < '9999-01-01'", ""),
               sql("lease_live", "locked_until > coalesce(%(now)s, now())",
                   "locked_until IS NOT NULL")),
              (f"{CANCELLED}::test_a_job_another_producer_left_failed_with_a_lease_is_not_"
               "backfilled_past_it",), cancelled),
        Break("cancelled-running-backfill", "migration 11 leaves the rows of the old form "
              "without the column", (Edit(SCHEMA, "SET cancelled_running_until = locked_until",
                                          "SET cancelled_running_until = NULL"),),
              (f"{CANCELLED}::test_a_row_cancelled_in_the_old_form_is_backfilled_and_keeps_"
               "its_places",), cancelled),
        Break("pause-claim", "the plain claim takes a paused queue's jobs",
              (sql("queues_unpaused", "WHERE q.name <> ALL(:paused_queues)", "WHERE true"),),
              (f"{PAUSES}::test_a_paused_queue_is_not_claimed_until_resumed",), guards | paused),
        Break("pause-limited", "a limited claim takes a paused queue's jobs",
              (sql("claim_limited", "WHERE l.queue <> ALL(:none_paused)", "WHERE true"),),
              (f"{PAUSES}::test_a_paused_limited_queue_takes_nothing",), paused),
        Break("pause-next-due", "next_due counts a paused queue's jobs as work",
              (sql("next_due", "WHERE q.name <> ALL(:none_paused)", "WHERE true"),),
              (f"{PAUSES}::test_next_due_leaves_a_paused_queue_out",), paused),
        Break("resume-notify", "resuming a queue wakes no always-on worker",
              (sql("resume", "RETURNING pg_notify('jobs', queue)", "RETURNING queue"),),
              ("tests/commands/test_pause.py::test_a_running_worker_notices_a_pause_at_its_"
               "next_claim_and_a_resume_wakes_it",), paused),
        Break("limits-lock", "two drainers count a limit's room at once (no advisory lock)",
              (sql("limits_lock", "pg_advisory_xact_lock(", "("),),
              (f"{LIMITS}::test_a_claim_sees_what_committed_while_it_waited_even_"
               "under_repeatable_read",
               f"{LIMITS}::test_eight_drainers_never_run_more_than_the_concurrency_limit"),
              guards | {"limits"}),
    ]


BREAKS = _breaks()


@dataclass
class Outcome:
    name: str
    caught_by: list[str]  # each test that failed, with the first line of its failure
    problem: str | None  # why the break does not count as caught
    seconds: float

    def show(self) -> str:
        if self.problem:
            return f"{self.name}: {self.problem} ({self.seconds:.0f} s)"
        return "\n  ".join([f"{self.name}: caught ({self.seconds:.0f} s)", *self.caught_by])


def select(names: Sequence[str]) -> list[Break]:
    """The breaks named, or of the groups named; all of them when none is."""
    if not names:
        return list(BREAKS)
    known = {b.name for b in BREAKS} | {g for b in BREAKS for g in b.groups}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"breaks: unknown {', '.join(unknown)} (see --list)")
    return [b for b in BREAKS if b.name in names or b.groups & set(names)]


def broken_text(root: Path, brk: Break) -> dict[str, str]:
    """The files `brk` changes, as the break leaves them (ValueError on drift)."""
    texts: dict[str, str] = {}
    for edit in brk.edits:
        texts[edit.path] = edit.apply(texts.get(edit.path) or (root / edit.path).read_text())
    return texts


def copy_tree(brk: Break | None) -> Path:
    """A throwaway copy of the tree, with `brk` applied."""
    broken = broken_text(ROOT, brk) if brk else {}
    dest = Path(tempfile.mkdtemp(prefix="drainer-break-")) / "tree"
    dest.parent.chmod(0o755)  # the test clusters run as another user when root
    shutil.copytree(ROOT, dest, ignore=IGNORED)
    for path, text in broken.items():
        (dest / path).write_text(text)
    return dest


def pytest(tree: Path, args: Iterable[str], report: Path | None = None
           ) -> subprocess.CompletedProcess[str]:
    """pytest in `tree`, importing the tree's own drainer."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    extra = [f"--junitxml={report}"] if report else []
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           *extra, *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT)


def missing_tests(tree: Path, wanted: set[str]) -> set[str]:
    """The node ids of `wanted` that name no test (a test id covers its parameters)."""
    files = sorted({w.split("::")[0] for w in wanted})
    absent = {f for f in files if not (tree / f).exists()}
    listed = pytest(tree, ["--collect-only", *[f for f in files if f not in absent]])
    ids = [line.strip() for line in listed.stdout.splitlines() if "::" in line]
    return {w for w in wanted if w.split("::")[0] in absent or not any(
        i == w or i.startswith(w + "[") for i in ids)}


def failed_tests(report: Path) -> list[str]:
    """The tests whose own run failed (an error in a fixture is no failure), each with
    the first line of its failure: what caught the break, to tell from a collateral
    failure (a syntax error, say)."""
    failed = []
    for case in ET.parse(report).iter("testcase"):
        failure = case.find("failure")
        if failure is not None:
            path = case.get("classname", "").replace(".", "/") + ".py"
            why = (failure.get("message") or "").strip().split("\n")[0][:120]
            failed.append(f"{path}::{case.get('name')}: {why}")
    return failed


def run_break(brk: Break) -> Outcome:
    began = time.monotonic()
    tree = copy_tree(brk)
    try:
        report = tree.parent / "report.xml"
        proc = pytest(tree, brk.tests, report)
        seconds = time.monotonic() - began
        if proc.returncode != 1 or not report.exists():
            return Outcome(brk.name, [], _exit_problem(proc), seconds)
        failed = failed_tests(report)  # only the break's tests ran
        problem = None if failed else "only errors outside the tests (a fixture?): " + _tail(proc)
        return Outcome(brk.name, failed, problem, seconds)
    except subprocess.TimeoutExpired:
        return Outcome(brk.name, [], f"pytest ran past {RUN_TIMEOUT} s",
                       time.monotonic() - began)
    finally:
        shutil.rmtree(tree.parent, ignore_errors=True)


def _exit_problem(proc: subprocess.CompletedProcess[str]) -> str:
    if proc.returncode == 0:
        return "SURVIVED: its tests passed"
    meaning = {2: "interrupted", 3: "internal error", 4: "usage error or test not found",
               5: "no tests ran"}.get(proc.returncode, "unknown")
    return f"pytest exit {proc.returncode} ({meaning}): {_tail(proc)}"


def _tail(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return " | ".join(lines[-3:])


def unrunnable(breaks: list[Break]) -> dict[str, str]:
    """Why a break cannot be run, by name: its text drifted, or a test is absent."""
    problems = {}
    missing = missing_tests(ROOT, {t for b in breaks for t in b.tests})
    for brk in breaks:
        why = [f"test not found (or its module does not collect): {t}"
               for t in brk.tests if t in missing]
        try:
            broken_text(ROOT, brk)
        except (ValueError, OSError) as exc:
            why.append(f"does not apply: {exc}")
        if why:
            problems[brk.name] = "; ".join(why)
    return problems


def baseline(breaks: list[Break]) -> str | None:
    """None when every test the breaks name passes on the unbroken tree, run as the
    breaks are (which must import the copy's drainer, not an installed one)."""
    tree = copy_tree(None)
    try:
        imported = subprocess.run(
            [sys.executable, "-c", "import drainer; print(drainer.__file__)"], cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
        if not imported.stdout.startswith(str(tree)):
            return f"the copy imports drainer from elsewhere: {imported.stdout or imported.stderr}"
        proc = pytest(tree, sorted({t for b in breaks for t in b.tests}))
        return None if proc.returncode == 0 else _exit_problem(proc)
    finally:
        shutil.rmtree(tree.parent, ignore_errors=True)


def list_breaks(breaks: list[Break]) -> None:
    for brk in breaks:
        try:
            broken_text(ROOT, brk)
            state = "applies"
        except (ValueError, OSError) as exc:
            state = f"DRIFT: {exc}"
        print(f"{brk.name}  [{', '.join(sorted(brk.groups))}]  {state}\n  {brk.what}")
        for edit in brk.edits:
            print(f"  {edit.where()}: {edit.old!r} -> {edit.new!r} (x{edit.count})")
        for test in brk.tests:
            print(f"  caught by {test}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.breaks", description=__doc__.split("\n\n")[0],
        epilog="Breaks and groups: --list. Exit 1 if any break survives, no longer "
               "applies, names a test that does not exist, or the baseline fails.")
    parser.add_argument("names", nargs="*",
                        help="breaks or groups to run (default: every break)")
    parser.add_argument("--list", action="store_true", help="list the breaks and exit")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="breaks run at once (default 1)")
    args = parser.parse_args(argv)
    breaks = select(args.names)
    if args.list:
        list_breaks(breaks)
        return 0
    began = time.monotonic()
    problems = unrunnable(breaks)
    for name, problem in problems.items():
        print(f"{name}: NOT RUN, {problem}", flush=True)
    runnable = [b for b in breaks if b.name not in problems]
    failed = baseline(runnable) if runnable else None
    if failed:
        print(f"baseline: the unbroken tree fails its tests, nothing to judge: {failed}")
        return 1
    print(f"baseline: the tests pass unbroken ({time.monotonic() - began:.0f} s)", flush=True)
    outcomes = [Outcome(name, [], problem, 0) for name, problem in problems.items()]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for out in pool.map(run_break, runnable):
            print(out.show(), flush=True)
            outcomes.append(out)
    bad = [o.name for o in outcomes if o.problem]
    print(f"{len(outcomes)} breaks, {len(outcomes) - len(bad)} caught"
          + (f"; not caught: {', '.join(bad)}" if bad else "")
          + f" ({time.monotonic() - began:.0f} s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
