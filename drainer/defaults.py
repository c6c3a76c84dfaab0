"""Every setting's default, defined once: the command line, the `DRAINER_*`
variables, the cloud function, `drainer.Options` and the API's keyword arguments all
take theirs from here (drainer/settings.py says how each is read and checked)."""

from datetime import timedelta

LEASE = timedelta(minutes=5)  # a claim's lease; handlers' heartbeats extend it
ARCHIVE_AFTER = timedelta(days=7)  # done jobs, by created_at
ARCHIVE_FAILED_AFTER = timedelta(days=30)  # jobs failed for good, by run_at
MAX_ATTEMPTS = 5  # a job's runs before it fails for good
POLL = 60.0  # seconds between `work`'s fallback polls
MAX_READY_AGE = 3600.0  # seconds before `doctor` calls a waiting job a problem
STATEMENT_TIMEOUT = 10.0  # seconds, in the cloud function
SECRET_TTL = 300.0  # seconds; a rotated secret is picked up at worst this late
MAX_DEPTH = 10  # the cloud function's continuations in a row
KICK_INTERVAL = 1.0  # seconds: a producer's kicks of the function coalesce within it
# Seconds a drain keeps trying to get its first session (across attempts): a database
# that scales to zero refuses or holds connections while it resumes, and Aurora
# Serverless v2 takes about 15 s from 0 ACU, up to about 30 s after a long pause.
CONNECT_TIMEOUT = 40.0
ATTEMPT_TIMEOUT = 10.0  # seconds for one connection attempt, unless libpq's connect_timeout says
HTTP_WINDOW = 300.0  # seconds a signed HTTP request's timestamp may be off by
# Seconds an HTTP request's drain may take at most (a header may ask for less): under
# the shortest request limit of the platforms that call it (Netlify's 30 s).
HTTP_MAX_RUNTIME = 25.0
# The part of the database's sessions a fleet of drains may hold at most: half of
# what its own drains hold and what is still free. The other half stays for the
# application, whose own pools grow under the same load that made the backlog, for a
# person's psql in an incident, and for a drain's reconnect after a dropped session.
BUDGET_SHARE = 0.5
# The most drains a backlog widens to by default (--max-width, DRAINER_MAX_WIDTH):
# each holds a session and, on Lambda, an invocation; 4 gives most of the speed-up a
# small database can serve (its own CPU is shared by every drain's claims) and stays
# far inside a small server's connections and an account's default concurrency.
MAX_WIDTH = 4
