"""Every claim a drain can send is checked in as the text the server receives
(drainer/storage/queries/claims.*.generated.sql), and the statement files load as one
set of uniquely named statements."""

from datetime import timedelta
from importlib.resources import files

import pytest

from drainer.storage import claim_text, roundtrip, sql
from drainer.storage.claim import MANY_QUEUES
from drainer.storage.limits import Limits

QUERIES = files("drainer").joinpath("storage", "queries")
LEASE = timedelta(minutes=5)


@pytest.mark.once
def test_the_checked_in_claims_are_the_ones_the_code_sends():
    generated = {name: QUERIES.joinpath(name).read_text(encoding="utf-8")
                 for name in claim_text.render()}
    written = {p.name for p in QUERIES.iterdir() if p.name.endswith(".generated.sql")}
    assert written == set(generated) and generated == claim_text.render(), (
        "the claims.*.generated.sql files differ from the claims the code builds: review "
        f"the difference, then regenerate them with `{claim_text.REGENERATE}`")


@pytest.mark.once
def test_each_variant_is_written_once_under_its_header():
    variants = claim_text.variants()
    assert len(set(variants.values())) == len(variants) == 18
    for name in variants:
        text = QUERIES.joinpath(claim_text.file_of(name)).read_text(encoding="utf-8")
        assert text.count(f"\n-- variant: {name}\n") == 1


def test_a_claim_given_its_time_differs_by_that_time_alone():
    """The claims a test sends with its own time (not written out) are the written ones
    with `coalesce(%(now)s, now())` where those read the database's clock: now() in a
    plain claim, statement_timestamp() in a limited one."""
    given, written = claim_text.variants(given_now=True), claim_text.variants()
    assert given.keys() == written.keys()
    for name, text in given.items():
        own = "statement_timestamp()" if name.startswith("limited") else "now()"
        assert "coalesce(%(now)s, now())" in text
        assert text.replace("coalesce(%(now)s, now())", own) == written[name], name


def test_the_claims_a_drain_sends_are_among_the_variants(conn, monkeypatch):
    """The plain claim of a few queues and of many, and a limited claim with groups,
    as they go to the server: each is one of the texts written out."""
    sent: list[str] = []
    execute = sql.execute

    def spy(target: object, text: str, params: sql.Params = None) -> object:
        sent.append(text)
        return execute(target, text, params)  # type: ignore[arg-type]

    monkeypatch.setattr(sql, "execute", spy)
    many = [f"q{n}" for n in range(MANY_QUEUES + 1)]
    roundtrip.claim(conn, ["q0"], claim_text.BATCH, LEASE)
    roundtrip.claim(conn, many, claim_text.BATCH, LEASE)
    roundtrip.claim(conn, [], claim_text.BATCH, LEASE, limited=[Limits("g", per_group=1)])
    known = set(claim_text.variants().values())
    claims = [text for text in sent if "FOR UPDATE SKIP LOCKED" in text]
    # the many-queue claim that took nothing is sent again as a claim of a few (_claim_whole)
    assert len(claims) == 4 and all(text in known for text in claims)


def test_a_statement_named_twice_is_an_error():
    with pytest.raises(ValueError, match="'twice' is named twice: in a.sql and in b.sql"):
        sql._load({"a.sql": "-- name: twice\nSELECT 1;\n", "b.sql": "-- name: twice\nSELECT 2;\n"})
    with pytest.raises(ValueError, match="in a.sql and in a.sql"):
        sql._load({"a.sql": "-- name: twice\nSELECT 1;\n-- name: twice\nSELECT 2;\n"})
    assert sql._load({"a.sql": "-- name: one\nSELECT 1;\n", "b.sql": "-- name: two\nSELECT 2;\n"}
                     ) == {"one": "SELECT 1;", "two": "SELECT 2;"}
