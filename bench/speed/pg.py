"""The bench's PostgreSQL: a throwaway cluster on the embedded binaries, reached over
its Unix socket (as the reference figures were), one database per system."""

from pathlib import Path

import psycopg

from tests.cluster import Cluster


class Server:
    """A started cluster; `create(name)` gives a fresh database with pg_stat_statements."""

    def __init__(self, bin_dir: Path | None = None):
        self.cluster = Cluster(bin_dir).start()

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.cluster.root}&port={self.cluster.port}"

    @property
    def bin_dir(self) -> Path:
        return self.cluster.bin_dir

    def create(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        url = self.url(name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return url

    def version(self) -> str:
        with psycopg.connect(self.url()) as conn:
            return conn.execute("SHOW server_version").fetchone()[0]

    def stop(self) -> None:
        self.cluster.stop()


def execute(url: str, *statements: str) -> None:
    """Run statements in autocommit (VACUUM needs it)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)


def scalar(url: str, sql: str) -> object:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql).fetchone()[0]


def reset_statements(url: str) -> None:
    execute(url, "SELECT pg_stat_statements_reset()")


def statements(url: str) -> int:
    """Top-level statements executed in this database since the last reset, the
    bench's own reset and reads excepted."""
    return int(scalar(url, """
        SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
        WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND query NOT ILIKE '%pg_stat_statements%'"""))
