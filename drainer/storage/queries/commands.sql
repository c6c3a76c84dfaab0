-- The commands' reads: `stats`, `failures`, `show`, `doctor`, and the always-on
-- worker's wake-ups.

-- name: age_since
-- (A lateral subquery.) The time job j's age counts from in `stats` and `doctor`: its
-- time a.at, or, when that is infinite (another producer's '-infinity': an infinite
-- age is not JSON), its creation, or now.
SELECT CASE WHEN isfinite(a.at) THEN a.at WHEN isfinite(j.created_at) THEN j.created_at
            ELSE now() END;

-- name: stats
SELECT j.queue, j.status, count(*) AS jobs,
       extract(epoch FROM now() - min(s.since) FILTER (
         WHERE j.status = 'queued' AND j.run_at <= now())) AS oldest_ready_seconds,
       count(*) FILTER (WHERE j.status = 'running' AND j.locked_until < now()) AS expired_leases
FROM jobs j
CROSS JOIN LATERAL (SELECT j.run_at) AS a(at)
CROSS JOIN LATERAL (:age_since) AS s(since)
GROUP BY j.queue, j.status
ORDER BY j.queue, j.status;

-- name: stats_priorities
-- `stats`: jobs queued, running and failed by queue and priority, for the queues where
-- one of them has a priority other than 0 (migration 6).
SELECT queue, priority, status, count(*)
FROM jobs
WHERE status IN ('queued', 'running', 'failed')
  AND queue IN (SELECT queue FROM jobs
                WHERE priority <> 0 AND status IN ('queued', 'running', 'failed'))
GROUP BY queue, priority, status
ORDER BY queue, priority DESC, status;

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
-- added it), in column order, as JSON text (times as the database writes them); and
-- the seconds its lease has left by the database clock (negative once it ran out; NULL
-- without one, or for another producer's that no time ends).
SELECT row_to_json(j)::text,
       CASE WHEN isfinite(j.locked_until) AND j.locked_until < '9999-01-01'
            THEN extract(epoch FROM j.locked_until - now())::float8 END
FROM jobs j WHERE j.id = %(id)s;

-- name: show_archived_job
-- `drainer show` of a job no longer in `jobs`, when `migrate` created the archive
-- (it holds no lease).
SELECT row_to_json(a)::text, NULL::float8 FROM jobs_archive a WHERE a.id = %(id)s;

-- name: job_statuses
-- `drainer cancel` of ids it could not withdraw: which of them are jobs, and their status
-- ('cancelled' for a job withdrawn already).
SELECT id, CASE WHEN status = 'failed' AND last_error = 'cancelled' THEN 'cancelled'
                ELSE status END
FROM jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: archived_job_statuses
-- The same, in the archive, when `migrate` created it.
SELECT id, CASE WHEN status = 'failed' AND last_error = 'cancelled' THEN 'cancelled'
                ELSE status END
FROM jobs_archive WHERE id = ANY(%(ids)s::bigint[]);

-- name: job_result
-- `drainer.result`: a job's status, its kept return value (JSON text; NULL when none
-- was kept) and last error, from jobs.
SELECT status, result::text, last_error FROM jobs WHERE id = %(id)s;

-- name: archived_job_result
-- `drainer.result` of a job no longer in `jobs`, when `migrate` created the archive.
SELECT status, result::text, last_error FROM jobs_archive WHERE id = %(id)s;

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
-- `doctor`: expired leases (no reaper has run), the oldest ready job (of the queues
-- not paused: a paused queue's jobs wait as meant), and the queues
-- that have queued jobs (to EXPLAIN the claim with). A running job's age counts from
-- its lease's end, a queued one's from its run_at. An OR, not IN: each arm then
-- reads its own partial index (jobs_ready_idx, jobs_running_idx), where IN read the
-- whole table (1,000,000 rows for 11,000 queued and running ones).
SELECT count(*) FILTER (WHERE j.status = 'running' AND j.locked_until < now()) AS expired,
       extract(epoch FROM now() - min(s.since) FILTER (
         WHERE j.status = 'running' AND j.locked_until < now()))::float8 AS expired_seconds,
       extract(epoch FROM now() - min(s.since) FILTER (
         WHERE j.status = 'queued' AND j.run_at <= now()
           AND j.queue <> ALL(:none_paused)))::float8 AS oldest_ready_seconds,
       coalesce(array_agg(DISTINCT j.queue) FILTER (WHERE j.status = 'queued'), '{}') AS queues
FROM jobs j
CROSS JOIN LATERAL (SELECT CASE WHEN j.status = 'running' THEN j.locked_until
                                ELSE j.run_at END) AS a(at)
CROSS JOIN LATERAL (:age_since) AS s(since)
WHERE j.status = 'queued' OR j.status = 'running';

-- name: doctor_ready_index
-- Whether a ready index (jobs_ready_idx, jobs_priority_idx) exists and is valid (NULL:
-- missing), and the planner's row estimate of jobs (-1 before the first ANALYZE).
SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%(index)s)),
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

-- name: stats_limits
-- `stats` and `doctor`: each limited queue's limits as the latest drain declared them,
-- its running jobs, its starts in the rate's window, its ready jobs, and those of them
-- their group holds back.
SELECT l.queue, l.concurrency, l.per_group, l.rate, l.per_seconds,
       (:limit_running), (:limit_window_starts),
       (SELECT count(*) FROM jobs j WHERE j.queue = l.queue AND j.status = 'queued'
          AND j.run_at <= now()),
       (SELECT count(*) FROM jobs j WHERE j.queue = l.queue AND j.status = 'queued'
          AND j.run_at <= now() AND NOT (:limited_eligible))
FROM (SELECT queue, concurrency, per_group, rate,
             -- a row edited by hand: a window no interval holds is no window
             CASE WHEN per_seconds > 0 AND per_seconds <= 31536000 THEN per_seconds END
               AS per_seconds
      FROM drainer_limits) AS l, (SELECT now() AS now) AS t
ORDER BY l.queue;
