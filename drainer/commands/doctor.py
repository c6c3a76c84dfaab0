"""`doctor`: what makes a queue slow or keeps a scale-to-zero compute awake, with
what to do about each finding (the common jobs-table pitfalls, checked on the live database).

A "problem" makes `doctor` exit 1; a "note" is worth knowing but harmless alone.
Session checks cover this database's sessions: the horizon that holds back vacuum
is per database, and `doctor`'s own session is left out. Their query text is shown
with its string literals and comments masked.
"""

import argparse
import itertools
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

import psycopg

from .. import defaults
from ..settings import DEFAULT_MAX_READY_AGE
from ..storage import pauses, sql
from ..storage.admin import due
from ..storage.claim import MANY_QUEUES, claim_kind, claim_sql
from ..storage.limits import describe, fills
from ..tasks import select
from .common import emit, open_db
from .stats import paused_line, paused_queues

IDLE_IN_TRANSACTION = 1.0  # seconds idle inside a transaction before it is a problem
LONG_TRANSACTION = 60.0  # seconds any transaction may stay open
BUSY = 1.0  # seconds a query may run before it counts as keeping the compute awake
RECENT = 300.0  # an idle session that queried this recently resets the suspend timer
DEAD_MIN, DEAD_SHARE = 1000, 0.2  # dead tuples past both (share of live) need vacuum
PLAN_MIN_ROWS = 1000  # below this a sequential scan is cheap and the planner is right
CLAIM_BATCH = 10
CLAIM_PROBE = {"lease": defaults.LEASE, "now": None}


@dataclass
class Finding:
    check: str
    severity: str  # "problem" or "note"
    summary: str
    advice: str
    details: list[dict[str, object]] = field(default_factory=list)


class Report(TypedDict):
    """`doctor --json`."""

    problems: int
    notes: int
    findings: list[dict[str, object]]  # each Finding, as dataclasses.asdict makes it


# A node of an EXPLAIN (FORMAT JSON) plan: the keys `_scans` reads, among many others.
PlanNode = TypedDict("PlanNode", {"Node Type": str, "Index Name": str, "Relation Name": str,
                                  "Plans": list["PlanNode"]}, total=False)


@dataclass
class Session:
    pid: int
    usename: str | None
    application_name: str | None
    state: str | None
    connected_seconds: float | None
    state_seconds: float | None
    transaction_seconds: float | None
    query: str | None

    def describe(self) -> dict[str, object]:
        return {k: round(v, 1) if isinstance(v, float) else v for k, v in asdict(self).items()}


MASK = "***"
# As PostgreSQL's lexer reads them; any character beyond ASCII counts as a letter.
# Non-ASCII as [^\x00-\x7f], which compiles 30 times faster than the range
# \x80-\U0010ffff (10 ms at every start of the CLI, which imports this module).
_IDENTIFIER = re.compile(r"(?:[A-Za-z_]|[^\x00-\x7f])(?:[A-Za-z0-9_$]|[^\x00-\x7f])*")
_DOLLAR_TAG = re.compile(r"\$(?:(?:[A-Za-z_]|[^\x00-\x7f])(?:[A-Za-z0-9_]|[^\x00-\x7f])*)?\$")


def mask_literals(query: str) -> str:
    """`query` with what its string literals and comments hold replaced by ***.

    Another session's statement may carry a password (ALTER ROLE ... PASSWORD '...')
    or personal data; its shape stays, enough to find the code that sent it. Whether
    a backslash escapes a quote in a plain '...' depends on the sender's
    standard_conforming_strings, which doctor cannot see: what either reading takes
    for a literal is masked. A literal or comment cut off by the truncation of the
    text is masked to its end."""
    hidden = [False] * len(query)
    for backslash_escapes in (False, True):
        for start, end in _secret_spans(query, backslash_escapes):
            hidden[start:end] = [True] * (end - start)
    return "".join(MASK if masked else "".join(c for _, c in run)
                   for masked, run in itertools.groupby(zip(hidden, query, strict=True),
                                                        key=lambda pair: pair[0]))


def _secret_spans(text: str, backslash_escapes: bool) -> Iterator[tuple[int, int]]:
    """(start, end) of every literal's and comment's content, as PostgreSQL's lexer
    reads them; quoted identifiers are names, shown as they are."""
    i = 0
    while i < len(text):
        if text.startswith("--", i):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            yield i + 2, end
            i = end
        elif text.startswith("/*", i):
            end, after = _block_comment(text, i + 2)
            yield i + 2, end
            i = after
        elif text[i] in "'\"":
            end, after = _quoted(text, i + 1, text[i], text[i] == "'" and backslash_escapes)
            if text[i] == "'":
                yield i + 1, end
            i = after
        elif (tag := _DOLLAR_TAG.match(text, i)):
            end = text.find(tag.group(), tag.end())
            end = len(text) if end < 0 else end
            yield tag.end(), end
            i = min(len(text), end + len(tag.group()))
        elif (name := _IDENTIFIER.match(text, i)):  # whole, so a $ in it starts no quote
            i = name.end()
            if name.group() in ("E", "e") and text.startswith("'", i):  # E'...': escapes
                end, after = _quoted(text, i + 1, "'", True)
                yield i + 1, end
                i = after
        else:
            i += 1


def _quoted(text: str, i: int, quote: str, backslash_escapes: bool) -> tuple[int, int]:
    """From just inside a quote: where its content ends, and where reading goes on."""
    while i < len(text):
        # A backslash escapes the next character; a doubled quote stands for itself.
        if (backslash_escapes and text[i] == "\\") or text.startswith(quote * 2, i):
            i += 2
        elif text[i] == quote:
            return i, i + 1
        else:
            i += 1
    return len(text), len(text)


def _block_comment(text: str, i: int) -> tuple[int, int]:
    """From just inside /*: where the content ends, and where reading goes on.
    Block comments nest in SQL."""
    depth = 1
    while i < len(text):
        if text.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif text.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i - 2, i
        else:
            i += 1
    return len(text), len(text)


def _session(row: tuple[Any, ...]) -> Session:
    """A session as doctor shows it, with nothing its query's literals hold."""
    session = Session(*row)
    if session.query:
        session.query = mask_literals(session.query)
    return session


def _fetch(conn: psycopg.Connection, name: str, params: sql.Params = None
           ) -> list[tuple[Any, ...]]:
    return sql.rows(conn, name, params)


def _transactions(sessions: list[Session]) -> list[Finding]:
    idle = [s for s in sessions if (s.state or "").startswith("idle in transaction")
            and (s.state_seconds or 0) > IDLE_IN_TRANSACTION]
    long = [s for s in sessions if (s.transaction_seconds or 0) > LONG_TRANSACTION]
    held = {s.pid: s for s in idle + long}
    if not held:
        return []
    oldest = max(s.transaction_seconds or 0 for s in held.values())
    return [Finding(
        "open_transaction", "problem",
        f"{len(idle)} session(s) idle in transaction for over {IDLE_IN_TRANSACTION:g}s, "
        f"{len(long)} transaction(s) open for over {LONG_TRANSACTION:g}s; the oldest open "
        f"transaction began {oldest:.1f}s ago. Until it ends, vacuum cannot remove rows that "
        "died after it began, in every table of this database (the jobs table bloats "
        "first), and a session that is not idle keeps a scale-to-zero compute awake",
        "commit or roll back promptly and never hold a transaction while a job runs; end "
        "one with SELECT pg_terminate_backend(pid); set idle_in_transaction_session_timeout "
        "(e.g. '1min') for the application's role",
        [s.describe() for s in held.values()])]


def _awake(sessions: list[Session]) -> list[Finding]:
    found = []
    busy = [s for s in sessions if s.state not in (None, "idle")
            and not s.state.startswith("idle in transaction") and (s.state_seconds or 0) > BUSY]
    if busy:
        found.append(Finding(
            "busy_sessions", "problem",
            f"{len(busy)} session(s) running the same query for over {BUSY:g}s: a compute "
            "stays awake while any session is not idle",
            "look at each query; a drain in progress is expected, anything else should "
            "finish, be tuned, or run on a schedule",
            [s.describe() for s in busy]))
    pollers = [s for s in sessions if s.state == "idle" and (s.state_seconds or 0) < RECENT
               and (s.connected_seconds or 0) - (s.state_seconds or 0) > 1.0
               and not _listening(s)]
    if pollers:
        found.append(Finding(
            "recurring_queries", "problem",
            f"{len(pollers)} long-lived session(s) queried within the last {RECENT:g}s "
            "(pollers, pool health checks): an idle session counts as activity at its last "
            "query, so anything that queries more often than the suspend timeout keeps a "
            "scale-to-zero compute awake",
            "poll less often than the suspend timeout, or not at all (drain on a schedule, or "
            "right after an enqueue); turn off the pool's health checks or keep-alive queries; "
            "the application_name says whose each session is",
            [s.describe() for s in pollers]))
    listening = [s for s in sessions if _listening(s)]
    if listening:
        found.append(Finding(
            "listen_sessions", "note",
            f"{len(listening)} session(s) waiting on LISTEN (their last query): a suspend "
            "closes them, and a listener that reconnects at once wakes the compute again",
            "on a scale-to-zero compute prefer a drain on a schedule or after an enqueue; "
            "a listener needs a direct connection, never a transaction pooler",
            [s.describe() for s in listening]))
    return found


def _listening(s: Session) -> bool:
    # PostgreSQL shows no list of listeners; the last query is the best sign we have.
    return s.state == "idle" and (s.query or "").lstrip().upper().startswith("LISTEN")


def _visibility(conn: psycopg.Connection) -> list[Finding]:
    if _fetch(conn, "doctor_sees_all_sessions")[0][0]:
        return []
    return [Finding(
        "visibility", "note",
        "this role sees the state and query of its own sessions only",
        "run doctor as a role with pg_read_all_stats (GRANT pg_read_all_stats TO ...) to "
        "check every session")]


def _vacuum(conn: psycopg.Connection) -> list[Finding]:
    rows = _fetch(conn, "table_health")
    if not rows:
        return []
    live, dead, autovacuum, vacuum = rows[0]
    if dead < DEAD_MIN or dead <= DEAD_SHARE * live:
        return []
    last = max(filter(None, (autovacuum, vacuum)), default=None)
    return [Finding(
        "dead_tuples", "problem",
        f"jobs has {dead} dead tuples for {live} live ones; last autovacuum "
        f"{autovacuum.isoformat() if autovacuum else 'never'}, last vacuum "
        f"{vacuum.isoformat() if vacuum else 'never'}",
        "end long or idle-in-transaction sessions first (vacuum cannot remove what they may "
        "still see), then VACUUM jobs; a queue table churns, so let autovacuum visit it "
        "sooner: ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.01)"
        + ("" if last else "; autovacuum has never run on it: check that autovacuum is on"),
        [{"n_live_tup": live, "n_dead_tup": dead}])]


def _scans(plan: PlanNode) -> list[str]:
    """Every scan node of an EXPLAIN (FORMAT JSON) plan, as 'Node Type [index] on table'."""
    node = f"{plan.get('Node Type')}"
    if "Index Name" in plan:
        node += f" using {plan['Index Name']}"
    found = [f"{node} on {plan['Relation Name']}"] if "Relation Name" in plan else []
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


def _claim_plan(conn: psycopg.Connection, queues: list[str]) -> list[Finding]:
    by_priority = sql.features(conn).priority
    names = [name for name in READY_INDEXES if by_priority or name == "jobs_ready_idx"]
    rows = 0.0
    for name in names:
        valid, rows = _fetch(conn, "doctor_ready_index", {"index": name})[0]
        if not valid:
            return [Finding(
                "claim_plan", "problem",
                f"{name} is {'missing' if valid is None else 'invalid'}: every claim "
                "scans the whole jobs table, done history included",
                ("" if valid is None else f"DROP INDEX CONCURRENTLY {name}; then ")
                + _create(name))]
    # The very statement a drain of these queues sends, its batch size written in.
    text = sql.QUERIES["explain"] + "\n" + claim_sql(CLAIM_BATCH, *claim_kind(conn),
                                                     many=len(queues) > MANY_QUEUES)
    [(plan,)] = sql.execute(conn, text, {"queues": queues, **CLAIM_PROBE}).fetchall()
    scans = _scans(plan[0]["Plan"])
    if (rows or 0) < PLAN_MIN_ROWS or any(name in s for s in scans for name in names):
        return []
    return [Finding(
        "claim_plan", "problem",
        f"the claim's plan does not use {' or '.join(names)} ({'; '.join(scans)}), on a "
        f"table of about {rows:.0f} rows",
        "ANALYZE jobs; check that enable_indexscan and enable_bitmapscan are on for this "
        "role and database, and that " + "; ".join(
            f"{name} is " + _create(name).split(" ON ", 1)[1] for name in names),
        [{"scans": scans}])]


# The partial indexes a claim reads, and their columns: the classic one, and the one
# migration 6 adds for the claim by priority.
READY_INDEXES = {"jobs_ready_idx": "queue, run_at",
                 "jobs_priority_idx": "queue, priority DESC, run_at"}


def _create(name: str) -> str:
    return (f"CREATE INDEX CONCURRENTLY {name} ON jobs ({READY_INDEXES[name]}) "
            "WHERE status = 'queued'")


def _jobs(conn: psycopg.Connection, max_ready_age: float) -> tuple[list[Finding], list[str]]:
    text = sql.variant("doctor_jobs", **pauses.swaps(sql.features(conn)))
    expired, expired_seconds, oldest, queues = sql.execute(conn, text).fetchall()[0]
    found = []
    if expired:
        found.append(Finding(
            "expired_leases", "problem",
            f"{expired} running job(s) with an expired lease, the oldest {expired_seconds:.0f}s "
            "ago: no reaper has run since, so they wait",
            "run a drain (it reaps first) or `drainer reap` on a schedule; if workers crash, "
            "find out why; if jobs outlive their lease, raise --lease"))
    if oldest is not None and oldest > max_ready_age:
        found.append(Finding(
            "oldest_ready", "problem",
            f"the oldest ready job has waited {oldest:.0f}s (over {max_ready_age:g}s)",
            "drain more often, or with more --concurrency or more drainers; check that a "
            "drain runs for every queue that has jobs (`drainer stats`)"))
    return found, queues or ["default"]


def _limits(conn: psycopg.Connection) -> list[Finding]:
    """A note per limited queue that holds jobs back: a full limit explains a ready job
    that waits, and is no fault."""
    return [Finding("limit", "note", describe(fill),
                    "as meant by the queue's @task(concurrency=, per_group=, rate=); raise "
                    "the limit if the wait is too long (`--concurrency` is one process's "
                    "handlers at once, not this)", [dict(fill)])
            for fill in fills(conn) if fill["held"]]


def _paused(conn: psycopg.Connection) -> list[Finding]:
    """A note per paused queue: its jobs wait as meant, and the oldest ready age
    leaves them out."""
    return [Finding("paused", "note", paused_line(p),
                    f"`drainer resume {p['queue']}` when its jobs should run again",
                    [dict(p)])
            for p in paused_queues(conn)]


def _no_task(conn: psycopg.Connection, known: Sequence[str] | None) -> list[Finding]:
    """A problem when ready jobs wait in queues none of the `known` tasks handles (not
    checked without them): no drain of these tasks will ever run those jobs."""
    stray = [] if known is None else due(conn, [], known=known).no_task
    return [Finding(
        "no_task", "problem", f"ready jobs in queues no task drains: {', '.join(stray)}",
        "check the queue name the producer enqueues to, or name the module that defines "
        "the queue's @task in --tasks (DRAINER_TASKS)", [{"queue": q} for q in stray])
    ] if stray else []


def diagnose(conn: psycopg.Connection, *, max_ready_age: float = DEFAULT_MAX_READY_AGE,
             tasks: Sequence[str] | None = None) -> list[Finding]:
    """Every finding, problems first; an empty list means healthy. `tasks`: the queues
    that have a task, to find ready jobs that none will run."""
    sessions = [_session(row) for row in _fetch(conn, "doctor_sessions")]
    job_findings, queues = _jobs(conn, max_ready_age)
    found = [*_transactions(sessions), *_vacuum(conn), *_claim_plan(conn, queues),
             *job_findings, *_no_task(conn, tasks), *_limits(conn), *_paused(conn),
             *_awake(sessions),
             *_visibility(conn)]
    return sorted(found, key=lambda f: f.severity != "problem")


def as_json(findings: list[Finding]) -> Report:
    problems = sum(f.severity == "problem" for f in findings)
    return {"problems": problems, "notes": len(findings) - problems,
            "findings": [asdict(f) for f in findings]}


def format_findings(findings: list[Finding]) -> str:
    """The terminal report: each finding, what to do, and the sessions or rows behind it."""
    lines = []
    for f in findings:
        lines += [f"{f.severity}: {f.check}: {f.summary}", f"  what to do: {f.advice}"]
        lines += [f"  - {json.dumps(d, default=str)}" for d in f.details]
    data = as_json(findings)
    lines.append(f"doctor: {data['problems']} problem(s), {data['notes']} note(s)"
                 if findings else "doctor: no problem found")
    return "\n".join(lines)


def cmd_doctor(args: argparse.Namespace) -> None:
    # With task modules, ready jobs that none of their tasks handles are a finding.
    known = list(select(args.tasks, [])[0]) if args.tasks else None
    with open_db(args) as conn:
        findings = diagnose(conn, max_ready_age=args.max_ready_age, tasks=known)
    if args.json:
        emit(as_json(findings))
    else:
        print(format_findings(findings))
    if any(f.severity == "problem" for f in findings):
        raise SystemExit(1)
