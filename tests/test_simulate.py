"""The scale-to-zero simulator (bench/simulate.py) on tiny days: properties of the
model that a regression would break, and proof that it runs drainer's own code."""

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import bench.simulate
from bench.simulate import main
from bench.simulator.day import parse
from bench.simulator.kernel import Kernel
from bench.simulator.metrics import ideal, percentile, replay, slot_problems, woken_slots
from bench.simulator.strategies import (
    BACKSTOP_MINUTES,
    Cron,
    Listen,
    Ours,
    Poll,
    PolledSlots,
    strategies,
)
from drainer import clock, cloud
from drainer.run import Sizer
from drainer.wake import Next
from tests.helpers import unavailable
from tests.simulated import BURST, TIMEOUT

ROOT = Path(__file__).resolve().parent.parent
QUIET = {"hours": 3}
HOURLY = {"name": "hourly", "cron": "0 * * * *", "seconds": 2}
EVERY_20 = {"name": "every-20", "cron": "*/20 * * * *"}


def test_polling_every_second_keeps_the_compute_awake_all_day(replays):
    result = replay(parse({"hours": 1}), TIMEOUT, Poll(1), replays)
    assert result.awake_hours == pytest.approx(1)
    assert result.resumes == 1


def test_a_quiet_day_costs_ours_nothing_but_its_backstop(replays):
    day = parse(QUIET)
    assert replay(day, TIMEOUT, Ours(backstop=None), replays).awake_hours == 0
    result = replay(day, TIMEOUT, Ours(backstop=60), replays)  # ticks at 1 h and 2 h
    assert result.resumes == result.invocations == 2
    # each tick: resume + connect (statements take no time), then the suspend timeout
    assert result.awake_hours * 3600 == pytest.approx(2 * (60 * TIMEOUT + 1.03), abs=0.01)


def test_ours_backstop_is_the_template_s_default():
    template = (ROOT / "infra" / "template.yaml").read_text()
    assert re.search(r"BackstopRate:\n(?:    .*\n)*?    Default: rate\((\d+) hours?\)",
                     template)[1] == f"{BACKSTOP_MINUTES / 60:g}"


def test_a_cron_drain_resumes_the_compute_on_every_tick_of_a_quiet_day(replays):
    result = replay(parse(QUIET), TIMEOUT, Cron(15 * 60), replays)
    assert result.resumes == result.invocations == 12


def test_a_listen_worker_reconnects_after_a_suspension_and_so_wakes_it_again(replays):
    result = replay(parse(QUIET), TIMEOUT, Listen(fallback=3600), replays)
    assert result.awake_hours > 0.99 * 3  # asleep only for its first reconnect backoff
    assert result.resumes == pytest.approx(3 * 60 / TIMEOUT, abs=1)


def test_ours_starts_a_burst_s_jobs_within_a_resume_and_retries_on_the_minute(replays):
    day = parse(BURST)
    result = replay(day, TIMEOUT, Ours(), replays)
    assert result.unfinished == 0
    assert percentile(result.latency, 0.99) < day.model.resume + 2
    assert min(result.lateness) >= 0  # no retry starts before it is due
    assert max(result.lateness) < 60 + day.model.resume + 1  # a wake-up is on the minute


def test_ours_on_a_burst_is_awake_within_10_percent_of_the_ideal(replays):
    # A run that ends while another holds a lease arms a lease wake-up; the holder,
    # finishing, deletes it, so it does not resume the suspended compute for nothing.
    day = parse(BURST)
    awake, bursts = ideal(day, TIMEOUT, replays.backoff)
    assert bursts == 1
    assert replay(day, TIMEOUT, Ours(), replays).awake_hours <= 1.1 * awake


def test_concurrent_runs_of_ours_do_not_all_wait_for_the_same_retry(replays):
    # A run waits in-process only after a drain that claimed something; one that lost
    # the race arms the (shared) wake-up. Waiting after every drain, runs averaged
    # 2.5 min each on this burst.
    result = replay(parse(BURST), TIMEOUT, Ours(), replays)
    assert result.worker_hours * 3600 < 30 * result.invocations


@pytest.mark.parametrize("strategy", strategies(), ids=lambda s: s.name)
def test_every_strategy_finishes_the_day_s_jobs_none_early(strategy, replays):
    # Long enough for the retries: a slow cron runs one attempt per tick.
    day = parse({**BURST, "hours": 6 if isinstance(strategy, Cron) else 1,
                 "schedules": [HOURLY]})
    result = replay(day, TIMEOUT, strategy, replays)
    assert result.unfinished == 0
    assert len(result.latency) == len(day.specs)
    # Statements take no virtual time: a LISTEN worker claims at its notification's instant.
    assert min(result.latency) >= 0 and min(result.lateness) >= 0
    # Every slot of the day ran once, none early (the next day's first is queued).
    assert len(result.slot_starts) == len(day.slots) >= 1
    assert slot_problems(day, result) == []


def test_the_day_s_slots_are_drainer_s_in_their_zone():
    day = parse({"hours": 24, "schedules": [
        {"name": "paris", "cron": "0 3 * * *", "tz": "Europe/Paris"}, HOURLY]})
    assert [s.at for s in day.slots if s.schedule == "paris"] == [2 * 3600]  # UTC+1 in March
    assert len(day.slots) == 25


def test_the_ideal_counts_a_slot_away_from_other_work_as_a_burst(replays):
    day = parse({"hours": 2, "schedules": [HOURLY]})
    assert ideal(day, TIMEOUT, replays.backoff) == pytest.approx(
        (2 * (2 + 60 * TIMEOUT) / 3600, 2))


def test_ours_with_schedules_wakes_at_each_slot_within_10_percent_of_the_ideal(replays):
    # No process runs between slots: each slot's job is queued with the slot as its
    # run_at, so the run before it arms the wake-up for that minute.
    day = parse({**QUIET, "schedules": [HOURLY, EVERY_20]})
    result = replay(day, TIMEOUT, Ours(), replays)
    assert slot_problems(day, result) == []
    assert woken_slots(day, result) == len(day.slots) == 12  # 3 hourly, 9 every 20 min
    # On its minute: the invoke, the resume, and at 00:00 and each hour the other
    # slot's job (2 s) ahead of it.
    assert max(result.slot_lateness) < day.model.invoke + day.model.resume + 2 + 0.1
    awake, bursts = ideal(day, TIMEOUT, replays.backoff)
    assert result.resumes == bursts == 9
    assert result.awake_hours <= 1.1 * awake


def test_a_scheduler_polling_every_30_s_keeps_the_compute_awake(replays):
    day = parse({**QUIET, "schedules": [HOURLY]})
    result = replay(day, TIMEOUT, PolledSlots(), replays)
    assert slot_problems(day, result) == []
    assert result.awake_hours == pytest.approx(3)
    assert result.resumes == 1


def test_a_schedule_every_5_minutes_keeps_a_5_minute_compute_awake(replays):
    day = parse({**QUIET, "schedules": [{"name": "five", "cron": "*/5 * * * *"}]})
    result = replay(day, TIMEOUT, Ours(backstop=None), replays)
    assert slot_problems(day, result) == []
    assert result.awake_hours == pytest.approx(3, abs=0.001)  # but the first invoke
    assert result.resumes == 1


def test_the_command_checks_the_slots_and_prints_what_a_schedule_costs(
        capsys, tmp_path, db_url, monkeypatch):
    day = tmp_path / "day.json"
    day.write_text(json.dumps({"hours": 1, "schedules": [EVERY_20]}))
    monkeypatch.setattr(bench.simulate, "SCHEDULE_COSTS", ("*/5 * * * *",))
    monkeypatch.setattr(bench.simulate, "strategies", lambda: [Ours()])
    assert main(["--day", str(day), "--timeout", "5", "--no-chart",
                 "--database-url", db_url]) == 0
    out = capsys.readouterr().out
    assert "| `*/5 * * * *` | 12 | 1.00 | 1.00 | 1 |" in out
    # An hourly cron drain misses the slots between its ticks (catch_up="latest").
    monkeypatch.setattr(bench.simulate, "strategies", lambda: [Cron(3600)])
    assert main(["--day", str(day), "--timeout", "5", "--no-chart",
                 "--database-url", db_url]) == 1
    assert "every-20 at 00:20 ran 0 times" in capsys.readouterr().err


def test_the_replay_runs_the_function_s_own_decisions(replays, monkeypatch):
    # The function stops after every drain: no wake-up for the last retries.
    day = parse(BURST)
    assert replay(day, TIMEOUT, Ours(backstop=None), replays).unfinished == 0
    monkeypatch.setattr(cloud, "after_run", lambda summary, **_: Next("none"))
    assert replay(day, TIMEOUT, Ours(backstop=None), replays).unfinished > 0


def test_the_replay_runs_drainer_s_own_drain(replays, monkeypatch):
    # A drain that may claim nothing leaves every job of the day queued.
    day = parse(BURST)
    monkeypatch.setattr(Sizer, "fits", lambda self, remaining, ahead=0: 0)
    for strategy in (Cron(900), Ours()):
        assert replay(day, TIMEOUT, strategy, replays).unfinished == len(day.specs)


def test_the_ideal_s_retries_follow_the_database_s_backoff(replays):
    assert replays.backoff[:5] == [20, 40, 80, 160, 320]
    assert replays.backoff[-1] == 3600


def test_virtual_time_moves_only_when_every_thread_waits():
    kernel, seen = Kernel(datetime(2026, 3, 3, tzinfo=UTC)), []

    def sleeper(name, seconds):
        clock.sleep(seconds)
        seen.append((name, clock.monotonic()))

    def waiter():
        event = clock.event()
        kernel.call_at(2.5, event.set)
        seen.append(("timed out", event.wait(1), clock.monotonic()))
        seen.append(("set", event.wait(10), clock.monotonic()))

    with kernel.installed():
        kernel.spawn(sleeper, "b", 2)
        kernel.spawn(sleeper, "a", 1)
        kernel.spawn(waiter)
        kernel.run(20)
        kernel.stop()
    assert seen == [("a", 1), ("timed out", False, 1), ("b", 2), ("set", True, 2.5)]


def test_the_command_prints_a_table_per_timeout(capsys, tmp_path, db_url):
    day = tmp_path / "day.json"
    day.write_text('{"hours": 1, "bursts": [{"at": "00:10", "minutes": 1, "jobs": 5}]}')
    assert main(["--day", str(day), "--timeout", "5", "--no-chart",
                 "--database-url", db_url]) == 0
    out = capsys.readouterr().out
    assert "Suspend timeout 5 min; ideal" in out
    assert out.count("\n| ") == 2 + len(strategies())  # header, ideal, one row each


def test_a_day_file_that_is_not_json_is_one_line_and_exit_2(capsys, tmp_path):
    day = tmp_path / "day.json"
    day.write_text("{")
    assert main(["--day", str(day), "--no-chart"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_chart_is_a_png_with_a_panel_per_timeout(tmp_path, db_url):
    try:
        import matplotlib  # noqa: F401 - the `bench` extra, part of `dev`
    except ImportError:
        unavailable("matplotlib", "matplotlib is not installed (pip install -e '.[bench]')")
    day, png = tmp_path / "day.json", tmp_path / "chart.png"
    day.write_text('{"hours": 1, "bursts": [{"at": "00:10", "minutes": 1, "jobs": 5}]}')
    assert main(["--day", str(day), "--timeout", "5", "--timeout", "10",
                 "--chart", str(png), "--database-url", db_url]) == 0
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(header[16:20], "big")
    assert width == 2 * 450  # two panels of 5 inches at 90 dpi
