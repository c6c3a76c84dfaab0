"""Optional OpenTelemetry tracing (the `otel` extra: opentelemetry-api).

A drain makes a span for itself ("drainer.drain") and one per job whose handler ran
("drainer.job", a consumer span), with the job's queue, id, attempt and outcome
(done, retry, failed, lost or snoozed). Each job span is linked to the drain span;
its parent is the trace context its enqueue carried in the job's meta (`traceparent`,
`tracestate`: W3C trace context), and the drain span when there is none. Job spans
are ended from the drain's thread once the batch is written back (its outcome
known), with the times the handler began and ended; a job whose handler had not
ended when its batch did (abandoned at a stop, or found lost while it ran) has none.

This module reads the active trace context for an enqueue; the drain's spans are
drainer/engine/spans.py's. Tracing is on once the process has imported
OpenTelemetry, as any program that sets up a tracer provider has (the API alone,
without a provider, makes spans that record nothing); drainer never imports it
itself, which costs a short-lived run tens of milliseconds. With no recording tracer
provider, a drain makes no job spans.
"""

import sys
from types import ModuleType
from typing import Any

_trace: ModuleType | None = None  # opentelemetry.trace, once the process imported it


def api() -> ModuleType | None:
    """opentelemetry.trace when the process has imported it (found once, then kept);
    None costs one dictionary look-up."""
    global _trace
    if _trace is None and "opentelemetry.trace" in sys.modules:
        from opentelemetry import trace

        _trace = trace
    return _trace


def propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def context_meta() -> dict[str, str] | None:
    """The active span's W3C trace context (traceparent, tracestate) for a job's
    meta; None when no span is active (or OpenTelemetry was never imported)."""
    trace = api()
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagator().inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")} or None
