"""The scale-to-zero simulator (bench/simulate.py) on tiny days: properties of the
model that a regression would break, and its backoff against the database's."""

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import drainer
from bench.simulate import main
from bench.simulator.day import parse
from bench.simulator.engine import Flag, Sim, Wait
from bench.simulator.metrics import ideal, percentile, replay
from bench.simulator.strategies import BACKSTOP_MINUTES, Cron, Listen, Ours, Poll, strategies
from bench.simulator.table import backoff
from drainer import queue
from tests.helpers import unavailable

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 5  # minutes
QUIET = {"hours": 3}
BURST = {  # one burst, shorter than an hour so no backstop tick falls in it
    "hours": 0.8, "seed": 1, "failing_share": 0.2,
    "duration": {"median": 0.2, "sigma": 0.5, "max": 5},
    "bursts": [{"at": "00:05", "minutes": 5, "jobs": 60}],
}


def test_polling_every_second_keeps_the_compute_awake_all_day():
    result = replay(parse(QUIET), TIMEOUT, Poll(1))
    assert result.awake_hours == pytest.approx(3)
    assert result.resumes == 1


def test_a_quiet_day_costs_ours_nothing_but_its_backstop():
    day = parse(QUIET)
    assert replay(day, TIMEOUT, Ours(backstop=None)).awake_hours == 0
    result = replay(day, TIMEOUT, Ours(backstop=60))  # backstop ticks at 1 h and 2 h
    assert result.resumes == result.invocations == 2
    # each tick: resume + connect + 4 statements, then the suspend timeout
    assert result.awake_hours * 3600 == pytest.approx(2 * (60 * TIMEOUT + 1.04), abs=0.1)


def test_ours_backstop_is_the_template_s_default():
    template = (ROOT / "infra" / "template.yaml").read_text()
    assert re.search(r"BackstopRate:\n(?:    .*\n)*?    Default: rate\((\d+) hours?\)",
                     template)[1] == f"{BACKSTOP_MINUTES / 60:g}"


def test_a_cron_drain_resumes_the_compute_on_every_tick_of_a_quiet_day():
    result = replay(parse(QUIET), TIMEOUT, Cron(15 * 60))
    assert result.resumes == result.invocations == 12


def test_a_listen_worker_reconnects_after_a_suspension_and_so_wakes_it_again():
    result = replay(parse(QUIET), TIMEOUT, Listen(fallback=3600))
    assert result.awake_hours > 0.99 * 3  # asleep only for its first reconnect backoff
    assert result.resumes == pytest.approx(3 * 60 / TIMEOUT, abs=1)


def test_ours_starts_a_burst_s_jobs_within_a_resume_and_retries_on_the_minute():
    day = parse(BURST)
    result = replay(day, TIMEOUT, Ours())
    assert result.unfinished == 0
    assert percentile(result.latency, 0.99) < day.model.resume + 2
    assert min(result.lateness) >= 0  # no retry starts before it is due
    assert max(result.lateness) < 60 + day.model.resume + 1  # a wake-up is on the minute


def test_ours_on_a_burst_is_awake_within_10_percent_of_the_ideal():
    # A run that ends while another holds a lease arms a lease wake-up; the holder,
    # finishing, deletes it, so it does not resume the suspended compute for nothing.
    day = parse(BURST)
    awake, bursts = ideal(day, TIMEOUT)
    assert bursts == 1
    assert replay(day, TIMEOUT, Ours()).awake_hours <= 1.1 * awake


def test_concurrent_runs_of_ours_do_not_all_wait_for_the_same_retry():
    # A run waits in-process only after a drain that claimed something; one that lost
    # the race arms the (shared) wake-up. Waiting after every drain, runs averaged
    # 2.5 min each on this burst.
    result = replay(parse(BURST), TIMEOUT, Ours())
    assert result.worker_hours * 3600 < 30 * result.invocations


@pytest.mark.parametrize("strategy", strategies(), ids=lambda s: s.name)
def test_every_strategy_finishes_the_day_s_jobs_none_early(strategy):
    day = parse({**BURST, "hours": 6})  # long enough for hourly cron to run the retries
    result = replay(day, TIMEOUT, strategy)
    assert result.unfinished == 0
    assert len(result.latency) == len(day.specs)
    assert min(result.latency) > 0 and min(result.lateness) >= 0


def test_a_latching_flag_set_after_a_timed_out_wait_is_kept():
    sim, flag, seen = Sim(), Flag(latching=True), []

    def waiter():
        seen.append((yield Wait((flag,), 1)))  # times out: None
        yield 1  # flag set meanwhile, nobody waiting
        seen.append((yield Wait((flag,), 10)))

    sim.spawn(waiter())
    sim.call_at(1.5, flag.set)
    sim.run(20)
    assert seen == [None, flag]


def test_the_simulated_backoff_is_the_database_s(conn):
    drainer.enqueue(conn, "default", {}, max_attempts=12)
    moment = datetime(2100, 1, 1, tzinfo=UTC)  # past the real clock: always ready
    for attempts in range(1, 12):
        [job] = queue.claim(conn, ["default"], 1, timedelta(minutes=5), now=moment)
        assert job.attempts == attempts
        queue.fail(conn, [(job, "boom")], now=moment)
        due = conn.execute("SELECT run_at FROM jobs").fetchone()[0]
        assert (due - moment).total_seconds() == backoff(attempts)
        moment = due


def test_the_command_prints_a_table_per_timeout(capsys, tmp_path):
    day = tmp_path / "day.json"
    day.write_text('{"hours": 1, "bursts": [{"at": "00:10", "minutes": 1, "jobs": 5}]}')
    assert main(["--day", str(day), "--timeout", "5", "--no-chart"]) == 0
    out = capsys.readouterr().out
    assert "Suspend timeout 5 min; ideal" in out
    assert out.count("\n| ") == 2 + len(strategies())  # header, ideal, one row each


def test_a_day_file_that_is_not_json_is_one_line_and_exit_2(capsys, tmp_path):
    day = tmp_path / "day.json"
    day.write_text("{")
    assert main(["--day", str(day), "--no-chart"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_chart_is_a_png_with_a_panel_per_timeout(tmp_path):
    try:
        import matplotlib  # noqa: F401 - the `bench` extra, part of `dev`
    except ImportError:
        unavailable("matplotlib", "matplotlib is not installed (pip install -e '.[bench]')")
    day, png = tmp_path / "day.json", tmp_path / "chart.png"
    day.write_text('{"hours": 1, "bursts": [{"at": "00:10", "minutes": 1, "jobs": 5}]}')
    assert main(["--day", str(day), "--timeout", "5", "--timeout", "10",
                 "--chart", str(png)]) == 0
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(header[16:20], "big")
    assert width == 2 * 450  # two panels of 5 inches at 90 dpi
