"""What a drain tells of its work: the summary's counts, and its log lines (each
failed attempt, jobs lost, queues no task drains, what a second stop leaves)."""

import logging
import textwrap
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from .. import clock, defaults, model
from ..storage.claim import Claim
from .outcome import Outcome

log = logging.getLogger("drainer.run")  # the name its log lines always had


COUNTS = ("claimed", "done", "retried", "failed", "lost", "reaped", "archived")

@dataclass
class Summary:
    """The run's report; `claimed` counts claims kept (released ones are given back),
    so claimed = done + retried + failed + lost."""

    claimed: int = 0
    done: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    reaped: int = 0
    archived: int = 0
    seconds: float = 0.0
    stopped: str = "empty"
    next_due: datetime | None = None
    # Queues with ready jobs that no task of the run handles: nobody will run them.
    no_task: list[str] = field(default_factory=list)
    # next_due's sources, for the wake-up decisions (drainer.wake); not in the JSON.
    next_run_at: datetime | None = None
    next_lease_end: datetime | None = None
    ended_at: datetime | None = None  # the database clock when next_due was read
    # The last claim's jobs, and whether it came back full (more are likely ready):
    # what a drain knows of the backlog without counting it (drainer.width); not in
    # the JSON.
    taken: int = 0
    full: bool = False

    def took(self, jobs: int, claim: Claim) -> None:
        """Note what a claim took: full when it took all it asked for (a claim of
        limited queues only asks for no more than its free slots)."""
        asked = min(claim.size, claim.take) if claim.limited and not claim.queues else claim.size
        self.taken, self.full = jobs, jobs >= asked > 0

    def plus(self, later: "Summary") -> "Summary":
        """`later` (its stop reason, next_due...) with this summary's counts added to its
        own, and the queues without a task that either saw: the totals of a run made of
        several drains."""
        return replace(later, **{n: getattr(self, n) + getattr(later, n) for n in COUNTS},
                       no_task=sorted({*self.no_task, *later.no_task}))

    def as_json(self) -> dict[str, object]:
        data = asdict(self)
        del data["next_run_at"], data["next_lease_end"], data["ended_at"]
        del data["taken"], data["full"]
        data["seconds"] = round(self.seconds, 3)
        data["next_due"] = self.next_due.isoformat() if self.next_due else None
        return data


def left_running(jobs: list[model.Job], confirmed: float, lease: float) -> None:
    """Say which jobs a second stop leaves running, and until about when: the end of
    the lease their batch last confirmed (by this machine's clock: a rough time)."""
    if not jobs:
        return
    ends = clock.wall() + confirmed + lease - clock.monotonic()
    until = datetime.fromtimestamp(ends).astimezone().isoformat(timespec="seconds")
    log.warning("%d jobs still running are left to their lease: their handlers are "
                "abandoned as the process exits, and the jobs go back to the queue when "
                "the lease ends, at about %s (ids %s)", len(jobs), until,
                ", ".join(str(job.id) for job in jobs[:10]) + (", ..." if len(jobs) > 10 else ""))


def left_unwritten(outcome: Outcome) -> None:
    """Say what a write-back left unanswered after a second stop leaves to its lease."""
    finished = len(outcome.succeeded) + len(outcome.failed)
    if outcome.unstarted or finished:
        log.warning("the database did not answer in time: %d jobs that never started and "
                    "%d that finished are left to their lease (the finished ones run again)",
                    len(outcome.unstarted), finished)


def warn_no_task(queues: list[str]) -> None:
    """One stderr line naming the ready queues no task handles: their jobs would wait
    for ever, and a misspelled queue name says nothing otherwise."""
    if queues:
        log.warning("ready jobs in queues no task drains: %s (check the queue name, or "
                    "--tasks)", ", ".join(queues),
                    extra={"data": {"event": "no_task", "queues": queues}})


def record(settled: model.Settled, outcome: Outcome, summary: Summary) -> None:
    """Count a batch's results as written back, each job once: a job is lost when the
    heartbeat found it taken over, or when its guarded write changed nothing. Claimed
    counts the jobs written back here (not those given back unstarted, nor those
    abandoned still running), so that claimed = done + retried + failed + lost."""
    lost = (
        outcome.lost
        | {job.token for job in outcome.succeeded if job.token not in settled.done}
        | {job.token for job, _ in outcome.failed if job.token not in settled.failed}
    )
    if lost:
        log.warning("jobs lost: %d no longer ours (lease expired and taken over, or "
                    "cancelled)", len(lost))
    statuses = [failure.status for failure in settled.failed.values()]
    summary.claimed += len(outcome.succeeded) + len(outcome.failed) + len(outcome.lost)
    summary.done += len(settled.done)
    summary.failed += sum(1 for s in statuses if s == "failed")
    summary.retried += sum(1 for s in statuses if s == "queued")
    summary.lost += len(lost)


def ended_lost(settled: model.Settled, outcome: Outcome) -> list[model.Job]:
    """The batch's claims no longer ours whose handler has ended, or never began: those
    the heartbeat found taken over, and those whose guarded completion or failure
    changed nothing. A job cancelled while running holds its limits' places until then
    (writeback.end_cancelled). Unstarted jobs whose release changed nothing too, but not after a
    lost answer (`resent`): the release is not sent again then, and had it landed, its
    tokens (lowered by it) may be another drainer's now."""
    unstarted = () if settled.resent else outcome.unstarted
    if (len(settled.done) + len(settled.failed) + len(settled.released)
            == len(outcome.succeeded) + len(outcome.failed) + len(unstarted)):
        return outcome.ended_lost  # every write landed: the usual case, nothing built
    written = settled.done | settled.failed.keys() | settled.released
    ended = (*outcome.succeeded, *(job for job, _ in outcome.failed), *unstarted)
    return [*outcome.ended_lost, *(job for job in ended if job.token not in written)]


def log_failures(settled: model.Settled, outcome: Outcome) -> None:
    """One stderr line per failed attempt that was still ours once written back: the
    summary's counts alone (`retried 14`) leave a user no way to learn why short of
    psql. A failure no longer ours changed nothing and is counted lost instead."""
    for job, setback in outcome.failed:
        failure = settled.failed.get(job.token)
        if failure is None:
            continue
        if setback.then == "snooze":
            log.info("job %d (queue %s) snoozed until %s: %s", job.id, job.queue,
                     failure.run_at.isoformat(), setback.error,
                     extra={"data": {"event": "job_snoozed", "id": job.id, "queue": job.queue,
                                     "until": failure.run_at}})
        else:
            _log_failure(job, setback, failure, outcome.tracebacks.get(job.token))


def _log_failure(job: model.Job, setback: model.Setback, failure: model.Failure,
                 traced: str | None) -> None:
    """The failure as one line (a multi-line message shows its newlines as \\n), and
    as structured fields for the cloud function's JSON logs; a retry is a warning, a
    job failed for good an error. `traced` (--verbose) follows, indented."""
    retry = failure.status == "queued"
    then = (f"retry at {failure.run_at.isoformat()}" if retry else "failed for good" + (
        f" ({setback.why})" if setback.why else ""))
    error = setback.error
    shown = error.replace("\r", "\\r").replace("\n", "\\n")
    # A hand-made table may hold a NULL max_attempts, which the fail statement reads as 5.
    limit = defaults.MAX_ATTEMPTS if job.max_attempts is None else job.max_attempts
    line = (f"job {job.id} (queue {job.queue}) failed, attempt {job.attempts} of {limit}: "
            f"{shown}; {then}")
    data = {"event": "job_failed", "id": job.id, "queue": job.queue, "attempt": job.attempts,
            "max_attempts": limit, "error": error,
            "next": "retry" if retry else "failed", "retry_at": failure.run_at if retry else None}
    if traced is not None:
        line += "\n" + textwrap.indent(traced, "  ")
        data["traceback"] = traced
    log.log(logging.WARNING if retry else logging.ERROR, "%s", line, extra={"data": data})
