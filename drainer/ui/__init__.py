"""`drainer ui`: a local web dashboard of the queues, which reads the database only
when a person asks (a page load, a click), never on a timer of its own. Needs the
`ui` extra (Starlette, Jinja2, uvicorn); nothing else in drainer imports it."""
