"""Optional OpenTelemetry tracing (the `otel` extra: opentelemetry-api).

A drain makes a span for itself ("drainer.drain") and one per job whose handler ran
("drainer.job", a consumer span), with the job's queue, id, attempt and outcome
(done, retry, failed, lost or snoozed). Each job span is linked to the drain span;
its parent is the trace context its enqueue carried in the job's meta (`traceparent`,
`tracestate`: W3C trace context), and the drain span when there is none. Job spans
are ended from the drain's thread once the batch is written back (its outcome
known), with the times the handler began and ended; a job whose handler had not
ended when its batch did (abandoned at a stop, or found lost while it ran) has none.

Tracing is on once the process has imported OpenTelemetry, as any program that sets
up a tracer provider has (the API alone, without a provider, makes spans that record
nothing); drainer never imports it itself, which costs a short-lived run tens of
milliseconds. With no recording tracer provider, a drain makes no job spans.
"""

import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import clock

if TYPE_CHECKING:  # at run time, queue imports this module
    from opentelemetry.trace import Span

    from .engine.outcome import Outcome
    from .model import Job, Settled, Token

_trace: ModuleType | None = None  # opentelemetry.trace, once the process imported it


def _api() -> ModuleType | None:
    """opentelemetry.trace when the process has imported it (found once, then kept);
    None costs one dictionary look-up."""
    global _trace
    if _trace is None and "opentelemetry.trace" in sys.modules:
        from opentelemetry import trace

        _trace = trace
    return _trace


def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def context_meta() -> dict[str, str] | None:
    """The active span's W3C trace context (traceparent, tracestate) for a job's
    meta; None when no span is active (or OpenTelemetry was never imported)."""
    trace = _api()
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator().inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")} or None


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
        trace = _api()
        return None if trace is None else cls(trace, queues)

    def took(self, job: "Job", seconds: float) -> None:
        """A handler ended (or was written off at its timeout) `seconds` after it began;
        from the batch's `took`, on the handler's thread."""
        end = int(clock.wall() * 1e9)
        self.times[job.token] = (end - int(seconds * 1e9), end)

    def batch(self, jobs: Sequence["Job"], settled: "Settled", outcome: "Outcome") -> None:
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

    def _job_span(self, job: "Job", result: str, error: str | None,
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
    context = _propagator().extract(carrier)
    trace = _api()
    if trace is None or not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context
