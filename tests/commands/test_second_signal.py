"""A second Ctrl-C: real `python -m drainer` processes signalled twice.

The first SIGINT lets the running handlers finish; the second must not wait for them,
nor leave the jobs the drain claimed but never started locked for a whole lease: they
are given back, what finished is written back, the summary is printed (its counts
balance) and the process exits 130. The handlers still running are left to their
lease, and stderr says so.
"""

import contextlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import drainer
from drainer.db import connect
from tests.helpers import read_until, summary_of, wait_until, with_modules

# Each job waits for its own gate file; started-I and ended-I tell the test where it is.
GATED = """
import time
from pathlib import Path

from drainer import task


@task("default")
def gated(job):
    here, i = Path(job.payload["dir"]), job.payload["i"]
    (here / f"started-{i}").touch()
    while not (here / f"go-{i}").exists():
        time.sleep(0.01)
"""

JOBS, CONCURRENCY = 8, 2


def started(here: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in here.glob("started-*"))


def two_running_one_done(db_url: str, tmp_path: Path, command: str,
                         url: str | None = None) -> tuple[subprocess.Popen, bytes, int, set[int]]:
    """A drainer (`command`) holding all JOBS in one batch: one job done, two running
    and five never started, then stopped by a first SIGINT. The process, its stderr so
    far, the done job's id and the running ones'."""
    with connect(db_url) as conn:
        ids = [drainer.enqueue(conn, "default", {"dir": str(tmp_path), "i": i})
               for i in range(JOBS)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "drainer", command, "--database-url", url or db_url,
         "--tasks", "gated", "--concurrency", str(CONCURRENCY), "--batch-size", str(JOBS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=with_modules(tmp_path, gated=GATED))
    first = wait_until(lambda: len(started(tmp_path)) == CONCURRENCY and started(tmp_path))
    (tmp_path / f"go-{first[0]}").touch()
    # Its slot starting a third job: the first job's end is recorded.
    running = wait_until(lambda: len(started(tmp_path)) == CONCURRENCY + 1 and started(tmp_path))
    proc.send_signal(signal.SIGINT)
    seen = read_until(proc, b"SIGINT received")
    return proc, seen, ids[first[0]], {ids[i] for i in running if i != first[0]}


def second_sigint(proc: subprocess.Popen, seen: bytes) -> tuple[dict, str]:
    """Send the second SIGINT; once the process exited 130, its summary and stderr."""
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (seen + err).decode()
    return summary_of(out.decode()), (seen + err).decode()


def jobs(db_url: str) -> dict[int, tuple[str, int, bool]]:
    """{id: (status, attempts, whether its lease ends over a minute from now)}."""
    with connect(db_url) as conn:
        rows = conn.execute("SELECT id, status, attempts, "
                            "coalesce(locked_until > now() + interval '1 minute', false) "
                            "FROM jobs").fetchall()
    return {row[0]: row[1:] for row in rows}


@pytest.mark.parametrize("command", ["drain", "work"])
def test_a_second_sigint_gives_back_what_never_started_and_exits_130(db_url, tmp_path,
                                                                       command):
    proc, seen, done, running = two_running_one_done(db_url, tmp_path, command)
    summary, err = second_sigint(proc, seen)
    assert summary["stopped"] == "signal"
    assert (summary["claimed"], summary["done"]) == (1, 1), summary
    assert summary["claimed"] == sum(summary[k] for k in ("done", "retried", "failed", "lost"))
    after = jobs(db_url)
    assert after.pop(done) == ("done", 1, False)
    # The running ones keep their lease: their handlers may still be at work.
    assert {i: after.pop(i) for i in running} == {i: ("running", 1, True) for i in running}
    # The five that never started are queued again, their attempt given back.
    assert sorted(after.values()) == [("queued", 0, False)] * (JOBS - 1 - CONCURRENCY)
    assert "SIGINT received while stopping: stopping now" in err
    assert f"{CONCURRENCY} jobs still running are left to their lease" in err, err
    assert "Traceback" not in err, err


class Blackhole:
    """A TCP proxy to the database that, once `cut`, forwards nothing more either
    way and keeps its sockets open: a database that no longer answers."""

    def __init__(self, db_url: str):
        info = psycopg.conninfo.conninfo_to_dict(db_url)
        self.target = (str(info["host"]), int(info["port"]))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = psycopg.conninfo.make_conninfo(
            db_url, host="127.0.0.1", port=str(self.listener.getsockname()[1]))
        self.cut = threading.Event()
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
                self.sockets += [client, server]
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not self.cut.is_set():
                    sink.sendall(data)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def blackhole(db_url: str) -> Iterator[Blackhole]:
    proxy = Blackhole(db_url)
    yield proxy
    proxy.close()


def test_a_second_sigint_with_the_database_silent_exits_130_within_its_bound(
        db_url, tmp_path, blackhole):
    proc, seen, done, running = two_running_one_done(db_url, tmp_path, "drain", blackhole.url)
    blackhole.cut.set()
    summary, err = second_sigint(proc, seen)
    # Nothing was written back: nothing is counted as kept.
    assert summary["claimed"] == summary["done"] == 0, summary
    assert summary["stopped"] == "signal"
    assert "the database did not answer in time: 5 jobs that never started and 1 that " \
           "finished are left to their lease" in err, err
    # All of them wait for their lease, as after a kill -9.
    assert set(jobs(db_url).values()) == {("running", 1, True)}
