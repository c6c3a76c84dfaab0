"""A failed attempt in the Lambda function: one JSON log line with structured fields
and the invocation's request id, so CloudWatch Logs Insights can find why a job
failed (`filter event = "job_failed"`)."""

import json
from datetime import datetime

from drainer import enqueue
from handlers.aws_lambda import handler
from tests.aws.helpers import FakeContext


def test_a_failed_attempt_is_one_structured_json_line_with_the_request_id(
        function_env, conn, capsys, monkeypatch):
    monkeypatch.setenv("DRAINER_SAFETY_MARGIN", "1")  # too little time to wait for the retry
    retry = enqueue(conn, "aws", {"fail": "SMTP 451 to postgresql://app:s3cret@db/x"},
                    max_attempts=3)
    final = enqueue(conn, "aws", {"fail": "no such mailbox"}, max_attempts=1)
    result = handler({"source": "drainer.cron"}, FakeContext(10))
    assert (result["retried"], result["failed"]) == (1, 1)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    failed = {line["id"]: line for line in lines if line.get("event") == "job_failed"}
    assert set(failed) == {retry, final}
    run_at = conn.execute("SELECT run_at FROM jobs WHERE id = %s", (retry,)).fetchone()[0]
    first = failed[retry]
    assert datetime.fromisoformat(first.pop("retry_at")) == run_at
    assert first == {
        "level": "WARNING", "logger": "drainer.run", "request_id": FakeContext.aws_request_id,
        "message": f"job {retry} (queue aws) failed, attempt 1 of 3: RuntimeError: SMTP 451 "
                   f"to postgresql://app:***@db/x; retry at {run_at.isoformat()}",
        "event": "job_failed", "id": retry, "queue": "aws", "attempt": 1, "max_attempts": 3,
        "error": "RuntimeError: SMTP 451 to postgresql://app:***@db/x", "next": "retry"}
    last = failed[final]
    assert (last["level"], last["next"], last["retry_at"], last["attempt"],
            last["max_attempts"], last["error"]) == (
        "ERROR", "failed", None, 1, 1, "RuntimeError: no such mailbox")
    assert last["message"].endswith("; failed for good")
    assert last["request_id"] == FakeContext.aws_request_id
