"""A test task that watches `job.cancelled`, and says in files what it saw."""

import json
from pathlib import Path

from drainer import task


@task("watches_cancel")
def watches_cancel(job):
    """Waits for `job.cancelled` (at most `fallback` seconds), then writes whether it
    came, and returns normally either way."""
    cancelled = job.cancelled  # looking: the batch now heartbeats every few seconds
    Path(job.payload["started"]).touch()
    seen = cancelled.wait(job.payload["fallback"])
    Path(job.payload["seen"]).write_text(json.dumps({"seen": seen}))
