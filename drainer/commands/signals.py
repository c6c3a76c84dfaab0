"""SIGTERM/SIGINT during `drain`, `work` and `demo`: a first one finishes the running
handlers, a second stops at once, a third ends the process; and the exit status that
tells a shell a second signal ended the run."""

import contextlib
import os
import signal
import sys
import threading

from .. import clock, stopping
from .common import log

MEMBER = "DRAINER_MEMBER"  # in a member's environment (`--processes`, members.py)

# Seconds, after a second signal's bound on the last round trips, before the process
# ends whatever it is waiting for.
GIVE_UP_AFTER = 2.0


def stop_on_signals() -> stopping.Stop:
    """SIGTERM/SIGINT: stop claiming and let running handlers finish. A second one
    stops at once: what finished is written back and the jobs that never started are
    given back, within a second or two, and the handlers still running are left to
    their lease. A third ends the process there and then."""
    stop = stopping.Stop()

    # Each handler is swapped for the next before it says so: a signal sent again
    # as soon as the line is seen finds the next one.
    def first(signum: int, _frame: object) -> None:
        stop.set()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, second)
        log.info("%s received: finishing running handlers, then stopping (send it again "
                 "to stop at once)", signal.Signals(signum).name)

    def second(signum: int, _frame: object) -> None:
        stop.hurry(signum)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        stop.last_resort = clock.later(stopping.HURRY + GIVE_UP_AFTER, give_up, 128 + signum)
        log.warning("%s received while stopping: stopping now, giving back the jobs that never "
                    "started", signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, first)
    if os.environ.get(MEMBER):
        threading.Thread(target=_until_parent_ends, args=(stop,), daemon=True,
                         name="drainer-parent").start()
    return stop


def _until_parent_ends(stop: stopping.Stop) -> None:
    """A member of `--processes` (drainer.commands.members): its stdin is a pipe from
    the process that started it, which ends when that process does, however it ends
    (kill -9 too); then stop as at a first signal."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):  # the file descriptor: sys.stdin's lock would hold up the exit
            pass
    if not stop.is_set():
        log.info("the process that started this member has ended: finishing running "
                 "handlers, then stopping")
        stop.set()


def give_up(code: int) -> None:
    """The last resort after a second signal: a round trip that went out before the
    first one and still waits for a database that does not answer."""
    log.error("the database did not answer in time; exiting without the summary "
              "(the jobs this process held wait for their lease)")
    sys.stderr.flush()
    os._exit(code)


def exit_code(stop: stopping.Stop) -> int | None:
    """After a second signal, 128 + its number (130 for SIGINT), as a shell reports a
    process ended by it; None otherwise. A connection left with a round trip out
    cannot be closed safely: then the process ends here, once its output is out."""
    if stop.signum is None:
        return None
    if stop.last_resort is not None:
        stop.last_resort.cancel()
    code = 128 + stop.signum
    if stop.stranded:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def ignore_signals() -> None:
    """Once the work is written back, SIGTERM/SIGINT change nothing: a platform's stop
    that comes as the process prints its summary and exits (the interpreter restores
    the default action as it shuts down) must not turn a finished run's exit status
    into 143."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
