"""Results: min / median / max of the runs, the speed goals as ratios of
medians, the I/O-bound figures against their ideal, the widths' speed-up over one
process against the database's ceiling, and Markdown tables (docs/performance.md
shows them)."""

import statistics
from dataclasses import dataclass

from .systems import CEILING, IO_FIGURES, LOADS, WIDTH_FIGURES

# figure -> (column title, how a value is shown)
FIGURES = {
    "noop_1": ("no-op jobs/s, 1 process", "{:,.0f}"),
    "noop_4": ("no-op jobs/s, 4 processes", "{:,.0f}"),
    "sleep_1": ("10 ms jobs/s, 8 threads, 1 process", "{:,.0f}"),
    "sleep_4": ("10 ms jobs/s, 8 threads, 4 processes", "{:,.0f}"),
    "cold_start": ("cold start, s", "{:.3f}"),
    "rss": ("peak RSS, MB", "{:.1f}"),
    "statements": ("statements per job", "{:.3f}"),
}


def summary(values: list[float]) -> dict:
    return {"runs": values, "min": min(values), "median": statistics.median(values),
            "max": max(values)}


def cell(stats: dict | str | None, fmt: str) -> str:
    if stats is None:
        return "–"  # not measured for this system
    if isinstance(stats, str):
        return "n/a"
    med, lo, hi = (fmt.format(stats[k]) for k in ("median", "min", "max"))
    return med if lo == hi else f"{med} ({lo} – {hi})"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def systems_table(results: dict) -> str:
    """One row per system; each cell the median and, in brackets, min – max. A
    figure no system measured (a run of some figures only) has no column."""
    measured = {f for data in results["systems"].values() for f in data.get("figures", {})}
    shown = {f: v for f, v in FIGURES.items() if f in measured} or FIGURES
    header = ["system", *(title for title, _ in shown.values())]
    rows = []
    for name, data in results["systems"].items():
        figures = data.get("figures", {})
        unavailable = "n/a" if data.get("unavailable") else None
        rows.append([name, *(cell(figures.get(f, unavailable), fmt)
                             for f, (_, fmt) in shown.items())])
    notes = []
    for name, data in results["systems"].items():
        if data.get("unavailable"):
            notes.append(f"- {name}: n/a, {data['unavailable']}")
        notes += [f"- {name}, {FIGURES[f][0]}: n/a, {why}"
                  for f, why in data.get("figures", {}).items()
                  if isinstance(why, str) and f in FIGURES]
    return "\n".join([_table(header, rows), *([""] + notes if notes else [])])


def extras_table(results: dict) -> str:
    e = results["enqueue"]
    c = results["claim"]
    rows = [
        ["bulk enqueue, rows/s: drainer.enqueue_many", cell(e.get("drainer"), "{:,.0f}")],
        ["bulk enqueue, rows/s: bare COPY", cell(e.get("copy"), "{:,.0f}")],
        ["claim of 10, ms: no finished rows", cell(c.get("empty"), "{:.3f}")],
        [f"claim of 10, ms: {c['finished']:,} finished rows", cell(c.get("history"), "{:.3f}")],
    ]
    if "keyed" in e:
        rows.insert(2, ["bulk enqueue, rows/s: enqueue_many with keys",
                        cell(e.get("keyed"), "{:,.0f}")])
    if "future" in c:
        rows.append([f"claim of 10, ms: {c['future_rows']:,} high-priority jobs due later",
                     cell(c.get("future"), "{:.3f}")])
    return _table(["figure", "median (min – max)"], rows)


@dataclass
class Goal:
    text: str
    numerator: tuple[str, ...]  # a path into the results
    denominator: tuple[str, ...]
    target: float
    at_least: bool  # True: ratio >= target; False: ratio <= target


def _versus_loop(text: str, figure: str, target: float, at_least: bool,
                 system: str = "drainer") -> Goal:
    """A goal that compares drainer with the hand-written batch loop on one figure."""
    return Goal(text, ("systems", system, "figures", figure),
                ("systems", "loop-batch", "figures", figure), target, at_least)


GOALS = [
    _versus_loop("drain, 1 process, default settings / hand-written batch loop",
                 "noop_1", 2.0, True),
    _versus_loop("drain, 4 processes, default settings / hand-written batch loop",
                 "noop_4", 1.5, True),
    _versus_loop("drain --batch-size 10, 1 process / hand-written batch loop",
                 "noop_1", 0.95, True, system="drainer --batch-size 10"),
    _versus_loop("cold start on an empty queue / hand-written loop", "cold_start", 1.15, False),
    _versus_loop("peak RSS / hand-written loop", "rss", 1.15, False),
    Goal("bulk enqueue (enqueue_many) / bare COPY",
         ("enqueue", "drainer"), ("enqueue", "copy"), 0.9, True),
    Goal("claim latency with 1M finished rows / with none",
         ("claim", "history"), ("claim", "empty"), 1.2, False),
    Goal("drain, keys and priorities on every job / plain jobs, 1 process",
         ("systems", "drainer, keys and priorities", "figures", "noop_1"),
         ("systems", "drainer", "figures", "noop_1"), 0.9, True),
    Goal("drain, keys and priorities on every job / plain jobs, 4 processes",
         ("systems", "drainer, keys and priorities", "figures", "noop_4"),
         ("systems", "drainer", "figures", "noop_4"), 0.9, True),
    Goal("drain, keys and priorities on every job / the hand-made table, 1 process",
         ("systems", "drainer, keys and priorities", "figures", "noop_1"),
         ("systems", "drainer, hand-made table", "figures", "noop_1"), 0.9, True),
    # The limited claim's cost, at one process: with four, the limit itself decides (50
    # jobs in flight in all, against 200 without it; docs/performance.md, Flow control).
    Goal("drain, limited to 50 running / no limit, claims of 50, 1 process",
         ("systems", "drainer, concurrency limit 50", "figures", "noop_1"),
         ("systems", "drainer --concurrency 50 --batch-size 50, no limit", "figures",
          "noop_1"), 0.8, True),
    Goal("drain of 10 ms jobs, limited to 50 running / no limit, 8 threads, 1 process",
         ("systems", "drainer, concurrency limit 50", "figures", "sleep_1"),
         ("systems", "drainer", "figures", "sleep_1"), 0.8, True),
    Goal("bulk enqueue with keys / without", ("enqueue", "keyed"), ("enqueue", "drainer"),
         0.5, True),
    Goal("claim latency with 100,000 high-priority jobs due later / with none",
         ("claim", "future"), ("claim", "empty"), 1.2, False),
]


def _median(results: dict, path: tuple[str, ...]) -> float | None:
    node = results
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node["median"] if isinstance(node, dict) else None


def ratios(results: dict) -> list[dict]:
    out = []
    for goal in GOALS:
        num, den = _median(results, goal.numerator), _median(results, goal.denominator)
        ratio = num / den if num is not None and den else None
        met = None if ratio is None else (ratio >= goal.target if goal.at_least
                                          else ratio <= goal.target)
        out.append({"goal": goal.text, "ratio": ratio,
                    "target": f"{'≥' if goal.at_least else '≤'} {goal.target:g}×", "met": met})
    return out


def goals_table(rows: list[dict]) -> str:
    body = [[r["goal"], "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}×", r["target"],
             {True: "met", False: "missed", None: "n/a"}[r["met"]]] for r in rows]
    return _table(["goal (ratio of medians, one run)", "ratio", "goal", ""], body)


def io_rows(results: dict) -> list[dict]:
    """Each I/O-bound figure against its ideal (concurrency / 10 ms) and against
    min(ideal, the database's limit): drainer's 1-process no-op rate in the same run,
    which no concurrency of 10 ms handlers can pass. `jobs_s` is the figure's summary,
    or why it is n/a."""
    limit = _median(results, ("systems", "drainer", "figures", "noop_1"))
    rows = []
    for name, figures in results["meta"]["figures"].items():
        data = results["systems"][name]
        for figure in (f for f in figures if f in IO_FIGURES):
            ideal = LOADS[figure].ideal
            stats = data.get("unavailable") or data["figures"].get(figure, "not measured")
            rate = stats["median"] if isinstance(stats, dict) else None
            bound = min(ideal, limit) if limit else None
            rows.append({"system": name, "figure": figure, "jobs_s": stats, "ideal": ideal,
                         "of_ideal": rate / ideal if rate else None, "limit": limit,
                         "of_limit": rate / bound if rate and bound else None})
    return rows


def ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.{2 if value >= 0.1 else 3}f}×"


def io_table(rows: list[dict]) -> str:
    """The I/O-bound figures, one row per system and handler kind and concurrency,
    then the database's limit they were held to and why any is n/a."""
    body = [[r["system"], _io_title(r["figure"]), cell(r["jobs_s"], "{:,.0f}"),
             f"{r['ideal']:,.0f}", ratio(r["of_ideal"]), ratio(r["of_limit"])] for r in rows]
    limit = next((r["limit"] for r in rows if r["limit"]), None)
    notes = ["The database's limit: drainer's no-op jobs/s, 1 process, this run: "
             + ("n/a" if limit is None else f"{limit:,.0f}")]
    notes += [f"- {r['system']}, {_io_title(r['figure'])}: n/a, {r['jobs_s']}"
              for r in rows if isinstance(r["jobs_s"], str)]
    return "\n".join([_table(["system", "10 ms jobs, handler, concurrency", "jobs/s",
                               "ideal", "/ ideal", "/ min(ideal, limit)"], body), "", *notes])


def _io_title(figure: str) -> str:
    load = LOADS[figure]
    handler = "async" if load.kind == "async_sleep" else "sync (threads)"
    return f"{handler}, {load.concurrency}"


def width_rows(results: dict) -> list[dict]:
    """drainer's 10 ms jobs drained by 1, 2, 4 and 8 members of 8 threads: each
    width's speed-up over width 1 (a ratio of medians), its ideal (members x 8 /
    10 ms) and its share of the database's ceiling (systems.CEILING, the same run).
    `jobs_s` and `ceiling` are summaries, or why they are n/a."""
    drainer = results["systems"].get("drainer", {})
    base = _median(drainer, ("figures", WIDTH_FIGURES[0]))
    name, figure = CEILING
    ceiling = _measured(results["systems"].get(name, {}), figure)
    top = ceiling["median"] if isinstance(ceiling, dict) else None
    rows = []
    for figure in WIDTH_FIGURES:
        load = LOADS[figure]
        stats = _measured(drainer, figure)
        rate = stats["median"] if isinstance(stats, dict) else None
        rows.append({"width": load.members, "figure": figure, "jobs_s": stats,
                     "speed_up": rate / base if rate and base else None,
                     "ideal": load.ideal, "of_ideal": rate / load.ideal if rate else None,
                     "ceiling": ceiling, "of_ceiling": rate / top if rate and top else None})
    return rows


def _measured(data: dict, figure: str) -> dict | str:
    """A system's figure: its summary, or why it is n/a."""
    return data.get("unavailable") or data.get("figures", {}).get(figure, "not measured")


def width_table(rows: list[dict]) -> str:
    """One row per width, then the ceiling they were held to and why any is n/a."""
    body = [[f"{r['width']} × 8 threads", cell(r["jobs_s"], "{:,.0f}"), ratio(r["speed_up"]),
             f"{r['ideal']:,.0f} ({r['width']}×)", ratio(r["of_ideal"]),
             ratio(r["of_ceiling"])] for r in rows]
    ceiling = rows[0]["ceiling"]
    member = rows[0]["ideal"] / rows[0]["width"]  # one member's ideal jobs/s
    notes = ["The database's ceiling: drainer's claim of 10 and batch complete driven by "
             "pgbench, 4 connections, this run: "
             + (f"{cell(ceiling, '{:,.0f}')} jobs/s, which the ideal reaches at "
                f"{ceiling['median'] / member:,.0f} members" if isinstance(ceiling, dict)
                else f"n/a, {ceiling}")]
    notes += [f"- width {r['width']}: n/a, {r['jobs_s']}"
              for r in rows if isinstance(r["jobs_s"], str)]
    return "\n".join([_table(["members (drain --processes N)", "10 ms jobs/s",
                               "speed-up over 1", "ideal jobs/s (speed-up)", "/ ideal",
                               "/ database's ceiling"], body), "", *notes])
