"""`archive`: only archive, done and failed jobs past their age leave the jobs table."""

import argparse
from datetime import timedelta

from ..storage import admin
from .common import emit, open_db


def cmd_archive(args: argparse.Namespace) -> None:
    with open_db(args) as conn:
        moved = admin.archive(conn, timedelta(days=args.archive_after),
                              failed_older_than=timedelta(days=args.archive_failed_after),
                              to_table=admin.has_archive(conn))
    emit({"archived": moved})
