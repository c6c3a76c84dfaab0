"""The statement files load as one set of uniquely named statements."""

import pytest

from drainer.storage import sql


def test_a_statement_named_twice_is_an_error():
    with pytest.raises(ValueError, match="'twice' is named twice: in a.sql and in b.sql"):
        sql._load({"a.sql": "-- name: twice\nSELECT 1;\n", "b.sql": "-- name: twice\nSELECT 2;\n"})
    with pytest.raises(ValueError, match="in a.sql and in a.sql"):
        sql._load({"a.sql": "-- name: twice\nSELECT 1;\n-- name: twice\nSELECT 2;\n"})
    assert sql._load({"a.sql": "-- name: one\nSELECT 1;\n", "b.sql": "-- name: two\nSELECT 2;\n"}
                     ) == {"one": "SELECT 1;", "two": "SELECT 2;"}
