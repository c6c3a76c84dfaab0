"""How a backlog widens (bench/simulator/widening.py, `python -m bench.simulate
--widening`): the figures the docs quote, drainer's own decision in the model, and
replays of ours with and without its fleet."""

from pathlib import Path

import pytest

from bench import simulate
from bench.simulator import widening
from bench.simulator.day import parse
from bench.simulator.metrics import replay
from bench.simulator.strategies import Ours
from drainer import width
from tests.simulated import BURST, TIMEOUT

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_show_the_model_s_table_as_printed():
    page = (ROOT / "docs" / "waiting-costs.md").read_text()
    rows = [line for line in widening.table().splitlines() if line.startswith("|")]
    assert "\n".join(rows) in page


def test_drainer_s_fleet_stays_within_its_budget_and_cap():
    for db, backlog in widening.SCENARIOS:
        run = widening.drainer(backlog, db, widening.CAP)
        assert run.peak == min(max(run.widths), db.budget(0, 0), widening.CAP)
        assert run.peak <= db.budget(0, 0) and run.refused == 0
    # The figures the README quotes: 10 ms jobs on PostgreSQL's default 100 sessions.
    run = widening.drainer(widening.TEN_MS, widening.SMALL, widening.CAP)
    assert [run.at(t) for t in widening.AT] == [8, 38, 38]
    assert (run.peak, round(run.seconds)) == (38, 44)
    alone = widening.drainer(widening.TEN_MS, widening.SMALL, 1)
    assert round(alone.seconds / 60) == 21


def test_sqs_asks_for_more_sessions_than_the_server_takes():
    run = widening.sqs(widening.TEN_MS, widening.SMALL, widening.CAP)
    assert (run.peak, run.refused) == (widening.SMALL.free, 23)
    assert [run.at(t) for t in widening.AT] == [45, 77, 77]
    assert round(run.seconds) == 34


def test_the_model_widens_by_drainer_s_own_decision(monkeypatch):
    monkeypatch.setattr(width, "more_members", lambda load: 0)
    run = widening.drainer(widening.TEN_MS, widening.SMALL, widening.CAP)
    assert run.peak == 1


def test_widening_leaves_a_day_without_a_backlog_as_it_was(replays):
    day = parse(BURST)
    wide, alone = (replay(day, TIMEOUT, Ours(max_width=w), replays) for w in (None, 1))
    assert (wide.awake_hours, wide.resumes) == (alone.awake_hours, alone.resumes)
    assert alone.fanouts == 0


def test_a_backlog_one_run_meets_widens_and_drains_sooner(replays):
    day = parse(simulate.BACKLOG_DAY)
    wide, alone = (replay(day, TIMEOUT, Ours(max_width=w), replays) for w in (None, 1))
    assert wide.fanouts > 0 == alone.fanouts
    assert wide.unfinished == alone.unfinished == 0
    assert max(wide.lateness) < max(alone.lateness) / 2
    assert wide.awake_hours < alone.awake_hours


def test_the_command_prints_the_model_and_the_replays(capsys, tmp_path, db_url, monkeypatch):
    day = tmp_path / "day.json"
    day.write_text('{"hours": 0.5, "bursts": [{"at": "00:10", "minutes": 1, "jobs": 5}]}')
    monkeypatch.setattr(simulate, "WIDTHS", (None, 1))
    assert simulate.main(["--widening", "--day", str(day), "--timeout", "5",
                          "--database-url", db_url]) == 0
    out = capsys.readouterr().out
    assert widening.table() in out
    assert out.count("| ours") == 2 + 2  # the backlog's widths, then the day's
    assert "| fan-outs |" in out


@pytest.mark.parametrize("db, backlog", widening.SCENARIOS)
def test_sqs_capped_at_the_budget_refuses_none(db, backlog):
    budget = db.budget(0, 0)
    assert widening.sqs(backlog, db, budget).refused == 0
