"""The one seam for Python-side time (deadlines, heartbeats, rates).

Job times never come from here: the database clock decides leases, run_at and
backoff. Functions look `time` up at call time so freezegun can drive them.
"""

import time


def monotonic() -> float:
    """Seconds on a clock that never goes back; for deadlines and durations."""
    return time.monotonic()


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def wall() -> float:
    """Seconds since the epoch, for log and metric timestamps and for timing the cloud
    run's own wake-ups; never for a job's times."""
    return time.time()
