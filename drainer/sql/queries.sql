-- Every statement drainer sends at run time, named. Loaded once by drainer/sql.py.
-- A statement may hold another as a subquery, written (:name).
-- Writes after the claim are all guarded by id AND status = 'running' AND attempts,
-- so a worker can only change a job it still owns. Times come from now(); durations
-- arrive as intervals.
--
-- The batch writes (settle: complete, fail, release; extend) find their rows through the
-- primary key (j.id = ANY(ids)) and compare status with a value that travels with each id
-- (t.status, filled with 'running') instead of the constant: the statistics seldom see
-- a running row, so with `j.status = 'running'` the planner expects one row and joins
-- every running row with every id of the batch, 20 ms instead of 2 for a batch of 500.

-- name: migrate_lock
-- Serialises concurrent `migrate` runs; released at commit.
SELECT pg_advisory_xact_lock(hashtext('drainer.migrate'));

-- name: migrate_version_table
CREATE TABLE IF NOT EXISTS drainer_schema (
  version    int         PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: schema_version
SELECT coalesce(max(version), 0) FROM drainer_schema;

-- name: record_version
INSERT INTO drainer_schema (version) VALUES (%(version)s) ON CONFLICT DO NOTHING;

-- name: features
-- The schema's optional parts (only `jobs` is required): the version table, the
-- archive table (else archiving deletes) and migration 5's done_at column.
SELECT to_regclass('drainer_schema') IS NOT NULL,
       to_regclass('jobs_archive') IS NOT NULL,
       EXISTS (SELECT FROM pg_attribute
               WHERE attrelid = to_regclass('jobs') AND attname = 'done_at'
                 AND NOT attisdropped);

-- name: start
-- One statement at the start of a drain: reap every queue's expired leases (a
-- serverless deployment may have no other reaper), and read the `features` columns
-- (read again at each drain: a `migrate` may have added the archive table since).
-- Fails with undefined_table when `jobs` is missing. A running row with no lease at
-- all (another producer's) has none to wait for. A hand-made table may allow a NULL
-- max_attempts: the column default stands in.
WITH reaped AS (
  UPDATE jobs
  SET status       = CASE WHEN attempts >= coalesce(max_attempts, 5)
                          THEN 'failed' ELSE 'queued' END,
      locked_until = NULL,
      last_error   = coalesce(last_error, 'lease expired')
  WHERE status = 'running'
    AND (locked_until < coalesce(%(now)s, now()) OR locked_until IS NULL)
  RETURNING 1
)
SELECT (SELECT count(*) FROM reaped), schema.*
FROM (:features) AS schema;

-- name: claim
-- The classic SKIP LOCKED claim, for several queues at once: each queue's oldest ready rows
-- come from jobs_ready_idx (Limit > LockRows > Index Scan), then the oldest
-- overall are taken. Rows locked but not taken are released at once by the commit.
-- queue.claim() writes %(limit)s as a literal (see there); the update finds the taken
-- rows through the primary key whatever the table's size, and they are returned oldest
-- first. A row whose attempts another producer left at the integer limit cannot count
-- one more: it fails alone, saying why, instead of failing the whole claim (a hand-made
-- table may allow NULL attempts: counted as 0).
-- The planner cannot see how many names an array parameter holds and guesses
-- 10; the no-op LIMIT makes it guess 1 (a tenth), or the plan it prepares looks ten
-- times dearer than a fresh one on a big table, and every claim is planned again.
WITH next AS (
  SELECT c.id
  FROM (SELECT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
  CROSS JOIN LATERAL (
    SELECT id, run_at FROM jobs
    WHERE queue = q.name AND status = 'queued' AND run_at <= coalesce(%(now)s, now())
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
  ) AS c
  ORDER BY c.run_at
  LIMIT %(limit)s
), claimed AS (
  UPDATE jobs j
  SET status       = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN 'running' ELSE 'failed' END,
      attempts     = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(j.attempts, 0) + 1 ELSE j.attempts END,
      locked_until = CASE WHEN coalesce(j.attempts, 0) < 2147483647
                          THEN coalesce(%(now)s, now()) + %(lease)s END,
      last_error   = CASE WHEN coalesce(j.attempts, 0) < 2147483647 THEN j.last_error
                          ELSE 'attempts is at the integer limit (2147483647): no attempt '
                               'can be counted; lower it to run this job again' END
  WHERE j.id = ANY(ARRAY(SELECT id FROM next))
  RETURNING j.id, j.queue, j.payload, j.attempts, j.max_attempts, j.run_at, j.status
)
SELECT id, queue, payload, attempts, max_attempts FROM claimed
WHERE status = 'running'
ORDER BY run_at, id;

-- name: settle
-- Every change of state after the claim, for a whole batch in one statement, guarded:
-- a row changes only while it is still running with the token (id, attempts) this
-- worker claimed it with. Each row carries where it goes: 'done'; 'retry', a failed
-- attempt (queued again after its delay, NULL for the default backoff least(1 hour,
-- 10 s * 2^attempts), or failed for good at max_attempts), with its error; 'queued',
-- released unstarted, the attempt given back. (A heartbeat is `extend`: it changes no
-- state, and sets only locked_until, so a user's UPDATE OF trigger stays quiet.) Returns
-- the rows still ours, with each retry's new run_at, so the failure's log line says
-- when it is due (a done row's run_at may be a time Python cannot hold: not read).
-- The backoff's exponent is capped before the power (2^9 * 10 s is past the hour
-- already): 10 s * 2^40 overflows, and would fail the whole batch. A NULL
-- max_attempts (a hand-made table may allow it) counts as the column default, 5.
-- Arrays shorter than ids (errors, delays) are padded with NULLs by unnest.
UPDATE jobs j
SET status       = CASE WHEN t.target <> 'retry' THEN t.target
                        WHEN j.attempts >= coalesce(j.max_attempts, 5) THEN 'failed'
                        ELSE 'queued' END,
    attempts     = CASE WHEN t.target = 'queued' THEN j.attempts - 1 ELSE j.attempts END,
    run_at       = CASE WHEN t.target = 'retry'
                        THEN coalesce(%(now)s, now()) + coalesce(
                               t.delay, least(interval '1 hour', interval '10 seconds'
                                              * 2 ^ least(greatest(j.attempts, 0), 12)))
                        ELSE j.run_at END,
    locked_until = NULL,
    last_error   = CASE WHEN t.target = 'retry' THEN t.error ELSE j.last_error END
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(targets)s::text[],
            %(errors)s::text[], %(delays)s::interval[],
            array_fill('running'::text, ARRAY[cardinality(%(ids)s::bigint[])]))
     AS t(id, attempts, target, error, delay, status)
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.id = t.id AND j.status = t.status AND j.attempts = t.attempts
RETURNING j.id, t.target, j.status, CASE WHEN t.target = 'retry' THEN j.run_at END;

-- name: extend
-- Lease heartbeat for jobs still running; returns the ids still ours.
UPDATE jobs j
SET locked_until = coalesce(%(now)s, now()) + %(lease)s
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[],
            array_fill('running'::text, ARRAY[cardinality(%(ids)s::bigint[])]))
     AS t(id, attempts, status)
WHERE j.id = ANY(%(ids)s::bigint[])
  AND j.id = t.id AND j.status = t.status AND j.attempts = t.attempts
RETURNING j.id;

-- name: landed
-- After a write-back whose answer was lost with the session, which of its writes had
-- landed before it was sent again: a job done with our token can only be our
-- completion (a started job is never released, so no one else held that token), and
-- a failure is ours if the row has our token, our error and no lease. Returns each
-- such id with its status, and a failure's run_at (a done row's may be a time Python
-- cannot hold, so it is not read).
SELECT j.id, j.status, CASE WHEN t.error IS NOT NULL THEN j.run_at END
FROM jobs j
JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[])
     AS t(id, attempts, error) ON j.id = t.id AND j.attempts = t.attempts
WHERE j.id = ANY(%(ids)s::bigint[])
  AND CASE WHEN t.error IS NULL THEN j.status = 'done'
           ELSE j.status IN ('queued', 'failed') AND j.last_error = t.error
                AND j.locked_until IS NULL END;

-- name: archive_move
-- At most %(limit)s done rows older than the retention leave `jobs` for the archive.
WITH moved AS (
  DELETE FROM jobs
  WHERE id IN (
    SELECT id FROM jobs
    WHERE status = 'done' AND created_at < coalesce(%(now)s, now()) - %(older_than)s
    LIMIT %(limit)s
  )
  RETURNING id, queue, payload, status, run_at, attempts, max_attempts, last_error, created_at
)
INSERT INTO jobs_archive (id, queue, payload, status, run_at, attempts, max_attempts,
                          last_error, created_at)
SELECT * FROM moved
ON CONFLICT (id) DO NOTHING;

-- name: archive_delete
-- The plain batched delete of old done rows, when `migrate` has not created the archive table.
DELETE FROM jobs
WHERE id IN (
  SELECT id FROM jobs
  WHERE status = 'done' AND created_at < coalesce(%(now)s, now()) - %(older_than)s
  LIMIT %(limit)s
);

-- name: next_due
-- The earliest moment more work of these queues becomes ready: a queued job's
-- run_at or a running job's lease end, clamped to now() when work is ready already,
-- NULL when nothing is left; then its two sources, the earliest queued run_at and the
-- earliest lease end (a lease end matters only if its holder died: the wake-ups tell
-- them apart), and the database clock's now() they were judged at. Another producer
-- may write times Python cannot hold: past year 9998 ('infinity' too) a job is
-- parked, never due; before year 2 ('-infinity' too) it is ready, due now. The
-- sources are computed once (MATERIALIZED), however often the answer names them.
WITH t(now) AS (SELECT coalesce(%(now)s, now())),
d AS MATERIALIZED (SELECT
  (SELECT min(r.run_at)
   FROM unnest(%(queues)s::text[]) AS q(name)
   CROSS JOIN LATERAL (
     SELECT run_at FROM jobs
     WHERE queue = q.name AND status = 'queued' AND run_at < '9999-01-01'
     ORDER BY run_at LIMIT 1
   ) AS r) AS queued,
  (SELECT min(locked_until) FROM jobs
   WHERE status = 'running' AND queue = ANY(%(queues)s::text[])
     AND locked_until < '9999-01-01') AS leased)
SELECT CASE WHEN least(queued, leased) IS NULL THEN NULL
            ELSE greatest(least(queued, leased), t.now) END,
       CASE WHEN queued < '0002-01-01' THEN t.now ELSE queued END,
       CASE WHEN leased < '0002-01-01' THEN t.now ELSE leased END,
       t.now
FROM d, t;

-- name: enqueue
INSERT INTO jobs (queue, payload, run_at, max_attempts)
VALUES (%(queue)s, %(payload)s::jsonb,
        coalesce(%(run_at)s, coalesce(%(now)s, now()) + coalesce(%(delay)s, interval '0')),
        %(max_attempts)s)
RETURNING id;

-- name: db_time
-- The database's notion of a run_at, so bulk COPY rows carry the server's clock.
SELECT coalesce(%(run_at)s, coalesce(%(now)s, now()) + coalesce(%(delay)s, interval '0'));

-- name: copy_jobs
COPY jobs (queue, payload, run_at, max_attempts) FROM STDIN;

-- name: requeue
-- Failed jobs (these ids, or the queue's) back to queued with a fresh budget:
-- max_attempts rises by as many as it allowed (at least one more), and attempts is
-- never lowered, so no claim's token (id, attempts) is ever issued twice and a stale
-- worker still holding an old one can change nothing. The old error goes with the old
-- budget. A queue's requeue leaves cancelled jobs alone; by id they come back.
UPDATE jobs
SET status = 'queued', run_at = now(), locked_until = NULL, last_error = NULL,
    max_attempts = least(2147483647, attempts::bigint + greatest(max_attempts, 1))::int
WHERE status = 'failed'
  AND (id = ANY(%(ids)s::bigint[])
       OR (queue = %(queue)s AND last_error IS DISTINCT FROM 'cancelled'))
RETURNING id;

-- name: cancel
-- Withdraw a queued or running job; the four statuses (queued, running, done, failed) stay the only ones.
-- attempts stays as it is: a running job's worker then finds it no longer its own
-- (its heartbeat, completion or failure changes nothing), and a later requeue's
-- claim gets a token that worker never held.
UPDATE jobs
SET status = 'failed', last_error = 'cancelled', locked_until = NULL
WHERE status IN ('queued', 'running') AND id = ANY(%(ids)s::bigint[])
RETURNING id;

-- name: stats
SELECT j.queue, j.status, count(*) AS jobs,
       extract(epoch FROM now() - min(j.run_at) FILTER (
         WHERE j.status = 'queued' AND j.run_at <= now())) AS oldest_ready_seconds,
       count(*) FILTER (WHERE j.status = 'running' AND j.locked_until < now()) AS expired_leases
FROM jobs j
GROUP BY j.queue, j.status
ORDER BY j.queue, j.status;

-- name: top_errors
-- `stats`: each queue's most frequent errors among the jobs that failed for good or
-- wait to retry (done jobs, which recovered, and cancelled ones left out), with how
-- many jobs hold each and the newest of them, for `drainer show`; ties go to the
-- error seen most recently.
SELECT queue, last_error, jobs, latest
FROM (SELECT queue, last_error, count(*) AS jobs, max(id) AS latest,
             row_number() OVER (PARTITION BY queue
                                ORDER BY count(*) DESC, max(id) DESC) AS rank
      FROM jobs
      WHERE status IN ('queued', 'running', 'failed') AND last_error IS NOT NULL
        AND last_error <> 'cancelled'
      GROUP BY queue, last_error) AS e
WHERE rank <= %(top)s
ORDER BY queue, rank;

-- name: failed_jobs
-- `drainer failed`: failed jobs of one queue or all, newest first (by id: no column
-- records when a job failed). Times as the database writes them, JSON text, so that
-- one Python cannot hold (year 10000, infinity) is shown, not fatal.
SELECT id, queue, attempts, max_attempts, to_json(created_at) #>> '{}', last_error
FROM jobs
WHERE status = 'failed' AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: show_job
-- `drainer show`: one job's row, every column the table has (done_at when migration 5
-- added it), in column order, as JSON text (times as the database writes them).
SELECT row_to_json(j)::text FROM jobs j WHERE j.id = %(id)s;

-- name: show_archived_job
-- `drainer show` of a job no longer in `jobs`, when `migrate` created the archive.
SELECT row_to_json(a)::text FROM jobs_archive a WHERE a.id = %(id)s;

-- name: table_health
SELECT n_live_tup, n_dead_tup, last_autovacuum, last_vacuum
FROM pg_stat_user_tables
WHERE relid = to_regclass('jobs');

-- name: listen
-- The always-on worker's wake-up channel (migration 4's trigger sends the queue name).
LISTEN jobs;

-- name: seconds_until
-- How long the always-on worker may wait for a drain's next_due, by the database clock.
SELECT greatest(0, extract(epoch FROM %(at)s::timestamptz - now()))::float8;

-- name: doctor_sessions
-- `doctor`: the other client sessions of this database (the xmin horizon that holds
-- back vacuum is per database), with how long they have been connected, in their
-- state, and in their transaction.
SELECT pid, usename, application_name, state,
       extract(epoch FROM now() - backend_start)::float8 AS connected_seconds,
       extract(epoch FROM now() - state_change)::float8 AS state_seconds,
       extract(epoch FROM now() - xact_start)::float8 AS transaction_seconds,
       left(query, 200) AS query
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
ORDER BY xact_start NULLS LAST, state_change DESC;

-- name: doctor_sees_all_sessions
-- Without pg_read_all_stats, other roles' sessions show no state or query.
SELECT pg_has_role(current_user, 'pg_read_all_stats', 'member');

-- name: doctor_jobs
-- `doctor`: expired leases (no reaper has run), the oldest ready job, and the queues
-- that have queued jobs (to EXPLAIN the claim with).
SELECT count(*) FILTER (WHERE status = 'running' AND locked_until < now()) AS expired,
       extract(epoch FROM now() - min(locked_until) FILTER (
         WHERE status = 'running' AND locked_until < now()))::float8 AS expired_seconds,
       extract(epoch FROM now() - min(run_at) FILTER (
         WHERE status = 'queued' AND run_at <= now()))::float8 AS oldest_ready_seconds,
       coalesce(array_agg(DISTINCT queue) FILTER (WHERE status = 'queued'), '{}') AS queues
FROM jobs
WHERE status IN ('queued', 'running');

-- name: doctor_ready_index
-- Whether jobs_ready_idx exists and is valid (NULL: missing), and the planner's row
-- estimate of jobs (-1 before the first ANALYZE).
SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('jobs_ready_idx')),
       (SELECT reltuples FROM pg_class WHERE oid = to_regclass('jobs'))::float8;

-- name: explain
-- Prefixed to a named query (the claim) so `doctor` sees the plan of the real statement.
EXPLAIN (FORMAT JSON)

-- name: done_last_hour
-- Jobs done in the last hour per queue, by done_at (migration 5); rows archived
-- within the hour are no longer counted.
SELECT queue, count(*)
FROM jobs
WHERE status = 'done' AND done_at > now() - interval '1 hour'
GROUP BY queue
ORDER BY queue;
