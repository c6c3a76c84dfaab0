-- The drainer schema, as numbered migrations applied in order by `drainer migrate`.
-- Every statement is idempotent, so a database whose `jobs` table was created by
-- hand (the classic jobs table) upgrades cleanly. Only `jobs` is required at run time;
-- everything after migration 1 is used when present.

-- migration: 1  the classic jobs table and its partial index, column for column
CREATE TABLE IF NOT EXISTS jobs (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue        text        NOT NULL DEFAULT 'default',
  payload      jsonb       NOT NULL,
  status       text        NOT NULL DEFAULT 'queued'
               CHECK (status IN ('queued', 'running', 'done', 'failed')),
  run_at       timestamptz NOT NULL DEFAULT now(),
  attempts     int         NOT NULL DEFAULT 0,
  max_attempts int         NOT NULL DEFAULT 5,
  locked_until timestamptz,
  last_error   text,
  created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS jobs_ready_idx ON jobs (queue, run_at) WHERE status = 'queued';

-- migration: 2  indexes for the reaper, next_due and the archiver
-- Small partial indexes: only running rows (few) and done rows (by age), so the
-- reaper and archiver never scan the whole history.
CREATE INDEX IF NOT EXISTS jobs_running_idx ON jobs (locked_until) WHERE status = 'running';
CREATE INDEX IF NOT EXISTS jobs_done_idx ON jobs (created_at) WHERE status = 'done';

-- migration: 3  the archive table for finished rows
CREATE TABLE IF NOT EXISTS jobs_archive (
  id           bigint      PRIMARY KEY,
  queue        text        NOT NULL,
  payload      jsonb       NOT NULL,
  status       text        NOT NULL,
  run_at       timestamptz NOT NULL,
  attempts     int         NOT NULL,
  max_attempts int         NOT NULL,
  last_error   text,
  created_at   timestamptz NOT NULL,
  archived_at  timestamptz NOT NULL DEFAULT now()
);

-- migration: 4  NOTIFY 'jobs' with the queue name when jobs are inserted
-- A hint only (delivered at commit, merged, lost while nobody listens). One
-- notification per distinct queue per statement, so a bulk COPY of 100,000 rows
-- sends one notification, not 100,000.
CREATE OR REPLACE FUNCTION jobs_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('jobs', q.queue) FROM (SELECT DISTINCT queue FROM new_jobs) AS q;
  RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS jobs_notify ON jobs;
CREATE TRIGGER jobs_notify
AFTER INSERT ON jobs
REFERENCING NEW TABLE AS new_jobs
FOR EACH STATEMENT EXECUTE FUNCTION jobs_notify();

-- migration: 5  done_at: when a job was done, for `stats`' rate of done jobs
-- Set by a trigger, so the completion statement stays the same single statement on
-- a hand-made table without the column; the WHEN clause keeps the trigger function
-- out of every other update (claims, heartbeats, retries).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS done_at timestamptz;

CREATE OR REPLACE FUNCTION jobs_done_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.done_at := now();
  RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS jobs_done_at ON jobs;
CREATE TRIGGER jobs_done_at
BEFORE UPDATE OF status ON jobs
FOR EACH ROW WHEN (NEW.status = 'done' AND OLD.status IS DISTINCT FROM 'done')
EXECUTE FUNCTION jobs_done_at();

-- migration: 6  unique keys, priorities and meta
-- key: unique per queue while a job holding it is queued or running (the partial unique
-- index is what enqueue's ON CONFLICT DO NOTHING relies on); done or failed, the key is
-- free. priority: higher first, then the oldest run_at. meta: what is about the job
-- rather than its payload, carried to the archive. The archive carries every column.
ALTER TABLE jobs
  ADD COLUMN IF NOT EXISTS key      text,
  ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0
                                    CHECK (priority BETWEEN -100 AND 100),
  ADD COLUMN IF NOT EXISTS meta     jsonb;

ALTER TABLE jobs_archive
  ADD COLUMN IF NOT EXISTS key      text,
  ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS meta     jsonb,
  ADD COLUMN IF NOT EXISTS done_at  timestamptz;

CREATE UNIQUE INDEX IF NOT EXISTS jobs_key_idx ON jobs (queue, key)
WHERE key IS NOT NULL AND status IN ('queued', 'running');

-- The claim by priority walks this index one priority at a time (see `queue_priorities`
-- in storage/queries/claim.sql), so each scan still stops at the first run_at in the future: jobs due
-- later at a high priority cost one probe per claim, not one index entry each.
-- jobs_ready_idx stays as it is: the classic statements (next_due here, and any
-- older drainer or hand-written loop on the same table) keep their ordered scan.
CREATE INDEX IF NOT EXISTS jobs_priority_idx ON jobs (queue, priority DESC, run_at)
WHERE status = 'queued';

-- migration: 7  results, and archiving failed jobs
-- result: a task's return value when it keeps results (@task(keep_result=True)),
-- written by the same guarded statement that marks the job done; the archive keeps it.
-- jobs_failed_idx: failed rows by run_at (which the write-back, the reaper and cancel
-- set to when the job failed), so archiving failed jobs after their own retention
-- reads only the old ones.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS result jsonb;
ALTER TABLE jobs_archive ADD COLUMN IF NOT EXISTS result jsonb;

CREATE INDEX IF NOT EXISTS jobs_failed_idx ON jobs (run_at) WHERE status = 'failed';

-- migration: 8  schedules: each schedule's definition and its last enqueued slot
-- One row per schedule a task module declares. A slot is enqueued as an ordinary job
-- only by moving last_slot forward by compare-and-set, so a slot runs once however
-- many drainers see it, even after its job is archived and its key freed. definition
-- is a hash of what the code declares; retired lists the definitions a newer one (or
-- a withdrawal) replaced, so older code still running during a deploy leaves the
-- newer one alone (a change or a withdrawal deletes the job last_slot had queued, found
-- by its key). last_job: the job of the latest slot that ran.
CREATE TABLE IF NOT EXISTS drainer_schedules (
  name        text        PRIMARY KEY,
  queue       text        NOT NULL,
  cron        text        NOT NULL,
  tz          text        NOT NULL,
  catch_up    text        NOT NULL,
  payload     jsonb       NOT NULL,
  definition  text        NOT NULL,
  retired     text[]      NOT NULL DEFAULT '{}',
  withdrawn   boolean     NOT NULL DEFAULT false,
  last_slot   timestamptz,
  last_job    bigint,
  updated_at  timestamptz NOT NULL DEFAULT now()
);

-- migration: 9  flow control: groups, job starts for rate limits, the limits in force
-- A job's group is meta's "group" (enqueue(..., group=...)); this index finds a
-- group's queued and running jobs in enqueue order, for per-group limits and FIFO,
-- with no column added (so no table rewrite). drainer_starts: one row per job start
-- of a rate-limited queue, the tokens of its sliding window (pruned as they age out).
-- drainer_limits: each limited queue's limits as the latest drain declared them, for
-- `stats` and `doctor` (the claim takes them from the code, not from here).
CREATE INDEX IF NOT EXISTS jobs_group_idx ON jobs (queue, (meta ->> 'group'), id)
WHERE meta ? 'group' AND status IN ('queued', 'running');

CREATE TABLE IF NOT EXISTS drainer_starts (
  queue text        NOT NULL,
  at    timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS drainer_starts_idx ON drainer_starts (queue, at);

CREATE TABLE IF NOT EXISTS drainer_limits (
  queue       text        PRIMARY KEY,
  concurrency int,
  per_group   int,
  rate        int,
  per_seconds float8,
  updated_at  timestamptz NOT NULL DEFAULT now()
);

-- migration: 10  flow control: the places of jobs cancelled while running
-- A job cancelled while running keeps its lease (locked_until), and its limits count it
-- until its handler ends or the lease does (its handler may run on): these few rows, by
-- queue, for every limited claim, without reading the failed jobs.
CREATE INDEX IF NOT EXISTS jobs_held_idx ON jobs (queue, locked_until)
WHERE status = 'failed' AND locked_until IS NOT NULL;

-- migration: 11  flow control: the jobs cancelled while running, a column of their own
-- cancelled_running_until: until when a job cancelled while running keeps its places
-- under its limits (its handler may run on); NULL for every other job. Before it, the
-- mark was the claim's lease kept on the failed row: such rows are backfilled, and
-- cancel still keeps the lease too while drainers of an older release may read it.
-- A nullable column without a default: no table rewrite. Its index holds those rows in
-- either form, by queue, for every limited claim: one index scan of a few entries
-- (with one index per form, the count was a BitmapOr of both, per job a per-group
-- claim looks at: 12% more time for such a claim of 50 among 100,000 jobs).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS cancelled_running_until timestamptz;

UPDATE jobs SET cancelled_running_until = locked_until
WHERE status = 'failed' AND locked_until > now() AND locked_until < '9999-01-01'
  AND cancelled_running_until IS NULL;

CREATE INDEX IF NOT EXISTS jobs_cancelled_running_idx
ON jobs (queue, cancelled_running_until, locked_until)
WHERE status = 'failed' AND (cancelled_running_until IS NOT NULL OR locked_until IS NOT NULL);

-- migration: 12  the signed HTTP requests seen, so a replay is refused
-- The HTTP entry point refuses a signed request whose signature it has seen within
-- the timestamp window; remembering them here makes every instance refuse it. Each
-- row goes once its window has passed (pruned by the next signed request).
CREATE TABLE IF NOT EXISTS drainer_signatures (
  signature text PRIMARY KEY,
  expires_at timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS drainer_signatures_expires_idx ON drainer_signatures (expires_at);

-- migration: 13  paused queues
-- One row per paused queue: no claim takes its jobs (they wait, queued), and the
-- drain's next_due and wake-ups leave it out, until `drainer resume` deletes the row.
-- Every claim reads this table once (a handful of rows at most, usually none).
CREATE TABLE IF NOT EXISTS drainer_pauses (
  queue     text        PRIMARY KEY,
  paused_at timestamptz NOT NULL DEFAULT now(),
  paused_by text        NOT NULL DEFAULT current_user
);

-- migration: 14  fleets: the drains that widen together to work off a backlog
-- One row per queue set (its queues, sorted, comma-joined): the width its drains aim
-- for, the drains running (member id: when its lease ends, in epoch seconds of the
-- database's clock), the drains asked for and not started yet (ticket: when it
-- lapses), and the most ever running at once. Every change is a compare-and-set on
-- `version`, so drains that decide at once never each start more; a member killed
-- without leaving stops counting when its lease ends. No process watches it.
CREATE TABLE IF NOT EXISTS drainer_fleets (
  fleet      text        PRIMARY KEY,
  version    bigint      NOT NULL DEFAULT 0,
  target     int         NOT NULL DEFAULT 0,
  members    jsonb       NOT NULL DEFAULT '{}',
  tickets    jsonb       NOT NULL DEFAULT '{}',
  peak       int         NOT NULL DEFAULT 0,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- migration: 15  done_at set by the write-back itself, the trigger only for other writers
-- drainer's batch write-back sets done_at as it marks jobs done: the row trigger's
-- function took a tenth of the server's time in a drain of no-op jobs. The trigger
-- stays for every other writer (a hand-written UPDATE, a release before this one
-- during an upgrade): it runs only when the update left done_at as it was.
DROP TRIGGER IF EXISTS jobs_done_at ON jobs;
CREATE TRIGGER jobs_done_at
BEFORE UPDATE OF status ON jobs
FOR EACH ROW WHEN (NEW.status = 'done' AND OLD.status IS DISTINCT FROM 'done'
                   AND NEW.done_at IS NOT DISTINCT FROM OLD.done_at)
EXECUTE FUNCTION jobs_done_at();
