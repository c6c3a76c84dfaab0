"""HTTP entry point of this repository: `uvicorn handlers.http:app`.

A re-export of the packaged `drainer.http.app`, which is what an app that installs
drainer (with the `http` extra) names instead; this file must not grow code of its
own.
"""

from drainer.http import app

__all__ = ["app"]
