"""The schema's features are cached once per connection, whichever path reads
them: the drain's functions (`drainer.storage.sql`) and enqueue, on any driver."""

import psycopg

import drainer
from drainer.storage import schema, sql


def test_one_features_cache_for_the_drain_and_enqueue(empty_db_url, db_url):
    # A connection that saw no schema, then migrated from another connection: the
    # enqueue finds the key column anyway (it reads the catalog again when the cached
    # features lack what it uses), and what it read is the connection's features,
    # the drain's functions' too.
    with psycopg.connect(empty_db_url, autocommit=True) as stale, \
            psycopg.connect(empty_db_url, autocommit=True) as other:
        assert not sql.features(stale).key
        schema.migrate(other)
        drainer.enqueue(stale, "q", {}, key="k")
        assert sql.features(stale).key
