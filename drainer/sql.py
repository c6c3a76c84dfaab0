"""Loads the named statements of `sql/queries.sql` and the migrations of `sql/schema.sql`.

All SQL lives in those two files so that one place shows every statement we send.
"""

import re
from importlib.resources import files

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_MIGRATION = re.compile(r"^-- migration: (\d+)\b.*$", re.MULTILINE)


def _read(name: str) -> str:
    return files("drainer").joinpath("sql").joinpath(name).read_text(encoding="utf-8")


def _strip_comments(body: str) -> str:
    # Comments are for readers of the file; psycopg would also see placeholders in them.
    lines = (line for line in body.splitlines() if not line.lstrip().startswith("--"))
    return "\n".join(lines).strip()


def _split(text: str, marker: re.Pattern[str]) -> dict[str, str]:
    parts = marker.split(text)
    # parts = [preamble, key1, body1, key2, body2, ...]
    return {k: _strip_comments(body) for k, body in zip(parts[1::2], parts[2::2], strict=True)}


QUERIES: dict[str, str] = _split(_read("queries.sql"), _NAME)
MIGRATIONS: dict[int, str] = {
    int(k): v for k, v in _split(_read("schema.sql"), _MIGRATION).items()
}
LATEST_VERSION = max(MIGRATIONS)
