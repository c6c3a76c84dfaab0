"""The HTTP entry point served by uvicorn in a process of its own, as a platform runs
it, and called as docs/http.md says: its curl line signs with openssl."""

import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from drainer import enqueue
from tests.cluster import free_port
from tests.helpers import ROOT, clean_env, count, wait_until
from tests.http.helpers import SECRET, signed


def curl_recipe() -> str:
    """The shell block under docs/http.md's "A signed call with curl"."""
    text = (ROOT / "docs" / "http.md").read_text()
    return re.search(r"## A signed call with curl\n\n```sh\n(.*?)```", text, re.S)[1]


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def served(web_env):
    port = free_port()
    env = clean_env(**web_env)
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "drainer.http:app",
                             "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: accepts(port) or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.stderr.read()
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


@pytest.mark.skipif(not (shutil.which("curl") and shutil.which("openssl")),
                    reason="the recipe needs curl and openssl")
def test_the_documented_curl_call_drains_and_a_replay_is_refused(served, conn):
    enqueue(conn, "web", {})
    enqueue(conn, "web", {})
    called = subprocess.run(["bash", "-c", curl_recipe()], capture_output=True, text=True,
                            env=clean_env(DRAINER_URL=served, DRAINER_HTTP_SECRET=SECRET),
                            timeout=60)
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["done"] == 2
    enqueue(conn, "web", {})
    body = b'{"n": 3}'  # not the recipe's: a request in the same second is another
    headers = signed(body)
    assert post(served, body, headers)[0] == 200
    status, said = post(served, body, headers)
    assert status == 409 and "seen already" in said["error"]
    assert count(conn, "status = 'done'") == 3
