"""The simulator's faults on tiny days: lost kicks, runs that die holding a batch,
wake-ups that fail to arm and a database restart, each with the outcome the docs
claim, and the same figures on every replay."""

import json
from pathlib import Path

from bench.simulate import FAULT_BACKSTOPS, FAULT_RATES, RESTART_AT, faults_table, main
from bench.simulator.day import parse
from bench.simulator.faults import Faults
from bench.simulator.metrics import replay
from bench.simulator.strategies import Ours
from tests.simulated import BURST, TIMEOUT

ROOT = Path(__file__).resolve().parent.parent
LEASE = 300.0  # the day's model: seconds a claim holds a job
# A job every quarter hour or so, each alone: nothing but its own kick starts it.
TRICKLE = {"hours": 3, "seed": 2, "duration": {"median": 0.2, "sigma": 0.5, "max": 5},
           "trickles": [{"from": "00:10", "to": "01:50", "per_hour": 4}]}
REACHED = 1.3 + 1  # seconds: an invoke, a resume and a connection, and a little more


def test_a_replay_with_faults_gives_the_same_figures_every_time(replays):
    day = parse(BURST)
    faults = Faults.at_rate(0.2, restarts=(400.0,))
    first, again = (replay(day, TIMEOUT, Ours(backstop=None), replays, faults)
                    for _ in range(2))
    assert first.injected == again.injected and set(first.injected) == {
        "lost_kicks", "dead_runs", "failed_arms", "restarts"}
    assert (first.awake_hours, first.resumes, first.invocations) == (
        again.awake_hours, again.resumes, again.invocations)
    assert first.starts == again.starts


def test_a_lost_kick_s_job_waits_for_the_backstop_and_no_longer(replays):
    day = parse(TRICKLE)
    lost = Faults(lost_kicks=1.0)
    assert replay(day, TIMEOUT, Ours(backstop=None), replays, lost).unfinished == len(
        day.specs)  # nothing else would start them
    hourly = replay(day, TIMEOUT, Ours(backstop=60), replays, lost)
    assert hourly.unfinished == 0
    assert max(hourly.latency) <= 3600 + REACHED
    assert min(hourly.latency) > 60  # every one waited for a tick


def test_a_run_that_dies_has_its_jobs_reaped_at_its_lease_end_with_no_backstop(replays):
    day = parse(TRICKLE)
    result = replay(day, TIMEOUT, Ours(backstop=None), replays, Faults(dead_runs=0.3))
    died = result.injected["dead_runs"]
    assert result.unfinished == 0 and died >= 1
    late = [s for s in result.latency if s > 60]
    assert len(late) <= died  # a job per run that died
    # Reaped by the run's own lease wake-up: the lease, then at most a minute (a
    # job's every run may die, each adding a lease).
    assert min(late) >= LEASE
    assert max(late) <= died * (LEASE + 60 + REACHED)


def drawn(kind: str, rate: float, hits: list[bool]) -> Faults:
    """Faults of `kind` at `rate` whose first draws strike as `hits` says."""
    for seed in range(1000):
        draws = Faults(**{kind: rate}, seed=seed).draws()
        if [draws.hit(kind) for _ in hits] == hits:
            return Faults(**{kind: rate}, seed=seed)
    raise AssertionError("no such draws")


def test_with_its_lease_wake_up_unarmed_a_dead_run_waits_for_the_backstop(replays):
    # One job; the first run dies holding it, and its lease wake-up was refused.
    day = parse({"hours": 3, "bursts": [{"at": "00:10", "minutes": 1, "jobs": 1}]})
    dies_once = drawn("dead_runs", 0.5, [True, False])
    faults = Faults(dead_runs=0.5, failed_arms=1.0, seed=dies_once.seed)
    alone = replay(day, TIMEOUT, Ours(backstop=None), replays, faults)
    assert (alone.unfinished, alone.injected["dead_runs"]) == (1, 1)
    hourly = replay(day, TIMEOUT, Ours(backstop=60), replays, faults)
    assert hourly.unfinished == 0
    [job] = day.specs
    assert 3600 <= job.enqueue_at + max(hourly.latency) <= 3600 + REACHED  # the 01:00 tick
    armed = replay(day, TIMEOUT, Ours(backstop=None), replays, dies_once)
    assert armed.unfinished == 0  # its lease wake-up reaped it
    assert LEASE <= max(armed.latency) <= LEASE + 60 + REACHED


def test_a_database_restart_in_a_burst_loses_no_job_and_costs_no_resume(replays):
    day = parse(BURST)
    calm = replay(day, TIMEOUT, Ours(backstop=None), replays)
    cut = replay(day, TIMEOUT, Ours(backstop=None), replays,
                 Faults(restarts=(400.0,), restart_seconds=10))
    assert cut.injected == {"restarts": 1}
    assert cut.unfinished == 0
    assert len(cut.latency) == len(day.specs)
    assert cut.resumes == calm.resumes == 1
    assert max(cut.latency) <= max(calm.latency) + 10 + REACHED


def test_a_restart_while_the_compute_sleeps_is_nothing_to_cut(replays):
    day = parse({"hours": 1})
    result = replay(day, TIMEOUT, Ours(backstop=None), replays, Faults(restarts=(600.0,)))
    assert result.injected == {} and result.awake_hours == 0


def test_the_command_sweeps_backstops_and_fault_rates(capsys, tmp_path, db_url):
    day = tmp_path / "day.json"
    day.write_text(json.dumps(TRICKLE))
    assert main(["--day", str(day), "--faults", "--fault-rate", "0", "--fault-rate", "1",
                 "--backstop", "0", "--backstop", "60", "--database-url", db_url]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ours")]
    assert [(r[0], r[1]) for r in rows] == [
        ("| ours, no backstop", "0 %"), ("| ours, no backstop", "100 %"),
        ("| ours, backstop 1 h", "0 %"), ("| ours, backstop 1 h", "100 %")]
    unfinished = [int(r[10]) for r in rows]
    assert unfinished[0] == unfinished[2] == 0 and unfinished[1] == len(parse(TRICKLE).specs)


def fault_rows(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    """The rows of the faults table in `path`, by strategy and fault rate."""
    rows, header = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("| strategy | fault rate |"):
            header = [c.strip() for c in line.strip("|").split("|")]
        elif header and line.startswith("| ours"):
            cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")),
                             strict=True))
            rows[cells["strategy"], cells["fault rate"]] = cells
        elif not line.startswith("|"):
            header = None
    return rows


def test_the_docs_fault_table_is_the_sweep_s():
    rows = fault_rows(ROOT / "docs" / "waiting-costs.md")
    assert list(rows) == [(Ours(backstop=b).name, f"{100 * r:g} %")
                          for b in FAULT_BACKSTOPS for r in FAULT_RATES]
    docs = (ROOT / "docs" / "waiting-costs.md").read_text()
    [header] = [line for line in docs.splitlines() if line.startswith("| strategy | fault")]
    assert header in faults_table(parse({}), TIMEOUT, [], [0.0])
    assert f"restarts at {RESTART_AT}" in faults_table(parse({}), TIMEOUT, [], [0.0])


def test_the_readme_s_fault_rows_are_the_docs_ones():
    readme = fault_rows(ROOT / "README.md")
    docs = fault_rows(ROOT / "docs" / "waiting-costs.md")
    assert len(readme) >= 4 * len(FAULT_BACKSTOPS)
    for key, cells in readme.items():
        assert cells == {name: docs[key][name] for name in cells}, key
    assert parse(json.loads((ROOT / "bench" / "day.json").read_text())).model.lease == LEASE
