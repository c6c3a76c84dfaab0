"""Google Cloud Run functions entry points of this repository's own recipe
(infra/gcp/): `--entry-point drain_http` or `drain_pubsub`, with
GOOGLE_FUNCTION_SOURCE=handlers/gcp.py; see infra/gcp/README.md.

A re-export of the packaged `drainer.gcp.entry`, which is what an app that installs
drainer imports in its own main.py instead: this file must not grow code of its own.
"""

from drainer.gcp.entry import drain_http, drain_pubsub

__all__ = ["drain_http", "drain_pubsub"]
