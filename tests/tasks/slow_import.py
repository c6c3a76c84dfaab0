"""A task module whose import takes SLOW_IMPORT_SECONDS (tests/commands/test_cli.py)."""

import os
import time

from drainer import task

time.sleep(float(os.environ.get("SLOW_IMPORT_SECONDS", "0")))


@task("default")
def slow_import(job):
    pass
