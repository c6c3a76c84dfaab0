"""The one seam for Python-side time (deadlines, heartbeats, rates).

Job times never come from here: the database clock decides leases, run_at and
backoff. Functions look `time` up at call time so freezegun can drive them.
"""

import os
import time

PROC_STAT = "/proc/self/stat"
PROC_UPTIME = "/proc/uptime"
IMPORTED = time.monotonic()  # the start when the OS does not say (not Linux)


def monotonic() -> float:
    """Seconds on a clock that never goes back; for deadlines and durations."""
    return time.monotonic()


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def wall() -> float:
    """Seconds since the epoch, for log and metric timestamps and for timing the cloud
    run's own wake-ups; never for a job's times."""
    return time.time()


def process_start() -> float:
    """When this process started, on `monotonic`'s scale: a run's `--max-runtime`
    must include the interpreter's start and the imports, which take a good part of
    a second, so it counts from the OS's record of the start (Linux: /proc), and
    from this module's import where there is none."""
    try:
        return min(IMPORTED, monotonic() - _seconds_since_start())
    except (OSError, ValueError, IndexError):
        return IMPORTED


def _seconds_since_start() -> float:
    """/proc/self/stat's `starttime` (field 22, clock ticks since boot) against
    /proc/uptime (seconds since boot): both on the boot clock."""
    with open(PROC_STAT) as stat:
        # The command name (field 2) is in parentheses and may hold spaces or ')'.
        fields = stat.read().rsplit(")", 1)[1].split()
    with open(PROC_UPTIME) as uptime:
        since_boot = float(uptime.read().split()[0])
    return max(0.0, since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
