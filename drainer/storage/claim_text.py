"""Every claim a drain can send, as the server receives it: the texts the
`queries/claims.*.generated.sql` files hold (the plain claims, the limited ones without
groups, and with them), so that a change to any part of a claim shows in review as a
change to the statements sent. Regenerate them with

    python -m drainer.storage.claim_text

(tests/storage/test_claim_text.py fails while a file differs from what this writes). The
plain claims differ by batch size in their LIMIT only, written for a batch of BATCH.
They are written as a drain sends them, on the database's clock; a test's claims, given
their time (`now`), differ by `coalesce(%(now)s, now())` in place of the claim's own
time alone (the same test checks it).
"""

import sys
from collections import defaultdict
from dataclasses import fields, replace
from itertools import product
from pathlib import Path

from . import sql
from .claim import claim_sql, limited_sql

BATCH = 100  # the batch size written into the plain claims' LIMIT (any size: its literal)
REGENERATE = "python -m drainer.storage.claim_text"
QUERIES = Path(__file__).resolve().parent / "queries"


_MIGRATED = sql.Features(*(True,) * len(fields(sql.Features)))
_UNPAUSED = replace(_MIGRATED, pauses=False)
# What a limited claim counts of the jobs cancelled while running, by the schema's last
# migration: their column (11), only their kept leases (10), none of them (before 10);
# and, once the schema has them, whether it leaves paused queues out.
SCHEMAS: dict[str, sql.Features | None] = {
    "before migration 10": replace(_UNPAUSED, cancelled_running_index=False,
                                   cancelled_running=False),
    "migration 10": replace(_UNPAUSED, cancelled_running=False),
    "migration 11": _UNPAUSED,
    "paused queues": None,
}


def _yes(flag: bool, what: str) -> str:
    return what if flag else f"no {what}"


def variants(given_now: bool = False) -> dict[str, str]:
    """Each claim text drainer can send, under a name that says when it is sent; with
    `given_now`, as a test sends it (with its own time), under the same names."""
    found: dict[str, str] = {}
    for by_priority, meta, many in product((False, True), repeat=3):
        name = ", ".join(["plain", "by priority" if by_priority else "by oldest",
                          _yes(meta, "meta"), "many queues" if many else "few queues"])
        found[name] = claim_sql(BATCH, by_priority, meta, given_now=given_now, many=many)
    # A schema with paused queues has priorities and meta too (their migrations come first).
    for many in (False, True):
        name = ", ".join(["plain, by priority, meta, paused queues",
                          "many queues" if many else "few queues"])
        found[name] = claim_sql(BATCH, True, True, True, given_now, many)
    for grouped, schema in product((False, True), SCHEMAS):
        name = ", ".join(["limited", _yes(grouped, "groups"), schema])
        found[name] = limited_sql(given_now, grouped, SCHEMAS[schema])
    return found


def file_of(name: str) -> str:
    """The file a variant is written to, by its family."""
    family = ("plain" if name.startswith("plain") else
              "limited" if ", no groups," in name else "grouped")
    return f"claims.{family}.generated.sql"


def render() -> dict[str, str]:
    """Each file's text: a header, then each of its variants under `-- variant: <name>`."""
    head = ("-- Generated: every claim text drainer can send, exactly as a drain sends it "
            f"(plain claims for a batch of {BATCH}).\n-- Do not edit; regenerate with\n--   "
            f"{REGENERATE}\n")
    texts: dict[str, str] = defaultdict(lambda: head)
    for name, text in variants().items():
        texts[file_of(name)] += f"\n-- variant: {name}\n{text}\n"
    return dict(texts)


def main() -> None:
    for name, text in render().items():
        (QUERIES / name).write_text(text, encoding="utf-8")
    sys.stdout.write(f"wrote {', '.join(sorted(render()))}\n")


if __name__ == "__main__":
    main()
