-- The queue's upkeep and inspection by storage/admin.py and storage/schema.py: the
-- schema's version and features, a drain's start (the reaper), when work is ready
-- next, archiving, requeue and cancel, and the limits in force.

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
-- archive table (else archiving deletes), migration 5's done_at column,
-- migration 6's priority column and unique keys (the key column and its index), and
-- migration 7's result column, migration 6's meta column, migration 8's schedules
-- table, migration 9's flow control (its table of starts), migration 10's index of
-- jobs cancelled while running, migration 11's column of them (cancelled_running),
-- migration 13's table of paused queues, and
-- whether the schedules table ever held a row (by the statistics, which may lag a moment: a
-- drain with no schedule declared reads the table only then, so a database that never
-- used schedules pays no statement for them), and whether there is a jobs table at all.
SELECT to_regclass('drainer_schema') IS NOT NULL,
       to_regclass('jobs_archive') IS NOT NULL,
       'done_at' = ANY (c.names),
       'priority' = ANY (c.names),
       'key' = ANY (c.names) AND to_regclass('jobs_key_idx') IS NOT NULL,
       'result' = ANY (c.names),
       'meta' = ANY (c.names),
       to_regclass('drainer_schedules') IS NOT NULL,
       to_regclass('drainer_starts') IS NOT NULL,
       to_regclass('jobs_held_idx') IS NOT NULL,
       'cancelled_running_until' = ANY (c.names),
       to_regclass('drainer_pauses') IS NOT NULL,
       coalesce((SELECT n_tup_ins + n_live_tup > 0 FROM pg_stat_user_tables
                 WHERE relid = to_regclass('drainer_schedules')), false),
       to_regclass('jobs') IS NOT NULL
FROM (SELECT coalesce(array_agg(attname::text), '{}') AS names FROM pg_attribute
      WHERE attrelid = to_regclass('jobs') AND attnum > 0 AND NOT attisdropped) AS c;

-- name: start
-- One statement at the start of a drain: reap every queue's expired leases (a
-- serverless deployment may have no other reaper), and read the `features` columns
-- (read again at each drain: a `migrate` may have added the archive table since).
-- Fails with undefined_table when `jobs` is missing. A running row with no lease at
-- all (another producer's) has none to wait for. A hand-made table may allow a NULL
-- max_attempts: the column default stands in. A job failed for good gets run_at now,
-- when it failed, as `settle` gives it.
WITH reaped AS (
  UPDATE jobs
  SET status       = CASE WHEN attempts >= coalesce(max_attempts, 5)
                          THEN 'failed' ELSE 'queued' END,
      run_at       = CASE WHEN attempts >= coalesce(max_attempts, 5)
                          THEN coalesce(%(now)s, now()) ELSE run_at END,
      locked_until = NULL,
      last_error   = coalesce(last_error, 'lease expired')
  WHERE status = 'running'
    AND (locked_until < coalesce(%(now)s, now()) OR locked_until IS NULL)
  RETURNING 1
)
SELECT (SELECT count(*) FROM reaped), schema.*
FROM (:features) AS schema;

-- name: due_limited
-- `next_due`'s sources for queues with limits: the earliest moment a queued job may
-- start (now when one is ready and its limits have room; else the earliest future
-- run_at; never before the rate's next token, when the window is full), and the
-- earliest lease end of a running job (whose end, or its holder's death, frees a
-- place). A drain that met only throttled jobs thus arms a wake-up instead of going on.
-- A paused queue is left out, as in next_due.
WITH t(now) AS (SELECT coalesce(%(now)s, now())), l AS (
  SELECT * FROM jsonb_to_recordset(%(limits)s::jsonb)
         AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8)
  WHERE l.queue <> ALL(:none_paused)
), s AS MATERIALIZED (
  SELECT l.*, t.now,
    -- a start dated past year 9998 by hand (or by a clock set wrong), 'infinity' too,
    -- holds its token for good: never, not a time Python cannot hold (nor an overflow)
    (SELECT CASE WHEN st.at < '9998-01-01' THEN st.at + make_interval(secs => l.per_seconds)
                 ELSE 'infinity' END FROM drainer_starts st
     WHERE st.queue = l.queue AND st.at > t.now - make_interval(secs => l.per_seconds)
     ORDER BY st.at DESC OFFSET greatest(l.rate - 1, 0) LIMIT 1) AS token,
    coalesce((:limit_running) >= l.concurrency, false) AS full,
    (SELECT min(run_at) FROM jobs WHERE queue = l.queue AND status = 'queued'
       AND run_at > t.now AND run_at < '9999-01-01') AS later,
    least((SELECT min(locked_until) FROM jobs WHERE queue = l.queue AND status = 'running'
             AND locked_until < '9999-01-01'),
          (:limit_cancelled_running_until)) AS leased
  FROM l, t
)
SELECT min(CASE WHEN s.token >= '9999-01-01' THEN NULL
                WHEN NOT s.full AND CASE
                  WHEN s.per_group IS NULL THEN EXISTS (
                    SELECT FROM jobs j
                    WHERE j.queue = s.queue AND j.status = 'queued' AND j.run_at <= s.now)
                  ELSE EXISTS (SELECT FROM l, t, jobs j WHERE l.queue = s.queue
                                 AND j.id = ANY(ARRAY(:limited_ready)) AND (:limited_startable))
                    OR EXISTS (SELECT FROM l, t, jobs j WHERE l.queue = s.queue
                                 AND (:more_ready)
                                 AND j.id = ANY(ARRAY(:group_heads)) AND (:limited_startable))
                  END
                THEN greatest(s.now, s.token)
                WHEN s.later IS NOT NULL THEN greatest(s.later, s.token) END),
       -- before year 2 ('-infinity' too, another producer's): now, as in next_due
       min(CASE WHEN s.leased < '0002-01-01' THEN s.now ELSE s.leased END)
FROM s;

-- name: archive_old
-- The ids of at most %(limit)s rows old enough to archive: done rows created more than
-- %(older_than)s ago, and failed rows (cancelled ones too) that failed more than
-- %(failed_older_than)s ago (by run_at, which the statements that fail a job set). Two
-- LIMITed arms rather than one OR: each keeps its partial index (jobs_done_idx,
-- jobs_failed_idx; a table without them is scanned) and stops at the limit, and the
-- failed arm runs only when done rows do not fill the batch. With an OR the planner
-- keeps a BitmapOr of the two indexes while few rows are old, but once many are it
-- takes a Seq Scan under the Limit, which reads the table from its first block again
-- at each batch: 320,000 old rows scattered among 420,000 took 1.3 s to delete that
-- way, 0.65 s with two arms (stored in the order they came, old rows first, 0.40 s
-- and 0.53 s; moving them to the archive costs 8 s either way).
(SELECT id FROM jobs
 WHERE status = 'done' AND created_at < coalesce(%(now)s, now()) - %(older_than)s
 LIMIT %(limit)s)
UNION ALL
(SELECT id FROM jobs
 WHERE status = 'failed' AND run_at < coalesce(%(now)s, now()) - %(failed_older_than)s
   AND (:cancelled_running) IS NOT TRUE
 LIMIT %(limit)s)
LIMIT %(limit)s;

-- name: archive_aged
-- Whether a row of `jobs` is old enough to archive, as `archive_old` chose them: an
-- expression, not a statement, for the WHERE of the statements that include it.
CASE status WHEN 'done' THEN created_at < coalesce(%(now)s, now()) - %(older_than)s
            WHEN 'failed' THEN run_at < coalesce(%(now)s, now()) - %(failed_older_than)s
                               AND (:cancelled_running) IS NOT TRUE
            ELSE false END;

-- name: archive_move
-- A batch of `archive_old` leaves `jobs` for the archive, with every column the
-- archive has (through jsonb, matched by name), so the statement stays the same
-- whichever migrations added columns to both tables. The rows are found by = ANY of an
-- array, through the primary key: with IN (subquery) the planner hash-joined a Seq Scan
-- of the whole table at each batch (48 ms a batch of 10,000 among 200,000 rows, 13 ms
-- by the primary key). The row's age is checked again on the row the delete locks
-- (`archive_aged`): a failed job requeued after `archive_old` read it (the requeue
-- committed while the delete waited for the row) is queued, or failed again just now,
-- and stays.
WITH moved AS (
  DELETE FROM jobs
  WHERE id = ANY(ARRAY(:archive_old)) AND (:archive_aged)
  RETURNING *
)
INSERT INTO jobs_archive
SELECT a.*
FROM moved m
CROSS JOIN LATERAL jsonb_populate_record(
  NULL::jobs_archive, to_jsonb(m) || jsonb_build_object('archived_at', now())) AS a
ON CONFLICT (id) DO NOTHING;

-- name: archive_delete
-- The plain batched delete of `archive_old` (its age checked again, as in
-- `archive_move`), when `migrate` has not created the archive table.
DELETE FROM jobs
WHERE id = ANY(ARRAY(:archive_old)) AND (:archive_aged);

-- name: next_due
-- The earliest moment more work of these queues becomes ready: a queued job's
-- run_at or a running job's lease end, clamped to now() when work is ready already,
-- NULL when nothing is left; then its two sources, the earliest queued run_at and the
-- earliest lease end (a lease end matters only if its holder died: the wake-ups tell
-- them apart), the database clock's now() they were judged at, and the queues with
-- ready jobs that none of %(known)s names (none when it is NULL). Another producer
-- may write times Python cannot hold: past year 9998 ('infinity' too) a job is
-- parked, never due; before year 2 ('-infinity' too) it is ready, due now. The
-- sources are computed once (MATERIALIZED), however often the answer names them.
-- A paused queue is left out (none_paused): its jobs wait, and wake nothing up.
WITH RECURSIVE t(now) AS (SELECT coalesce(%(now)s, now())),
d AS MATERIALIZED (SELECT
  (SELECT min(r.run_at)
   FROM unnest(%(queues)s::text[]) AS q(name)
   CROSS JOIN LATERAL (
     SELECT run_at FROM jobs
     WHERE queue = q.name AND status = 'queued' AND run_at < '9999-01-01'
     ORDER BY run_at LIMIT 1
   ) AS r
   WHERE q.name <> ALL(:none_paused)) AS queued,
  (SELECT min(locked_until) FROM jobs
   WHERE status = 'running' AND queue = ANY(%(queues)s::text[])
     AND queue <> ALL(:none_paused) AND locked_until < '9999-01-01') AS leased),
-- The first 1,000 queues (by name) that have queued jobs, one index descent apiece
-- (a loose index scan of the ready index), read only as far as the answer's last
-- column needs: up to 20 of them with a ready job that none of %(known)s names (a
-- misspelled queue, a task module not loaded): jobs no task of the drain will run.
-- NOT IN (subquery) is a hashed lookup: the names it scans are never all read first.
listed(queue, n) AS (
  (SELECT queue, 1 FROM jobs WHERE status = 'queued' AND %(known)s::text[] IS NOT NULL
   ORDER BY queue LIMIT 1)
  UNION ALL
  SELECT (SELECT j.queue FROM jobs j WHERE j.status = 'queued' AND j.queue > q.queue
          ORDER BY j.queue LIMIT 1), q.n + 1
  FROM listed q WHERE q.queue IS NOT NULL AND q.n < 1000
)
SELECT CASE WHEN least(queued, leased) IS NULL THEN NULL
            ELSE greatest(least(queued, leased), t.now) END,
       CASE WHEN queued < '0002-01-01' THEN t.now ELSE queued END,
       CASE WHEN leased < '0002-01-01' THEN t.now ELSE leased END,
       t.now,
       ARRAY(SELECT q.queue FROM listed q
             WHERE q.queue NOT IN (SELECT unnest(%(known)s::text[]))
               AND EXISTS (SELECT FROM jobs j WHERE j.queue = q.queue
                             AND j.status = 'queued' AND j.run_at <= t.now)
             LIMIT 20)
FROM d, t;

-- name: requeue
-- Failed jobs (these ids, or the queue's, less those in %(skip)s) back to queued with a
-- fresh budget: max_attempts rises by as many as it allowed (at least one more), and
-- attempts is never lowered, so no claim's token (id, attempts) is ever issued twice
-- and a stale worker still holding an old one can change nothing. The old error goes
-- with the old budget. A queue's requeue leaves cancelled jobs alone; by id they come back.
-- A job cancelled while running stays failed while it is cancelled_running: its old
-- handler may run until then, and a job must not run twice at once, nor leave its place
-- under its limits (a queued job holds none) while that handler runs (requeue_waiting).
UPDATE jobs
SET status = 'queued', run_at = now(), locked_until = NULL, last_error = NULL,
    max_attempts = least(2147483647, attempts::bigint + greatest(max_attempts, 1))::int
WHERE status = 'failed'
  AND (id = ANY(%(ids)s::bigint[])
       OR (queue = %(queue)s AND last_error IS DISTINCT FROM 'cancelled'))
  AND id <> ALL(%(skip)s::bigint[])
  AND (:cancelled_running) IS NOT TRUE
RETURNING id;

-- name: requeue_waiting
-- The jobs of these ids `requeue` left failed as they are cancelled_running, with when
-- they leave that state at the latest.
SELECT id, (:cancelled_running_end) FROM jobs
WHERE id = ANY(%(ids)s::bigint[]) AND (:cancelled_running)
ORDER BY id;

-- name: requeue_held
-- The failed jobs `requeue` would bring back whose key is held, each with the job
-- that holds it: a queued or running job, else the newest of those failed jobs with
-- the same key (which comes back; two cannot).
WITH failed AS (
  SELECT id, queue, key FROM jobs
  WHERE status = 'failed' AND key IS NOT NULL
    AND (id = ANY(%(ids)s::bigint[])
         OR (queue = %(queue)s AND last_error IS DISTINCT FROM 'cancelled'))
)
SELECT id, holder
FROM (SELECT f.id, coalesce(
               (SELECT h.id FROM jobs h WHERE h.queue = f.queue AND h.key = f.key
                  AND h.status IN ('queued', 'running')),
               (SELECT max(o.id) FROM failed o WHERE o.queue = f.queue AND o.key = f.key))
             AS holder
      FROM failed f) AS held
WHERE holder <> id
ORDER BY id;

-- name: cancel
-- Withdraw a queued or running job; the four statuses (queued, running, done, failed) stay the only ones.
-- attempts stays as it is: a running job's worker then finds it no longer its own
-- (its heartbeat, completion or failure changes nothing), and a later requeue's
-- claim gets a token that worker never held. run_at becomes now, when it was cancelled:
-- archiving judges a failed job's age by it. A running job whose lease is live becomes
-- cancelled_running until that lease's end: its handler may run on until its worker
-- sees the cancel and the handler ends (end_cancelled); while it runs, the worker's heartbeats
-- push that end on (extend_cancelled), and if the worker is gone, it comes. Until then
-- its limits count it (limit_cancelled_running) and neither requeue nor archiving takes
-- it. The lease stays too, for the drainers of releases before migration 11 (which read
-- only that form) during an upgrade. A lease that ended already, or one no time ends
-- (another producer's), is not kept, nor counted.
UPDATE jobs
SET status = 'failed', last_error = 'cancelled', run_at = now(),
    cancelled_running_until = (:cancel_kept_lease),
    locked_until = (:cancel_kept_lease)
WHERE status IN ('queued', 'running') AND id = ANY(%(ids)s::bigint[])
RETURNING id;

-- name: cancel_unmigrated
-- cancel on a schema without migration 11: the lease kept alone marks the state.
UPDATE jobs
SET status = 'failed', last_error = 'cancelled', run_at = now(),
    locked_until = (:cancel_kept_lease)
WHERE status IN ('queued', 'running') AND id = ANY(%(ids)s::bigint[])
RETURNING id;

-- name: cancel_kept_lease
-- (An expression on the row cancel withdraws.) The end of its places: a running job's
-- live lease, else none.
CASE WHEN status = 'running' AND (:lease_live) THEN locked_until END;

-- name: limits_record
-- The limits the drain's code declares for its queues (%(limits)s), for `stats` and
-- `doctor`, written only where they changed; the queues of %(unlimited)s (drained, with
-- a task and no limits now) lose theirs. One drainer at a time (`serial`, read before
-- any row is written, its lock held to the end): each locks several rows, in the order
-- of its --queue options, and two that name the same queues in another order, or move
-- a limit from one queue to another, deadlocked. A queue named twice is one row.
WITH serial AS MATERIALIZED (
  SELECT pg_advisory_xact_lock(hashtext('drainer.limits_record')) AS locked
), l AS (
  SELECT * FROM jsonb_to_recordset(%(limits)s::jsonb)
         AS l(queue text, concurrency int, per_group int, rate int, per_seconds float8)
), gone AS (
  DELETE FROM drainer_limits WHERE queue = ANY(%(unlimited)s::text[])
    AND EXISTS (SELECT FROM serial)
)
INSERT INTO drainer_limits AS d (queue, concurrency, per_group, rate, per_seconds)
SELECT DISTINCT ON (l.queue) l.queue, l.concurrency, l.per_group, l.rate, l.per_seconds
FROM serial, l
ORDER BY l.queue
ON CONFLICT (queue) DO UPDATE
SET concurrency = excluded.concurrency, per_group = excluded.per_group,
    rate = excluded.rate, per_seconds = excluded.per_seconds, updated_at = now()
WHERE (d.concurrency, d.per_group, d.rate, d.per_seconds) IS DISTINCT FROM
      (excluded.concurrency, excluded.per_group, excluded.rate, excluded.per_seconds);
