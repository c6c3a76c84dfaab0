"""`reap`: only reap, expired leases back to queued (failed at max_attempts)."""

import argparse

from ..storage import admin
from .common import emit, open_db


def cmd_reap(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        emit({"reaped": admin.reap(conn)})
