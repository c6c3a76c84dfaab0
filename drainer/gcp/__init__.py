"""drainer on Google Cloud (the `gcp` extra): a Cloud Run function that drains.

Nothing here is imported by the command line: the Google client libraries and
the Functions Framework cost start-up time, so only these modules import them,
and the clients only when first needed.

- `entry.drain_http(request)`, `entry.drain_pubsub(cloud_event)`: the Functions
  Framework entry points (Cloud Scheduler or Cloud Tasks over HTTP, a Pub/Sub
  topic); `handlers/gcp.py` re-exports them.
- `function.run(trigger, settings)`: the run they call.
- `credentials`: DATABASE_URL, or a Secret Manager secret.
- `wakeups`: Cloud Tasks tasks named by their minute, for the next due job.
"""
