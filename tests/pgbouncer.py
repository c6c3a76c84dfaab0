"""A throwaway PgBouncer in transaction mode in front of the test server.

Debian's `pgbouncer` package (`.ci/run` installs it); tests that need it are
skipped with a notice when the binary is absent, or fail when DRAINER_TEST_REQUIRE
names pgbouncer (as CI does). PgBouncer refuses to run as root, so as root it runs
as the cluster's unprivileged server user.
"""

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.cluster import free_port, server_user

CANDIDATES = ("pgbouncer", "/usr/sbin/pgbouncer")


def binary() -> str | None:
    return next(filter(None, (shutil.which(c) for c in CANDIDATES)), None)


class PgBouncer:
    """`pool_mode = transaction` with a small pool, so consecutive statements of one
    client really do run on different server connections."""

    def __init__(self, server_url: str, *, pool_size: int = 2):
        info = psycopg.conninfo.conninfo_to_dict(server_url)
        self.server_url = server_url
        self.root = Path(tempfile.mkdtemp(prefix="drainer-pgbouncer-"))
        self.port = free_port()
        self.user = server_user()
        users = self.root / "users.txt"
        users.write_text(f'"{info.get("user", "postgres")}" ""\n')
        (self.root / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={info["host"]} port={info["port"]}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 200
logfile = {self.root / "pgbouncer.log"}
""")
        if self.user:
            for path in (self.root, *self.root.iterdir()):
                shutil.chown(path, self.user)
        self.proc: subprocess.Popen | None = None

    def start(self) -> "PgBouncer":
        self.proc = subprocess.Popen([binary(), str(self.root / "pgbouncer.ini")],
                                     user=self.user, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not start; see {self.root / 'pgbouncer.log'}")

    def url(self, dbname: str) -> str:
        """The URL of `dbname` through the pooler (same user as the server URL)."""
        info = psycopg.conninfo.conninfo_to_dict(self.server_url)
        info.update(host="127.0.0.1", port=str(self.port), dbname=dbname)
        return psycopg.conninfo.make_conninfo(**info)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def pooled(bouncer: PgBouncer, db_url: str) -> str:
    """The URL of `db_url`'s database through the pooler."""
    return bouncer.url(psycopg.conninfo.conninfo_to_dict(db_url)["dbname"])

