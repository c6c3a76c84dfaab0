"""What waiting costs: replay a day of jobs against a scale-to-zero compute, once per
way of waiting for work, and print what each cost (and the ideal).

    python -m bench.simulate [--day bench/day.json] [--timeout 5 --timeout 10]
                             [--chart docs/waiting-costs.png | --no-chart]
                             [--database-url URL]
    python -m bench.simulate --faults [--fault-rate 0.01 ...] [--backstop 60 ...]
    python -m bench.simulate --widening

Every strategy drains with drainer's own code on a real PostgreSQL: a throwaway
cluster of the embedded binaries unless --database-url names a database (its jobs
table is emptied before each replay).

The table is Markdown (docs/waiting-costs.md shows it). The chart needs the `bench` extra
(matplotlib); without it the table is still printed. A day with schedules also
checks that every strategy ran each slot of the day once, at or after its time
(exit 1 if not), and prints what one schedule alone costs ours on an otherwise
empty day, per expression in SCHEDULE_COSTS.

With --faults it replays ours instead, at the first suspend timeout, once per
backstop period and fault rate (FAULT_BACKSTOPS, FAULT_RATES): at rate r each kick
is lost, each run dies at its first job and each wake-up fails to arm with
probability r, and the database restarts at RESTART_AT (bench/simulator/faults.py).
The draws are fixed, so a replay gives the same figures every time.

With --widening it prints how a backlog of a million jobs widens, drainer's fleet
against SQS feeding Lambda (bench/simulator/widening.py: modelled drains, drainer's
own width decision), then replays ours with its fleet's default cap and with a cap
of 1 (never widening): on BACKLOG_DAY, 300 jobs due at once, and on the day.
"""

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from bench.simulator import day as days
from bench.simulator import widening
from bench.simulator.database import Database
from bench.simulator.faults import Faults
from bench.simulator.metrics import Result, ideal, percentile, replay, slot_problems, woken_slots
from bench.simulator.strategies import BACKSTOP_MINUTES, Ours, strategies
from bench.speed.pg import Server

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "docs" / "waiting-costs.png"
FLOOR = 0.1  # seconds: the chart's lowest latency
# One schedule alone on an otherwise empty day, each slot's job 1 s: what it costs.
SCHEDULE_COSTS = ("0 3 * * *", "0 * * * *", "*/15 * * * *", "*/10 * * * *", "*/5 * * * *")
FAULT_RATES = (0.0, 0.001, 0.01, 0.05, 0.2)
FAULT_BACKSTOPS: tuple[float | None, ...] = (None, BACKSTOP_MINUTES, 60.0, 15.0)  # minutes
RESTART_AT = "08:45"  # in the day's busiest burst
LATE = 60.0  # seconds: a start later than this missed its kick or its wake-up
# A backlog the kicks do not spread: 300 jobs of about 0.5 s, enqueued together and
# due a minute later, so one wake-up starts one run that meets them all.
BACKLOG_DAY = {"hours": 0.5, "seed": 1, "duration": {"median": 0.5, "sigma": 0.1, "max": 5},
               "scheduled": [{"at": "00:05", "due": "00:06", "jobs": 300}]}
WIDTHS = (None, 1, 100)  # ours's fleet caps replayed with --widening (None: the default)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        day = days.load(args.day)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bench.simulate: cannot read the day {args.day}: {exc}", file=sys.stderr)
        return 2
    timeouts = args.timeout or list(day.model.suspend_timeouts_minutes)
    if args.widening:
        print(widening.table())
        with database(args.database_url) as db:
            backlog = days.parse(BACKLOG_DAY)
            print()
            print(widths_table("A backlog: 300 jobs of about 0.5 s due at once", [
                replay(backlog, timeouts[0], Ours(max_width=w), db) for w in WIDTHS]))
            print()
            print(widths_table(f"The day, {len(day.specs)} jobs", [
                replay(day, t, Ours(max_width=w), db) for t in timeouts for w in WIDTHS[:2]]))
        return 0
    if args.faults:
        with database(args.database_url) as db:
            swept = sweep(day, timeouts[0], db, args.fault_rate or FAULT_RATES,
                          args.backstop or FAULT_BACKSTOPS)
            backoff = db.backoff
        print(parameters(day, args.day))
        print()
        print(faults_table(day, timeouts[0], swept, backoff))
        return 0
    with database(args.database_url) as db:
        results = replay_all(day, timeouts, db)
        backoff = db.backoff
        alone = schedule_costs(day, timeouts, db) if day.schedules else []
    print(parameters(day, args.day))
    for timeout, rows in results.items():
        print()
        print(table(day, timeout, rows, backoff))
    if alone:
        print()
        print(costs_table(day, timeouts, alone, backoff))
    if args.chart:
        try:
            chart(day, results, backoff, args.chart)
        except ImportError:
            print("bench.simulate: no chart (install the `bench` extra for matplotlib)",
                  file=sys.stderr)
        else:
            print(f"\nchart: {args.chart}", file=sys.stderr)
    problems = [p for rows in results.values() for r in rows for p in slot_problems(day, r)]
    for problem in problems:
        print(f"bench.simulate: a slot did not run once: {problem}", file=sys.stderr)
    return 1 if problems else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.simulate",
        description="Replay a day of jobs against a model of a scale-to-zero database "
                    "compute, once per way of waiting for work, and print what each "
                    "cost: hours awake, resumes, invocations, start latency.")
    parser.add_argument("--day", type=Path, default=days.DEFAULT,
                        help="the workload and model parameters (default: bench/day.json)")
    parser.add_argument("--timeout", type=float, action="append", metavar="MINUTES",
                        help="the compute's suspend timeout; repeatable "
                             "(default: the day file's, 5 and 10)")
    parser.add_argument("--chart", type=Path, default=CHART,
                        help="where to write the PNG chart (default: docs/waiting-costs.png)")
    parser.add_argument("--no-chart", dest="chart", action="store_const", const=None,
                        help="print the table only")
    parser.add_argument("--database-url", metavar="URL",
                        help="a database to replay on (default: a throwaway cluster's)")
    parser.add_argument("--faults", action="store_true",
                        help="replay ours with faults instead: a table per backstop period "
                             "and fault rate, at the first suspend timeout")
    parser.add_argument("--fault-rate", type=float, action="append", metavar="SHARE",
                        help="with --faults: a rate to replay; repeatable "
                             f"(default: {', '.join(f'{r:g}' for r in FAULT_RATES)})")
    parser.add_argument("--backstop", type=float, action="append", metavar="MINUTES",
                        help="with --faults: a backstop period, 0 for none; repeatable "
                             "(default: none, 6 h, 1 h, 15 min)")
    parser.add_argument("--widening", action="store_true",
                        help="print how a backlog widens, drainer's fleet against SQS's "
                             "ramp, then replay ours with and without widening")
    return parser.parse_args(argv)


@contextlib.contextmanager
def database(url: str | None) -> Iterator[Database]:
    """The database the replays drain: `url`'s, or one of a throwaway cluster."""
    server = None
    if url is None:
        server = Server()
        url = server.create("simulate")
    db = Database(url)
    try:
        yield db
    finally:
        db.close()
        if server:
            server.stop()


def replay_all(day: days.Day, timeouts: list[float], db: Database
               ) -> dict[float, list[Result]]:
    """Every strategy at every timeout. A replay in which the compute never suspended
    is the same at a longer timeout (no gap between state changes reached the
    shorter one), so it is not run again: polling every second is most of the time."""
    results: dict[float, list[Result]] = {}
    shorter: list[Result] | None = None
    for timeout in sorted(set(timeouts)):
        results[timeout] = shorter = [
            replace(done, timeout_minutes=timeout)
            if shorter and (done := shorter[i]).suspensions == 0
            else replay(day, timeout, strategy, db)
            for i, strategy in enumerate(strategies())]
    return {timeout: results[timeout] for timeout in timeouts}


def schedule_costs(day: days.Day, timeouts: list[float], db: Database
                   ) -> list[tuple[days.Day, dict[float, Result]]]:
    """Ours, with no backstop (its ticks would cost the same with or without a
    schedule), on the day emptied of its jobs and schedules but for one schedule, per
    expression of SCHEDULE_COSTS, at every timeout."""
    found = []
    for cron in SCHEDULE_COSTS:
        alone = replace(day, enqueues=[], schedules=[days.Periodic("alone", cron)])
        found.append((alone, {t: replay(alone, t, Ours(backstop=None), db) for t in timeouts}))
    return found


def sweep(day: days.Day, timeout: float, db: Database, rates: Sequence[float],
          backstops: Sequence[float | None]) -> list[tuple[float, Result]]:
    """Ours at every backstop period (0 or None: none) and fault rate; the restart
    only on a day that reaches its time."""
    at = days.clock(RESTART_AT)
    restart = (at,) if at < day.seconds else ()
    return [(rate, replay(day, timeout, Ours(backstop=backstop or None), db,
                          Faults.at_rate(rate, restarts=restart)))
            for backstop in backstops for rate in rates]


def faults_table(day: days.Day, timeout: float, rows: list[tuple[float, Result]],
                 backoff: list[float]) -> str:
    """What each backstop period costs and how late jobs start, per fault rate."""
    awake, bursts = ideal(day, timeout, backoff)
    lines = [
        f"Ours with faults, suspend timeout {timeout:g} min; ideal {awake:.2f} h awake in "
        f"{bursts} bursts. At rate r each kick is lost, each run dies at its first job and "
        f"each wake-up fails to arm with probability r; above 0 the database also restarts "
        f"at {RESTART_AT}. *Wait*: from a job's commit, or its run_at, to its start.",
        "",
        "| strategy | fault rate | awake h | × ideal | resumes | invocations | wait p50 "
        "| wait p99 | wait max | late > 1 min | unfinished | kicks lost | runs died "
        "| arms failed |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for rate, r in rows:
        starts = r.starts
        cells = [r.strategy, f"{100 * rate:g} %", f"{r.awake_hours:.2f}",
                 f"{r.awake_hours / awake:.2f}", str(r.resumes), str(r.invocations),
                 *(duration(percentile(starts, q)) for q in (0.5, 0.99, 1.0)),
                 str(sum(s > LATE for s in starts)), str(r.unfinished),
                 *(str(r.injected.get(k, 0)) for k in ("lost_kicks", "dead_runs",
                                                       "failed_arms"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def widths_table(title: str, rows: list[Result]) -> str:
    """Ours at each fleet cap: what it cost, how many members it started to widen."""
    lines = [f"{title}, ours at each fleet cap:", "",
             "| strategy | suspend timeout | awake h | resumes | invocations | fan-outs "
             "| worker h | start p99 | due max |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        cells = [r.strategy, f"{r.timeout_minutes:g} min", f"{r.awake_hours:.2f}",
                 str(r.resumes), str(r.invocations), str(r.fanouts), f"{r.worker_hours:.2f}",
                 duration(percentile(r.latency, 0.99)), duration(percentile(r.lateness, 1.0))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parameters(day: days.Day, path: Path) -> str:
    specs = day.specs
    retried = sum(s.failures > 0 for s in specs)
    ahead = sum(s.run_at is not None for s in specs)
    model = {k: v for k, v in vars(day.model).items() if k != "suspend_timeouts_minutes"}
    periodic = ", ".join(f"{p.name} `{p.cron}` ({p.seconds:g} s)" for p in day.schedules)
    return (f"Day {day.start:%Y-%m-%d} from {path.name}: {len(specs)} jobs "
            f"({retried} failing at least once, {ahead} scheduled hours ahead), "
            f"{sum(s.duration for s in specs) / 60:.0f} min of handler time"
            + (f"; schedules {periodic}: {len(day.slots)} slots" if periodic else "")
            + f".\nModel: {json.dumps(model)}")


def table(day: days.Day, timeout: float, results: list[Result], backoff: list[float]) -> str:
    awake, bursts = ideal(day, timeout, backoff)
    lines = [
        f"Suspend timeout {timeout:g} min; ideal {awake:.2f} h awake in {bursts} bursts.",
        "",
        "| strategy | awake h | × ideal | resumes | invocations | worker h "
        "| start p50 | start p99 | start max | due p99 | due max | slots run | slot late max |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        f"| ideal: work + one timeout per burst | {awake:.2f} | 1.00 | {bursts} "
        f"| | | | | | | | {len(day.slots)} | |",
    ]
    for r in results:
        cells = [
            r.strategy, f"{r.awake_hours:.2f}", f"{r.awake_hours / awake:.2f}",
            str(r.resumes), "always on" if r.invocations is None else str(r.invocations),
            f"{r.worker_hours:.1f}",
            *(duration(percentile(r.latency, q)) for q in (0.5, 0.99, 1.0)),
            *(duration(percentile(r.lateness, q)) for q in (0.99, 1.0)),
            str(len(r.slot_starts)), duration(percentile(r.slot_lateness, 1.0)),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    unfinished = [f"{r.strategy}: {r.unfinished}" for r in results if r.unfinished]
    if unfinished:
        lines.append(f"\nJobs not finished when the day ends: {', '.join(unfinished)}.")
    woken = [f"{r.strategy}: {n}" for r in results
             if (n := woken_slots(day, r)) is not None and day.slots]
    if woken:
        lines.append(f"\nSlots (of {len(day.slots)}) whose minute a wake-up fired at: "
                     f"{', '.join(woken)}.")
    return "\n".join(lines)


def costs_table(day: days.Day, timeouts: list[float],
                rows: list[tuple[days.Day, dict[float, Result]]], backoff: list[float]) -> str:
    """What one schedule alone costs ours, per expression, at every timeout."""
    head = " | ".join(f"awake h at {t:g} min | × ideal | resumes" for t in timeouts)
    lines = [f"One schedule alone on an otherwise empty {day.seconds / 3600:g} h day "
             "(each slot's job 1 s), ours with no backstop:", "",
             f"| schedule | slots | {head} |", "|---|--:|" + "--:|--:|--:|" * len(timeouts)]
    for alone, results in rows:
        cells = [f"`{alone.schedules[0].cron}`", str(len(alone.slots))]
        for t in timeouts:
            awake = ideal(alone, t, backoff)[0]
            r = results[t]
            cells += [f"{r.awake_hours:.2f}",
                      f"{r.awake_hours / awake:.2f}" if awake else "", str(r.resumes)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{1000 * seconds:.0f} ms"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def chart(day: days.Day, results: dict[float, list[Result]], backoff: list[float],
          path: Path) -> None:
    """Awake hours against p99 start latency: one panel per suspend timeout, one
    labelled point per strategy, the ideal as a dotted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4.2), dpi=90,
                             sharey=True, squeeze=False)
    for ax, (timeout, rows) in zip(axes[0], results.items(), strict=True):
        awake, _ = ideal(day, timeout, backoff)
        ax.axvline(awake, color="grey", linestyle=":", linewidth=1)
        ax.annotate("ideal", (awake, 9000), xytext=(3, 0), textcoords="offset points",
                    fontsize=7, color="grey")
        started = [r for r in rows if r.latency]  # a strategy that started nothing has no p99
        points = [(r.awake_hours, math.log10(_p99(r))) for r in started]
        placed: list[tuple[float, float, float]] = []
        for r in sorted(started, key=lambda r: -_p99(r)):  # top down
            x, y = r.awake_hours, _p99(r)
            ax.scatter(x, y, s=36, color=plt.cm.tab10(rows.index(r)), edgecolor="black",
                       linewidth=0.4, zorder=3)
            ax.annotate(r.strategy, (x, y), **_label_place(r.strategy, x, math.log10(y), placed,
                                                          points))
        ax.set_yscale("log")
        ax.set_ylim(FLOOR, 20000)
        ax.set_xlim(0, 25.5)
        ax.set_xlabel("compute awake, hours per day")
        ax.set_title(f"suspend timeout {timeout:g} min", fontsize=9)
        ax.grid(True, linewidth=0.3)
    axes[0][0].set_ylabel("p99 job start latency, seconds")
    slots = f" and {len(day.slots)} schedule slots" if day.slots else ""
    fig.suptitle(f"What waiting costs: one day, {len(day.specs)} jobs{slots}, "
                 f"resume {day.model.resume:g} s", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _p99(result: Result) -> float:
    """The p99 start latency as charted: at least the axis's floor (statements take
    no virtual time, so a LISTEN worker may start a job the instant it commits)."""
    return max(FLOOR, percentile(result.latency, 0.99))


def _label_place(text: str, x: float, log_y: float, placed: list[tuple[float, float, float]],
                 points: list[tuple[float, float]]) -> dict:
    """Where a point's label goes: beside it, toward the middle of the chart, nudged
    down off the labels already placed and the points it would cover (in hours and
    decades; a character is about a third of an hour wide at this size)."""
    right = x > 16
    width = 0.34 * len(text)
    begin, end = (x - 0.6 - width, x - 0.6) if right else (x + 0.6, x + 0.6 + width)

    def clashes(ly: float) -> bool:
        return (any(b < end and begin < e and abs(ly - py) < 0.2 for b, e, py in placed)
                or any(begin < px < end and abs(ly - py) < 0.2 for px, py in points))

    while clashes(log_y):
        log_y -= 0.2
    placed.append((begin, end, log_y))
    return {"xytext": (x - 0.6 if right else x + 0.6, 10**log_y), "fontsize": 7,
            "ha": "right" if right else "left", "va": "center",
            "arrowprops": {"arrowstyle": "-", "linewidth": 0.3, "color": "grey"}}


if __name__ == "__main__":
    sys.exit(main())
