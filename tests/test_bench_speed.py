"""The speed bench (`python -m bench.speed`) at tiny sizes, without competitors, so
its code cannot rot; and its arithmetic: goals as ratios of medians, the I/O-bound
figures against their ideal, n/a with a reason. No figure's value is asserted: speed
is never tested as a wall-clock time."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.speed import __main__ as speed
from bench.speed import against, report, venvs
from bench.speed.systems import (
    ASYNC_IO,
    IO_FIGURES,
    LOADS,
    WIDTH_FIGURES,
    Drainer,
    Handwritten,
    Pgbench,
    PgQueuer,
    System,
)
from tests.helpers import ROOT, clean_env

FIGURES = {"noop_1", "noop_4", "sleep_1", "sleep_4", "cold_start", "rss", "statements"}


def tiny_run(tmp_path, *args: str) -> tuple[dict, str]:
    """`python -m bench.speed --runs 1 --no-competitors ARGS`: its results and stdout."""
    out = tmp_path / "results.json"
    pg_bin = os.environ.get("DRAINER_TEST_PG_BIN")
    argv = ["--runs", "1", "--no-competitors", "--out", str(out), *args,
            *(["--pg-bin", pg_bin] if pg_bin else [])]
    proc = subprocess.run([sys.executable, "-m", "bench.speed", *argv], cwd=ROOT,
                          env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.timeout(900)  # nearly 2 minutes on a busy machine; its run may take 600 s
def test_a_tiny_run_measures_every_figure_and_every_goal(tmp_path):
    results, stdout = tiny_run(tmp_path, "--jobs", "300", "--sleep-jobs", "40",
                               "--enqueue-rows", "500", "--finished", "2000",
                               "--future", "2000", "--claims", "5")
    systems = results["systems"]
    assert {"drainer", "drainer --batch-size 10", "loop-each", "loop-batch"} <= set(systems)
    assert "pgqueuer" not in systems and "procrastinate" not in systems
    assert set(systems["drainer"]["figures"]) == FIGURES
    for name in ("drainer", "loop-each", "loop-batch"):
        for figure, stats in systems[name]["figures"].items():
            assert isinstance(stats, dict), f"{name} {figure}: {stats}"
            assert 0 < stats["min"] <= stats["median"] <= stats["max"], (name, figure)
    # A loop completing each job one by one sends more than one statement per job.
    assert systems["loop-each"]["figures"]["statements"]["median"] > 1
    assert systems["drainer"]["figures"]["statements"]["median"] < 1
    assert [r["goal"] for r in results["ratios"]] == [g.text for g in report.GOALS]
    # Every goal is measured here (no competitor is needed for one), and its ratio and
    # verdict follow from the medians this run reported: numerator / denominator
    # against the target, at least or at most as its sign says.
    for r, goal in zip(results["ratios"], report.GOALS, strict=True):
        num, den = (median_at(results, path) for path in (goal.numerator, goal.denominator))
        assert r["ratio"] == num / den > 0, goal.text
        sign, target = r["target"].rstrip("×").split()
        assert r["met"] is (r["ratio"] >= float(target) if sign == "≥"
                            else r["ratio"] <= float(target)), goal.text
        verdict = "met" if r["met"] else "missed"
        assert any(goal.text in line and line.rstrip(" |").endswith(verdict)
                   for line in stdout.splitlines()), (goal.text, verdict)
    for goal in report.GOALS:
        assert goal.text in stdout
    assert "| drainer " in stdout
    assert "io" not in results and "10 ms jobs, handler" not in stdout  # opt-in


def test_a_tiny_io_run_measures_drainer_against_its_ideal_and_the_databases_limit(tmp_path):
    results, stdout = tiny_run(tmp_path, "--workload", "io", "--jobs", "300",
                               "--io-jobs", "40")
    # Only the systems with I/O-bound figures run, and none of the drain workload's
    # other figures or extras.
    assert list(results["systems"]) == ["drainer", "drainer --event-loop asyncio"]
    figures = results["systems"]["drainer"]["figures"]
    assert set(figures) == {"noop_1", "rss", "statements", *IO_FIGURES}
    assert "enqueue" not in results and "ratios" not in results
    limit = figures["noop_1"]["median"]
    assert [(r["system"], r["figure"]) for r in results["io"]] == [
        *(("drainer", f) for f in IO_FIGURES),
        *(("drainer --event-loop asyncio", f) for f in ASYNC_IO)]
    for row in results["io"]:
        measured = results["systems"][row["system"]]["figures"][row["figure"]]
        rate = measured["median"]
        assert row["jobs_s"] == measured
        assert row["of_ideal"] == rate / row["ideal"]
        assert row["of_limit"] == rate / min(row["ideal"], limit)
    assert [r["ideal"] for r in results["io"]] == [10_000, 10_000, 50_000, 10_000, 50_000]
    assert any(line.startswith("| drainer ") and "| async, 500 " in line
               for line in stdout.splitlines())
    assert f"this run: {limit:,.0f}" in stdout


def test_a_tiny_width_run_measures_each_width_against_one_and_the_databases_ceiling(
        tmp_path):
    results, stdout = tiny_run(tmp_path, "--workload", "width", "--width-jobs", "80",
                               "--jobs", "300")
    # drainer at each width, and the ceiling: nothing else of the other workloads.
    assert list(results["systems"]) == ["drainer", "pgbench-10"]
    figures = results["systems"]["drainer"]["figures"]
    assert set(figures) == set(WIDTH_FIGURES)
    assert set(results["systems"]["pgbench-10"]["figures"]) == {"noop_4"}
    assert "enqueue" not in results and "ratios" not in results and "io" not in results
    ceiling = results["systems"]["pgbench-10"]["figures"]["noop_4"]["median"]
    base = figures["width_1"]["median"]
    rows = results["width"]
    assert [(r["width"], r["ideal"]) for r in rows] == [
        (1, 800), (2, 1_600), (4, 3_200), (8, 6_400)]
    for row in rows:
        rate = figures[row["figure"]]["median"]
        assert row["jobs_s"] == figures[row["figure"]]
        assert row["speed_up"] == rate / base
        assert row["of_ideal"] == rate / row["ideal"]
        assert row["of_ceiling"] == rate / ceiling
        assert any(line.startswith(f"| {row['width']} × 8 threads ")
                   and f"| {row['speed_up']:.2f}× " in line for line in stdout.splitlines())
    assert f"this run: {ceiling:,.0f} jobs/s" in stdout


def test_width_rows_are_ratios_of_medians_to_width_one_the_ideal_and_the_ceiling():
    results = {"systems": {
        "drainer": {"figures": {"width_1": report.summary([400, 500, 700]),
                                "width_2": stats(1_000), "width_4": stats(1_600),
                                "width_8": "drainer exited 1: too many connections"}},
        "pgbench-10": {"figures": {"noop_4": stats(16_000)}},
    }}
    rows = {r["width"]: r for r in report.width_rows(results)}
    assert (rows[1]["speed_up"], rows[2]["speed_up"], rows[4]["speed_up"]) == (1, 2, 3.2)
    assert (rows[2]["of_ideal"], rows[4]["of_ceiling"]) == (1_000 / 1_600, 0.1)
    assert rows[8]["speed_up"] is rows[8]["of_ideal"] is rows[8]["of_ceiling"] is None
    table = report.width_table(list(rows.values()))
    assert "| 4 × 8 threads " in table and "| 3.20× " in table
    assert "this run: 16,000 jobs/s, which the ideal reaches at 20 members" in table
    assert "- width 8: n/a, drainer exited 1: too many connections" in table
    # Without the ceiling (no pgbench here), the speed-up stands and the share is n/a.
    results["systems"]["pgbench-10"] = {"unavailable": "no pgbench in /usr/bin"}
    rows = {r["width"]: r for r in report.width_rows(results)}
    assert rows[4]["speed_up"] == 3.2 and rows[4]["of_ceiling"] is None
    assert "this run: n/a, no pgbench in /usr/bin" in report.width_table(list(rows.values()))


def test_the_width_workload_is_opt_in_and_runs_drain_with_processes():
    drainer, ceiling = Drainer(server=None), Pgbench(server=None, size=10)
    drainer.url = "postgresql:///bench"
    assert not set(speed.chosen_figures(drainer, ["drain", "io"])) & set(WIDTH_FIGURES)
    assert speed.chosen_figures(drainer, ["width"]) == list(WIDTH_FIGURES)
    assert speed.chosen_figures(ceiling, ["width"]) == ["noop_4"]
    assert speed.chosen_figures(Pgbench(server=None, size=500), ["width"]) == []
    assert speed.chosen_figures(Handwritten(server=None, complete="batch"), ["width"]) == []
    for figure, members in zip(WIDTH_FIGURES, (1, 2, 4, 8), strict=True):
        [argv] = drainer.argvs(LOADS[figure], 100)  # one command: its members are its own
        assert argv[-5:] == ["bench_sleep", "--concurrency", "8", "--processes", str(members)]
    assert "--processes" not in drainer.argvs(LOADS["sleep_4"], 100)[0]


def median_at(results: dict, path: tuple[str, ...]) -> float:
    """The median a path of the results names (systems/<name>/figures/<figure>, ...)."""
    node = results
    for key in path:
        node = node[key]
    return node["median"]


def stats(value: float) -> dict:
    return report.summary([value, value, value])


def test_goals_are_ratios_of_medians_against_their_targets():
    results = {
        "systems": {
            "drainer": {"figures": {"noop_1": report.summary([40, 41, 90]),
                                    "noop_4": stats(30), "cold_start": stats(0.2),
                                    "rss": stats(30)}},
            "drainer --batch-size 10": {"figures": {"noop_1": stats(19)}},
            "loop-batch": {"figures": {"noop_1": stats(20), "noop_4": stats(20),
                                       "cold_start": stats(0.1), "rss": "it crashed"}},
        },
        "enqueue": {"drainer": stats(90), "copy": stats(100)},
        "claim": {"empty": stats(1.0), "history": stats(1.3)},
    }
    got = {r["goal"]: (r["ratio"], r["met"]) for r in report.ratios(results)}
    text = [g.text for g in report.GOALS]
    assert got[text[0]] == (41 / 20, True)  # the median, not the mean or the best
    assert got[text[1]] == (1.5, True)  # at the target counts as met
    assert got[text[2]] == (0.95, True)
    assert got[text[3]] == (2.0, False)  # at most 1.15x
    assert got[text[4]] == (None, None)  # nothing to compare with: n/a, not a guess
    assert got[text[5]] == (0.9, True)
    assert got[text[6]][1] is False
    assert "n/a" in report.goals_table(report.ratios(results))


def test_io_rows_are_ratios_of_medians_to_the_ideal_and_the_databases_limit():
    results = {
        "meta": {"figures": {"drainer": ["noop_1", "io_sync_100", "io_async_500"],
                             "pgqueuer": ["noop_1", "io_async_100", "io_async_500"],
                             "procrastinate": ["noop_1", "io_async_500"]}},
        "systems": {
            "drainer": {"figures": {"noop_1": stats(20_000), "io_sync_100": stats(5_000),
                                    "io_async_500": report.summary([9_000, 10_000, 30_000])}},
            "pgqueuer": {"figures": {"noop_1": stats(6_000), "io_async_100": stats(2_000),
                                     "io_async_500": "pgq exited 1: too many tasks"}},
            "procrastinate": {"unavailable": "pip install procrastinate: no network"},
        },
    }
    rows = {(r["system"], r["figure"]): r for r in report.io_rows(results)}
    assert list(rows) == [("drainer", "io_sync_100"), ("drainer", "io_async_500"),
                          ("pgqueuer", "io_async_100"), ("pgqueuer", "io_async_500"),
                          ("procrastinate", "io_async_500")]
    sync = rows["drainer", "io_sync_100"]
    assert (sync["ideal"], sync["of_ideal"], sync["of_limit"]) == (10_000, 0.5, 0.5)
    # At 500 the ideal (50,000/s) is past drainer's no-op rate: that rate is the bound.
    async_500 = rows["drainer", "io_async_500"]
    assert (async_500["of_ideal"], async_500["of_limit"]) == (0.2, 0.5)  # the median
    assert rows["pgqueuer", "io_async_100"]["of_limit"] == 0.2
    failed, unavailable = rows["pgqueuer", "io_async_500"], rows["procrastinate", "io_async_500"]
    assert failed["of_ideal"] is failed["of_limit"] is None
    assert unavailable["jobs_s"] == "pip install procrastinate: no network"
    table = report.io_table(report.io_rows(results))
    assert "this run: 20,000" in table
    assert "- pgqueuer, async, 500: n/a, pgq exited 1: too many tasks" in table
    assert "- procrastinate, async, 500: n/a, pip install procrastinate: no network" in table


def test_the_io_workload_is_opt_in_and_takes_the_no_op_figure_for_its_limit():
    drain, io, both = ["drain"], ["io"], ["drain", "io"]
    drainer, pgqueuer = Drainer(server=None), PgQueuer(server=None)
    loop = Handwritten(server=None, complete="batch")
    pgqueuer.bin = Path("venv/bin")  # what prepare() would have set
    assert speed.parse_args([]).workload == drain
    assert not set(speed.chosen_figures(drainer, drain)) & set(IO_FIGURES)
    assert speed.chosen_figures(drainer, io) == ["noop_1", *IO_FIGURES]
    assert speed.chosen_figures(pgqueuer, io) == ["noop_1", "io_async_100", "io_async_500"]
    assert speed.chosen_figures(loop, io) == []  # no I/O-bound figure: not run at all
    assert speed.chosen_figures(drainer, both) == [*System.figures, *IO_FIGURES]
    assert pgqueuer.argv("async_sleep", 500)[-7:] == [
        "pgqueuer_app:sleep", "--mode", "drain", "--max-concurrent-tasks", "500",
        "--batch-size", "250"]
    assert drainer.argv("async_sleep", 500)[-4:] == [
        "--queue", "bench_async_sleep", "--concurrency", "500"]


class Uninstallable(System):
    name = "nowhere"

    def prepare(self) -> None:
        raise venvs.Unavailable("pip install nowhere==1: no matching distribution")


def test_a_competitor_that_cannot_be_installed_is_na_with_its_reason():
    results = speed.measure_systems([Uninstallable(server=None)], speed.parse_args([]))
    data = results["nowhere"]
    assert data == {"unavailable": "pip install nowhere==1: no matching distribution"}
    table = report.systems_table({"systems": {"nowhere": data}})
    assert "| nowhere | n/a" in table
    assert "nowhere: n/a, pip install nowhere==1: no matching distribution" in table


@pytest.mark.timeout(900)
def test_against_head_drains_a_clean_checkout_of_it_beside_the_working_tree(tmp_path):
    """`--against HEAD` (the current interpreter for the checkout: a virtualenv
    build is minutes on a busy machine): the checkout is HEAD's files, and each
    side's drain imported its own tree, reported as such; the A/A twin runs ours."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    out = tmp_path / "results.json"
    pg_bin = os.environ.get("DRAINER_TEST_PG_BIN")
    argv = ["--against", "HEAD", "--against-python", sys.executable, "--pairs", "1",
            "--jobs", "200", "--scenario", "noop_1", "--scenario", "keys_4", "--out", str(out),
            *(["--pg-bin", pg_bin] if pg_bin else [])]
    proc = subprocess.run([sys.executable, "-m", "bench.speed", *argv], cwd=ROOT,
                          env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    sides = results["meta"]["sides"]
    assert list(sides) == ["before", "after", "aa"]
    tree = Path(sides["before"]["tree"])
    assert sides["before"]["rev"] == head and tree.name == head and tree != ROOT
    shown = subprocess.run(["git", "-C", str(ROOT), "show", "HEAD:drainer/run.py"],
                           check=True, capture_output=True).stdout
    assert (tree / "drainer" / "run.py").read_bytes() == shown
    # What each side's first drain process itself imported: never the same tree for
    # before and after.
    assert sides["before"]["drainer_file"] == str(tree / "drainer" / "__init__.py")
    ours = str(ROOT / "drainer" / "__init__.py")
    assert sides["after"]["drainer_file"] == sides["aa"]["drainer_file"] == ours
    for side in sides.values():
        assert f"debug: {side['label']}: its drain imported {side['drainer_file']}" in proc.stderr
    rows = results["comparison"]
    assert [r["scenario"] for r in rows] == ["noop_1", "keys_4"]
    for r in rows:
        assert r["ratio"] == r["after"]["median"] / r["before"]["median"]
        assert len(r["pair_ratios"]) == len(r["aa_ratios"]) == 1
        low, high = r["aa_spread"]
        assert r["outside_aa"] is not (low <= r["ratio"] <= high)
        assert any(line.startswith(f"| {r['scenario']}: ") and line.rstrip(" |").endswith(
            r["verdict"]) for line in proc.stdout.splitlines()), r["scenario"]
        for side in sides.values():
            assert f"pair 1/1 {r['scenario']:<9} {side['label']}: " in proc.stderr
    assert sides["before"]["label"] in proc.stdout and sides["after"]["label"] in proc.stdout


def test_after_against_before_is_a_ratio_of_medians_set_against_the_aa_spread():
    scenario = against.SCENARIOS["noop_1"]
    before, after = [100.0, 90.0, 110.0], [120.0, 125.0, 130.0]
    row = against.row(scenario, before, after, twin=[126.0, 125.0, 117.0])
    assert row["ratio"] == 125 / 100  # medians, not pair by pair
    assert row["pair_ratios"] == [1.2, 125 / 90, 130 / 110]
    assert row["aa_ratios"] == [126 / 120, 1.0, 117 / 130]
    # Either way round: the twin's 0.9 is also a 1.11 of the first copy's.
    assert row["aa_spread"] == [117 / 130, 130 / 117]
    assert (row["outside_aa"], row["verdict"]) == (True, "faster")
    slower = against.row(scenario, after, before, twin=[99.0, 92.0, 108.0])
    assert slower["verdict"] == "slower" and slower["ratio"] == 100 / 125
    noisy = against.row(scenario, before, after, twin=[95.0, 125.0, 130.0])
    assert (noisy["outside_aa"], noisy["verdict"]) == (False, "within the noise")
    table = against.table([row, against.failed_row(against.SCENARIOS["keys_1"], "it broke")],
                          ["before (abc)", "after (def)"])
    assert "| noop_1: no-op, 1 process " in table and "| 1.250 " in table
    assert "- keys_1: n/a, it broke" in table


def test_a_commits_virtualenv_has_its_tree_and_our_versions_of_the_dependencies(
        monkeypatch, tmp_path):
    asked = []
    monkeypatch.setattr(venvs, "ensure", lambda name, req: asked.append((name, req)) or tmp_path)
    assert against.interpreter("ab" * 20, tmp_path / "tree") == str(tmp_path / "python")
    name, requirements = asked[0]
    assert name == "drainer-" + "ab" * 6
    assert requirements[:2] == ["-e", str(tmp_path / "tree")]
    psycopg_version = __import__("psycopg").__version__
    assert f"psycopg=={psycopg_version}" in requirements


def test_against_an_unknown_revision_says_so():
    proc = subprocess.run([sys.executable, "-m", "bench.speed", "--against", "no-such-rev"],
                          cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "no-such-rev is not a commit of this repository" in proc.stderr
    assert "Traceback" not in proc.stderr
