"""Logs in the function: JSON lines on stdout, which Cloud Logging reads as
structured entries (`severity`, `message`, and the run's fields), with no agent
and no API call; each carries the request's execution id."""

import logging

from .. import jsonlines
from ..jsonlines import JsonLines

_formatter = JsonLines(level="severity", request="execution_id")


def setup(execution_id: str | None) -> None:
    _formatter.request_id = execution_id
    jsonlines.install(_formatter, logging.INFO)


def teardown() -> None:
    """Undo `setup` (for tests; see drainer.testing.reset)."""
    jsonlines.uninstall(_formatter)
