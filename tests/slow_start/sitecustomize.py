"""Put on PYTHONPATH, this makes the interpreter's own start slow, as a heavy
site-packages does, before drainer is even imported (tests/commands/test_cli.py)."""

import os
import time

time.sleep(float(os.environ.get("SLOW_START_SECONDS", "0")))
