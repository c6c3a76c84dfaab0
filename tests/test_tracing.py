"""OpenTelemetry tracing (drainer.tracing), checked with the SDK's in-memory exporter: a
span for the drain, one per job with its outcome, the enqueue's trace context carried
to the job's span in the job's meta; and nothing imported when the app never did."""

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import drainer
from drainer.run import Options, drain

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    """The process's tracer provider (it can be set once per process), exporting to
    memory while this module's tests run."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        made = TracerProvider()
        made.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(made)
    yield
    EXPORTER.shutdown()  # later tests' drains export nothing


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def handler(job):
    if job.payload.get("fail"):
        raise RuntimeError("boom")
    if job.payload.get("snooze"):
        raise drainer.Snooze(delay=60)
    if job.payload.get("lose"):
        with psycopg.connect(job.payload["lose"], autocommit=True) as other:
            drainer.cancel(other, [job.id])


def test_a_drain_makes_its_span_and_one_per_job_with_the_outcome(conn, db_url, spans):
    ids = {
        "done": drainer.enqueue(conn, "default", {}),
        "retry": drainer.enqueue(conn, "default", {"fail": True}, max_attempts=2),
        "failed": drainer.enqueue(conn, "default", {"fail": True}, max_attempts=1),
        "snoozed": drainer.enqueue(conn, "default", {"snooze": True}),
        "lost": drainer.enqueue(conn, "default", {"lose": db_url}),
    }
    s = drain(conn, {"default": handler}, Options(["default"]))
    assert (s.done, s.lost) == (1, 1)
    [drained] = [x for x in spans.get_finished_spans() if x.name == "drainer.drain"]
    jobs = [x for x in spans.get_finished_spans() if x.name == "drainer.job"]
    assert drained.attributes["drainer.queues"] == ("default",)
    assert (drained.attributes["drainer.done"], drained.attributes["drainer.lost"]) == (1, 1)
    assert sorted((x.attributes["drainer.job.outcome"], x.attributes["drainer.job.id"])
                  for x in jobs) == sorted(ids.items())
    for span in jobs:
        assert span.attributes["drainer.queue"] == "default"
        assert span.attributes["drainer.job.attempt"] == 1
        assert span.kind == trace.SpanKind.CONSUMER
        # No enqueue context: a child of the drain span, and linked to it.
        assert span.parent.span_id == drained.context.span_id
        assert [link.context.span_id for link in span.links] == [drained.context.span_id]
        assert drained.start_time <= span.start_time <= span.end_time <= drained.end_time
        failing = span.attributes["drainer.job.outcome"] in ("retry", "failed")
        assert (span.status.status_code == trace.StatusCode.ERROR) == failing
        if failing:
            assert span.status.description == "RuntimeError: boom"


def test_a_job_found_lost_while_its_batch_is_refilled_has_one_span(conn, db_url, spans):
    """A job found lost mid-batch is written back lost by a refill before its handler
    ends; its span still comes, once, with that outcome."""
    drainer.enqueue_many(conn, "default", [{}] * 400)
    [(lose,)] = conn.execute("SELECT min(id) FROM jobs").fetchall()

    def lingering(job: drainer.Job) -> None:
        if job.id == lose:
            with psycopg.connect(db_url, autocommit=True) as other:
                drainer.cancel(other, [job.id])
            assert job.cancelled.wait(5)  # a heartbeat found it lost
            time.sleep(0.5)  # meanwhile a refill writes the loss back
        else:
            time.sleep(0.005)

    s = drain(conn, {"default": lingering}, Options(["default"], batch_size=8, concurrency=2,
                                                    lease=timedelta(seconds=3)))
    assert (s.done, s.lost) == (399, 1)
    jobs = [x for x in spans.get_finished_spans() if x.name == "drainer.job"]
    assert len(jobs) == 400
    assert [x.attributes["drainer.job.outcome"] for x in jobs
            if x.attributes["drainer.job.id"] == lose] == ["lost"]


def test_the_enqueues_trace_context_is_the_job_spans_parent(conn, spans):
    tracer = trace.get_tracer("the app")
    with tracer.start_as_current_span("request") as request:
        one = drainer.enqueue(conn, "default", {})
        drainer.enqueue(conn, "default", {}, group="g")  # with the group, in one meta
        drainer.enqueue_many(conn, "default", [{}, {}])
    untraced = drainer.enqueue(conn, "default", {})
    metas = dict(conn.execute("SELECT id, meta FROM jobs").fetchall())
    assert metas[untraced] is None
    traceparent = metas[one]["traceparent"]
    assert traceparent.startswith(f"00-{request.context.trace_id:032x}-"  # then the flags
                                  f"{request.context.span_id:016x}-")
    assert metas[one + 1] == {"group": "g", "traceparent": traceparent}
    assert [m["traceparent"] for m in metas.values() if m] == [traceparent] * 4

    drain(conn, {"default": handler}, Options(["default"]))
    [drained] = [x for x in spans.get_finished_spans() if x.name == "drainer.drain"]
    jobs = {x.attributes["drainer.job.id"]: x for x in spans.get_finished_spans()
            if x.name == "drainer.job"}
    assert len(jobs) == 5
    for job_id, span in jobs.items():
        parent = drained.context if job_id == untraced else request.context
        assert (span.context.trace_id, span.parent.span_id) == (parent.trace_id,
                                                               parent.span_id)
        assert [link.context.span_id for link in span.links] == [drained.context.span_id]


def test_a_bad_traceparent_another_producer_wrote_is_ignored(conn, spans):
    job = drainer.enqueue(conn, "default", {})
    conn.execute("UPDATE jobs SET meta = '{\"traceparent\": \"nonsense\"}' WHERE id = %s",
                 (job,))
    s = drain(conn, {"default": handler}, Options(["default"]))
    assert s.done == 1
    [span] = [x for x in spans.get_finished_spans() if x.name == "drainer.job"]
    [drained] = [x for x in spans.get_finished_spans() if x.name == "drainer.drain"]
    assert span.parent.span_id == drained.context.span_id


def test_nothing_of_opentelemetry_is_imported_when_the_app_never_did(conn, db_url):
    drainer.enqueue(conn, "default", {})
    script = textwrap.dedent(f"""
        import json, sys
        import psycopg, drainer
        from drainer.run import Options, drain
        with psycopg.connect({db_url!r}, autocommit=True) as conn:
            drainer.enqueue(conn, "default", {{}})
            s = drain(conn, {{"default": lambda job: None}}, Options(["default"]))
        print(json.dumps([s.done, sorted(m for m in sys.modules if "opentelemetry" in m)]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert json.loads(out) == [2, []]
