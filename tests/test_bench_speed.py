"""The speed bench (`python -m bench.speed`) at tiny sizes, without competitors, so
its code cannot rot; and its arithmetic: goals as ratios of medians, n/a with a
reason. No figure's value is asserted: speed is never tested as a wall-clock time."""

import json
import os
import subprocess
import sys

from bench.speed import __main__ as speed
from bench.speed import report, venvs
from bench.speed.systems import System
from tests.helpers import ROOT, clean_env

FIGURES = {"noop_1", "noop_4", "sleep_1", "sleep_4", "cold_start", "rss", "statements"}


def test_a_tiny_run_measures_every_figure_and_every_goal(tmp_path):
    out = tmp_path / "results.json"
    pg_bin = os.environ.get("DRAINER_TEST_PG_BIN")
    args = ["--runs", "1", "--jobs", "300", "--sleep-jobs", "40", "--enqueue-rows", "500",
            "--finished", "2000", "--future", "2000", "--claims", "5", "--no-competitors",
            "--out", str(out),
            *(["--pg-bin", pg_bin] if pg_bin else [])]
    proc = subprocess.run([sys.executable, "-m", "bench.speed", *args], cwd=ROOT,
                          env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
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
                   for line in proc.stdout.splitlines()), (goal.text, verdict)
    for goal in report.GOALS:
        assert goal.text in proc.stdout
    assert "| drainer " in proc.stdout


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
