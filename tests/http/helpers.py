"""What the HTTP entry point's tests share: the keys, and how a caller signs."""

import time

from drainer.http.auth import sign

SECRET = "shared-secret-for-tests"
TOKEN = "bearer-token-for-tests"


def signed(body: bytes = b"{}", *, ago: float = 0, secret: str = SECRET) -> dict[str, str]:
    """The headers of a request signed `ago` seconds ago."""
    stamp = str(int(time.time() - ago))
    return {"Drainer-Timestamp": stamp, "Drainer-Signature": sign(secret, stamp, body)}
