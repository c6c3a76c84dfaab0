"""A drain's OpenTelemetry spans (see drainer/tracing.py): its own, and one per job
whose handler ran, ended batch by batch once the batch is written back."""

from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from .. import clock
from ..model import Job, Settled, Token
from ..tracing import api, propagator
from .outcome import Outcome

if TYPE_CHECKING:
    from opentelemetry.trace import Span


class DrainTrace:
    """A drain's spans: its own, started with the drain, and its jobs', ended batch
    by batch."""

    def __init__(self, trace: ModuleType, queues: Sequence[str]):
        self.trace = trace
        self.tracer = trace.get_tracer("drainer")
        self.span: Span = self.tracer.start_span(
            "drainer.drain", attributes={"drainer.queues": list(queues)})
        self.recording = self.span.is_recording()
        self.times: dict[Token, tuple[int, int]] = {}  # claim -> handler start, end (ns)

    @classmethod
    def start(cls, queues: Sequence[str]) -> "DrainTrace | None":
        trace = api()
        return None if trace is None else cls(trace, queues)

    def took(self, job: Job, seconds: float) -> None:
        """A handler ended (or was written off at its timeout) `seconds` after it began;
        from the batch's `took`, on the handler's thread."""
        end = int(clock.wall() * 1e9)
        self.times[job.token] = (end - int(seconds * 1e9), end)

    def batch(self, jobs: Sequence[Job], settled: Settled, outcome: Outcome) -> None:
        """End the spans of a written-back batch's jobs."""
        done = {job.token for job in outcome.succeeded}
        failed = {job.token: setback for job, setback in outcome.failed}
        for job in jobs:
            times = self.times.pop(job.token, None)
            if times is None:
                continue  # never started, or its handler had not ended
            setback = failed.get(job.token)
            error = None
            if job.token in outcome.lost:
                result = "lost"
            elif job.token in done:
                result = "done" if job.token in settled.done else "lost"
            elif setback is not None and job.token in settled.failed:
                result = {"snooze": "snoozed"}.get(setback.then) or (
                    "retry" if settled.failed[job.token].status == "queued" else "failed")
                error = None if result == "snoozed" else setback.error
            else:
                result = "lost"
            self._job_span(job, result, error, times)

    def _job_span(self, job: Job, result: str, error: str | None,
                  times: tuple[int, int]) -> None:
        trace = self.trace
        parent = _parent(job.meta)
        span = self.tracer.start_span(
            "drainer.job",
            context=parent if parent is not None else trace.set_span_in_context(self.span),
            kind=trace.SpanKind.CONSUMER,
            links=[trace.Link(self.span.get_span_context())],
            start_time=times[0],
            attributes={"drainer.queue": job.queue, "drainer.job.id": job.id,
                        "drainer.job.attempt": job.attempts, "drainer.job.outcome": result})
        if error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.end(end_time=times[1])

    def end(self, summary: dict[str, object] | None, error: BaseException | None) -> None:
        """End the drain span, with the summary's counts and stop reason."""
        if summary is not None and self.recording:
            self.span.set_attributes({f"drainer.{k}": v for k, v in summary.items()
                                      if isinstance(v, int | str)})
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(self.trace.Status(self.trace.StatusCode.ERROR, str(error)))
        self.span.end()


def _parent(meta: object) -> Any:
    """The context a job's meta carries (another producer's meta may hold anything)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("traceparent"), str):
        return None
    carrier = {k: meta[k] for k in ("traceparent", "tracestate") if isinstance(meta.get(k), str)}
    context = propagator().extract(carrier)
    trace = api()
    if trace is None or not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context
