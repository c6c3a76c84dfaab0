"""The HTTP entry point, for any platform that can call a URL on a schedule (Cloud
Run, Vercel or Netlify cron, Fly.io, a Kubernetes CronJob): an ASGI application,
`drainer.http:app` (the `http` extra; serve it with any ASGI server,
e.g. `uvicorn drainer.http:app`). Each authenticated POST runs one drain and answers
its summary (README "Any platform that can call a URL")."""

from .service import create_app

app = create_app()

__all__ = ["app", "create_app"]
