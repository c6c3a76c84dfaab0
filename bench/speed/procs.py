"""Timing processes: wall time from the first start to the last exit (process start
included), and each process's peak RSS from the kernel's accounting (wait4), both
taken by programs/launch.py, a small process that starts the measured ones."""

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

LAUNCH = Path(__file__).resolve().parent / "programs" / "launch.py"


class RunFailed(Exception):
    """A measured process exited non-zero or ran past the bench's time limit."""


@dataclass
class Timed:
    seconds: float
    max_rss_mb: float  # the largest peak RSS among the processes


def run(argvs: list[list[str]], env: dict[str, str], *, timeout: float = 600) -> Timed:
    """Start every command at once and wait for all; RunFailed with the stderr tail."""
    with tempfile.TemporaryFile() as log:
        launcher = subprocess.Popen([sys.executable, str(LAUNCH), json.dumps(argvs)], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=log, start_new_session=True)
        try:
            out, _ = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
            raise RunFailed(f"{Path(argvs[0][0]).name} ran longer than {timeout:g} s") from None
        log.seek(0)
        tail = " | ".join(log.read().decode(errors="replace").strip().splitlines()[-2:])
    if launcher.returncode:
        raise RunFailed(f"the launcher failed: {tail}")
    result = json.loads(out)
    failed = [code for code in result["exit_codes"] if code]
    if failed:
        raise RunFailed(f"{Path(argvs[0][0]).name} exited {failed[0]}: {tail}")
    return Timed(result["seconds"], result["max_rss_kb"] / 1024)
