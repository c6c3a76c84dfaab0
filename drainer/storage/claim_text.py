"""Every claim a drain can send, as the server receives it: the text
`queries/claims.generated.sql` holds, so that a change to any part of a claim shows
in review as a change to the statements sent. Regenerate it with

    python -m drainer.storage.claim_text > drainer/storage/queries/claims.generated.sql

(tests/storage/test_claim_text.py fails while the file differs from what this writes). The
plain claims differ by batch size in their LIMIT only, written for a batch of BATCH.
"""

import sys
from dataclasses import fields, replace
from itertools import product

from . import sql
from .claim import claim_sql, limited_sql

BATCH = 100  # the batch size written into the plain claims' LIMIT (any size: its literal)
REGENERATE = "python -m drainer.storage.claim_text > drainer/storage/queries/claims.generated.sql"


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


def variants() -> dict[str, str]:
    """Each claim text drainer can send, under a name that says when it is sent."""
    found: dict[str, str] = {}
    for by_priority, meta, given_now, many in product((False, True), repeat=4):
        name = ", ".join(["plain", "by priority" if by_priority else "by oldest",
                          _yes(meta, "meta"), "given now" if given_now else "database now",
                          "many queues" if many else "few queues"])
        found[name] = claim_sql(BATCH, by_priority, meta, given_now=given_now, many=many)
    # A schema with paused queues has priorities and meta too (their migrations come first).
    for given_now, many in product((False, True), repeat=2):
        name = ", ".join(["plain, by priority, meta, paused queues",
                          "given now" if given_now else "database now",
                          "many queues" if many else "few queues"])
        found[name] = claim_sql(BATCH, True, True, True, given_now, many)
    for (given_now, grouped), schema in product(product((False, True), repeat=2), SCHEMAS):
        name = ", ".join(["limited", "given now" if given_now else "statement time",
                          _yes(grouped, "groups"), schema])
        found[name] = limited_sql(given_now, grouped, SCHEMAS[schema])
    return found


def render() -> str:
    """The file's text: a header, then each variant under `-- variant: <name>`."""
    head = ("-- Generated: every claim text drainer can send, exactly as sent (plain "
            f"claims for a batch of {BATCH}).\n-- Do not edit; regenerate with\n--   "
            f"{REGENERATE}\n")
    return head + "".join(f"\n-- variant: {name}\n{text}\n"
                          for name, text in variants().items())


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
