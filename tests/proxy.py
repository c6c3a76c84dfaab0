"""A TCP proxy on 127.0.0.1 in front of the test cluster that behaves, while told to,
as a database resuming from a pause does: it refuses connections (nothing listens),
accepts them and stays silent, or drops them mid-handshake; else it forwards them.
Threads, so a test drives it from its own thread while drainer runs in a process."""

import contextlib
import socket
import threading

import psycopg

from tests.cluster import free_port

MODES = ("forward", "refuse", "silent", "drop")


class Proxy:
    """`mode` says what a new connection meets; `accepted[mode]` counts the
    connections each mode took (refused ones never reach us)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.mode = "forward"
        self.accepted = dict.fromkeys(MODES, 0)
        self.held: list[socket.socket] = []  # silent ones, closed when the mode changes
        self.lock = threading.Lock()
        self.listener: socket.socket | None = None

    def url(self, url: str) -> str:
        """`url` (of the cluster) through the proxy."""
        info = psycopg.conninfo.conninfo_to_dict(url)
        info.update(host="127.0.0.1", port=self.port)
        return psycopg.conninfo.make_conninfo("", **info)

    def start(self, mode: str = "forward") -> "Proxy":
        self.set(mode)
        return self

    def set(self, mode: str) -> None:
        assert mode in MODES
        with self.lock:
            self.mode, held, self.held = mode, self.held, []
        for conn in held:
            conn.close()
        if mode == "refuse":
            self._close_listener()
        elif self.listener is None:
            self.listener = socket.create_server(("127.0.0.1", self.port))
            threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def stop(self) -> None:
        self.set("refuse")

    def _close_listener(self) -> None:
        listener, self.listener = self.listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept()
            listener.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: refusing now
            with self.lock:
                mode = self.mode
                self.accepted[mode] += 1
                if mode == "silent":
                    self.held.append(conn)
            if mode == "drop":
                with contextlib.suppress(OSError):
                    conn.recv(1024)  # the client's first message, then nothing
                conn.close()
            elif mode == "forward":
                self._forward(conn)

    def _forward(self, conn: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Bytes from `source` to `sink` until either side ends, then both are closed."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for end in (source, sink):
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
        end.close()
