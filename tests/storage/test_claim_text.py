"""Every claim a drain can send is checked in as the text the server receives
(drainer/storage/queries/claims.generated.sql), and the statement files load as one
set of uniquely named statements."""

from datetime import timedelta
from importlib.resources import files

import pytest

from drainer.storage import claim_text, roundtrip, sql
from drainer.storage.claim import MANY_QUEUES
from drainer.storage.limits import Limits

GENERATED = files("drainer").joinpath("storage", "queries", "claims.generated.sql")
LEASE = timedelta(minutes=5)


@pytest.mark.once
def test_the_checked_in_claims_are_the_ones_the_code_sends():
    assert GENERATED.read_text(encoding="utf-8") == claim_text.render(), (
        "claims.generated.sql differs from the claims the code builds: review the "
        f"difference, then regenerate it with `{claim_text.REGENERATE}`")


@pytest.mark.once
def test_each_variant_is_written_once_under_its_header():
    text = GENERATED.read_text(encoding="utf-8")
    variants = claim_text.variants()
    assert len(set(variants.values())) == len(variants) == 36
    for name in variants:
        assert text.count(f"\n-- variant: {name}\n") == 1


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
