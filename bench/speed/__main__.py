"""`python -m bench.speed`: start a throwaway PostgreSQL, measure every figure of
the speed goals for drainer, the hand-written psycopg loop, pgbench, PgQueuer and
procrastinate (min / median / max of --runs), print the tables with each goal's
ratio, and write the results as JSON under bench/results/. `--workload io` measures
the I/O-bound workload instead (10 ms jobs at concurrency 100 and 500, against
their ideal), `--workload width` the drain of 10 ms jobs by 1, 2, 4 and 8 member
processes (`drain --processes N`) against the database's ceiling, `--workload drain
--workload io` both. `--against REV` compares an earlier commit's drains with the
current code's instead (see bench/speed/against.py).

Absolute numbers move with the machine and its load; compare the ratios, which are
taken within one run. The method is described in bench/README.md.
"""

import argparse
import json
import os
import platform
import sys
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from . import against, measure, pg, report, systems, venvs
from .systems import CEILING, IO_FIGURES, LOADS, OPT_IN, WIDTH_FIGURES, System, all_systems

RESULTS = Path(__file__).resolve().parent.parent / "results"
LATEST = Path(__file__).resolve().parent / "latest.json"
WORKLOADS = ("drain", "io", "width")
EXAMPLES = """examples:
  python -m bench.speed --no-competitors --runs 1      a quick look at every figure
  python -m bench.speed --against main --pairs 5       this tree against main, interleaved
  python -m bench.speed --against HEAD~3 --scenario noop_1 --scenario keys_1 --jobs 50000

--against scenarios (each drained by both sides, and by an A/A twin of the current code):
""" + "\n".join(f"  {s.name:<10} {s.title}" for s in against.SCENARIOS.values())


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.speed", description=__doc__.split("\n\n")[0],
                                epilog=EXAMPLES,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="runs per figure (default 3)")
    p.add_argument("--jobs", type=int, default=20_000,
                   help="no-op jobs per drain run (default 20,000)")
    p.add_argument("--sleep-jobs", type=int, default=2_000,
                   help="10 ms jobs per drain run (default 2,000)")
    p.add_argument("--io-jobs", type=int, default=20_000,
                   help="10 ms jobs per I/O-bound run at concurrency 100, scaled with the "
                        "concurrency (default 20,000: 100,000 at 500)")
    p.add_argument("--width-jobs", type=int, default=20_000,
                   help="10 ms jobs per width run, at every width (default 20,000)")
    p.add_argument("--workload", action="append", choices=WORKLOADS,
                   help="what to measure (repeatable): drain, the speed goals' figures "
                        "(the default, about 5 minutes), io, the I/O-bound jobs "
                        "(opt-in: longer, 13 minutes on 2 busy cores, mostly procrastinate), "
                        "or width, 10 ms jobs drained by 1, 2, 4 and 8 processes of 8 "
                        "threads against the database's ceiling (opt-in, 2 minutes)")
    p.add_argument("--enqueue-rows", type=int, default=100_000,
                   help="rows per bulk enqueue run (default 100,000)")
    p.add_argument("--finished", type=int, default=1_000_000,
                   help="finished rows for the claim latency figure (default 1,000,000)")
    p.add_argument("--future", type=int, default=100_000,
                   help="high-priority jobs due later for the claim latency figure "
                        "(default 100,000)")
    p.add_argument("--claims", type=int, default=1_000,
                   help="claims timed per claim latency run (default 1,000)")
    p.add_argument("--no-competitors", action="store_true",
                   help="skip PgQueuer and procrastinate (no virtualenvs, no network)")
    p.add_argument("--only", action="append", metavar="SYSTEM",
                   help="measure only this system (repeatable), e.g. drainer, loop-batch")
    p.add_argument("--pg-bin", type=Path, help="server binaries (default: the embedded ones)")
    p.add_argument("--out", type=Path, help="the JSON file (default: bench/results/speed-*.json)")
    p.add_argument("--latest", action="store_true",
                   help="also write them to bench/speed/latest.json, the committed copy")
    p.add_argument("--against", metavar="REV",
                   help="compare with this commit (any git revision: main, HEAD~2, a hash): "
                        "its clean checkout, in a virtualenv of its own, drains the scenarios "
                        "interleaved with the current tree; the current tree also runs against "
                        "itself (A/A), so the report shows the noise next to each ratio")
    p.add_argument("--pairs", type=int, default=5,
                   help="--against: rounds of before, after and A/A drains (default 5)")
    p.add_argument("--scenario", action="append", choices=list(against.SCENARIOS), metavar="NAME",
                   help="--against: this scenario only (repeatable; default all, listed "
                        "below; --jobs and --sleep-jobs set their sizes)")
    p.add_argument("--against-python", metavar="PATH",
                   help="--against: run the earlier commit's checkout with this Python "
                        "(its tree first on PYTHONPATH) instead of building its virtualenv; "
                        "it must have drainer's dependencies")
    args = p.parse_args(argv)
    args.workload = args.workload or ["drain"]
    return args


def chosen_figures(system: System, workloads: list[str]) -> list[str]:
    """The system's figures the workloads measure. The I/O-bound one takes the
    1-process no-op figure too, of a system that has one: drainer's is the database's
    limit in that run. The width one takes the database's ceiling (systems.CEILING)."""
    chosen = [f for f in system.figures if f not in OPT_IN] if "drain" in workloads else []
    io = [f for f in system.figures if f in IO_FIGURES]
    if "io" in workloads and io:
        limit = ["noop_1"] if "noop_1" in system.figures else []
        chosen = [*chosen, *(f for f in (*limit, *io) if f not in chosen)]
    if "width" in workloads:
        ceiling = [CEILING[1]] if system.name == CEILING[0] else []
        width = [f for f in system.figures if f in WIDTH_FIGURES]
        chosen = [*chosen, *(f for f in (*ceiling, *width) if f not in chosen)]
    return chosen


def log(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def repeat(runs: int, what: str, fn: Callable[[], object]) -> list:
    """`fn` run `runs` times; measure.Failed after a failed run."""
    values = []
    for i in range(runs):
        values.append(fn())
        log(f"  {what} run {i + 1}/{runs}: {values[-1]}")
    return values


def prepare(system: System) -> str | None:
    """Install the system's schema; the reason when it cannot run here."""
    try:
        system.prepare()
    except (venvs.Unavailable, OSError) as exc:
        log(f"{system.name}: n/a, {exc}")
        return str(exc)
    return None


def measure_once(system: System, figure: str, args: argparse.Namespace) -> dict[str, float]:
    """One run of one figure (the 1-process no-op run also gives RSS and statements)."""
    if figure == "cold_start":
        return {figure: round(measure.cold_start(system), 4)}
    load = LOADS[figure]
    if figure in IO_FIGURES:
        jobs = round(args.io_jobs * (load.concurrency or 1) / 100 * system.jobs_scale)
    elif figure in WIDTH_FIGURES:
        jobs = args.width_jobs
    else:
        jobs = args.sleep_jobs if load.kind == "sleep" else round(args.jobs * system.jobs_scale)
    timed, per_job = measure.drain(system, load, jobs)
    values = {figure: jobs / timed.seconds}
    if figure == "noop_1":
        values.update(rss=timed.max_rss_mb, statements=per_job)
    return values


def measure_systems(systems: list[System], args: argparse.Namespace) -> dict:
    """Every figure of every system, run after run: each run goes through all the
    systems, so a change of the machine's load between runs hits them all alike."""
    results = {s.name: {"unavailable": reason} for s in systems if (reason := prepare(s))}
    ready = [s for s in systems if s.name not in results]
    values: dict[str, dict[str, list[float]]] = {s.name: {} for s in ready}
    failed: dict[str, dict[str, str]] = {s.name: {} for s in ready}
    for i in range(args.runs):
        for system in ready:
            for figure in chosen_figures(system, args.workload):
                if figure in failed[system.name]:
                    continue
                try:
                    for key, value in measure_once(system, figure, args).items():
                        values[system.name].setdefault(key, []).append(value)
                except measure.Failed as exc:
                    log(f"{system.name} {figure}: n/a, {exc}")
                    failed[system.name][figure] = str(exc)
                    continue
                log(f"  run {i + 1}/{args.runs} {system.name} {figure}: "
                    f"{values[system.name][figure][-1]:,.3f}")
    for system in ready:
        figures = {k: report.summary(v) for k, v in values[system.name].items()}
        figures.update(failed[system.name])  # a figure that failed once is n/a
        results[system.name] = {"figures": figures}
    return {s.name: results[s.name] for s in systems}


def measure_extras(server: pg.Server, args: argparse.Namespace) -> tuple[dict, dict]:
    url = server.create("enqueue")
    measure.prepare_history(url, 0)
    rates = repeat(args.runs, "bulk enqueue (ours, bare COPY, with keys)",
                   lambda: measure.enqueue_rates(url, args.enqueue_rows))
    enqueue = {"rows": args.enqueue_rows}
    for i, name in enumerate(("drainer", "copy", "keyed")):
        enqueue[name] = report.summary([r[i] for r in rates])
    claim = {"finished": args.finished, "future_rows": args.future, "ready": 20_000,
             "claims": args.claims}
    urls = {"empty": server.create("claim_empty"), "history": server.create("claim_history"),
            "future": server.create("claim_future")}
    log(f"claim latency: preparing {args.finished:,} finished rows, {args.future:,} due later")
    measure.prepare_history(urls["empty"], 0)
    measure.prepare_history(urls["history"], args.finished)
    measure.prepare_future(urls["future"], args.future)
    # Every table in every run, so a change of load between runs hits them alike.
    runs = repeat(args.runs, "claim latency ms (no finished rows, finished rows, due later)",
                  lambda: tuple(round(measure.claim_latency(url, claim["ready"], args.claims), 4)
                                for url in urls.values()))
    for i, name in enumerate(urls):
        claim[name] = report.summary([r[i] for r in runs])
    return enqueue, claim


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    return {"cpu": model, "cores": os.cpu_count(), "os": platform.platform(),
            "python": platform.python_version()}


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def run(args: argparse.Namespace) -> dict:
    systems.compile_sources()
    server = pg.Server(args.pg_bin)
    try:
        results = {"meta": {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                            "machine": machine(), "postgresql": server.version(),
                            "load_before": os.getloadavg(), "runs": args.runs,
                            "jobs": args.jobs, "sleep_jobs": args.sleep_jobs,
                            "io_jobs": args.io_jobs, "width_jobs": args.width_jobs,
                            "workloads": args.workload}}
        chosen = [s for s in all_systems(server, competitors=not args.no_competitors)
                  if (not args.only or s.name in args.only)
                  and chosen_figures(s, args.workload)]
        results["meta"]["figures"] = {s.name: chosen_figures(s, args.workload) for s in chosen}
        results["systems"] = measure_systems(chosen, args)
        if "drain" in args.workload:
            results["enqueue"], results["claim"] = measure_extras(server, args)
        results["meta"]["load_after"] = os.getloadavg()
    finally:
        server.stop()
    if "drain" in args.workload:
        results["ratios"] = report.ratios(results)
    if "io" in args.workload:
        results["io"] = report.io_rows(results)
    if "width" in args.workload:
        results["width"] = report.width_rows(results)
    return results


def run_against(args: argparse.Namespace) -> dict:
    """The comparison of --against: the sides' drains, interleaved, and their ratios."""
    sides = against.sides(args.against, args.against_python, log)
    scenarios = [against.SCENARIOS[name] for name in args.scenario or against.SCENARIOS]
    server = pg.Server(args.pg_bin)
    try:
        results = {"meta": {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                            "machine": machine(), "postgresql": server.version(),
                            "load_before": os.getloadavg(), "pairs": args.pairs,
                            "jobs": args.jobs, "sleep_jobs": args.sleep_jobs}}
        jobs = {"noop": args.jobs, "sleep": args.sleep_jobs}
        results["comparison"] = against.compare(server, sides, scenarios, args.pairs, jobs, log)
        results["meta"]["sides"] = {side.key: side.describe() for side in sides}
        results["meta"]["load_after"] = os.getloadavg()
    finally:
        server.stop()
    return results


def header(meta: dict, what: str) -> str:
    m = meta["machine"]
    load = " / ".join(f"{a:.1f}–{b:.1f}" for a, b in zip(meta["load_before"], meta["load_after"],
                                                        strict=True))
    return (f"{meta['date']}, {m['cpu']}, {m['cores']} cores, {m['os']}, Python {m['python']}, "
            f"PostgreSQL {meta['postgresql']} on a local socket; {what}; "
            f"load average 1/5/15 min before–after: {load}")


def render(results: dict) -> str:
    meta = results["meta"]
    if "comparison" in results:
        labels = [side["label"] for side in meta["sides"].values()]
        return "\n\n".join([header(meta, f"median (min – max) of {meta['pairs']} pairs"),
                             against.table(results["comparison"], labels)])
    parts = [header(meta, f"median (min – max) of {meta['runs']} runs"),
             report.systems_table(results)]
    if "ratios" in results:
        parts += [report.extras_table(results), report.goals_table(results["ratios"])]
    if "io" in results:
        parts.append(report.io_table(results["io"]))
    if "width" in results:
        parts.append(report.width_table(results["width"]))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        results = run_against(args) if args.against else run(args)
    except (against.UnknownRevision, venvs.Unavailable) as exc:
        log(f"--against: {exc}")
        return 2
    except Exception:  # the bench itself broke: show where
        traceback.print_exc()
        return 1
    print(render(results))
    out = args.out or RESULTS / f"speed-{results['meta']['date'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1, default=str)
    out.write_text(text)
    if args.latest:
        LATEST.write_text(text)
    log(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
