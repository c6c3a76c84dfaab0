-- The reads of `drainer ui`, the dashboard (drainer/ui/reads.py). A page load sends a
-- few of these, each short: none reads the whole table. Counts stop at %(cap)s + 1
-- rows (shown as "more than %(cap)s"), and the pages that look at failed or done jobs
-- read only the newest %(cap)s of them, through their partial indexes.

-- name: ui_state
-- (An expression on a row of jobs.) The job's state as the dashboard names it: the
-- four statuses, a queued job not due yet (scheduled), a cancelled job, and one
-- cancelled while running whose handler may still run (cancelled_running).
CASE WHEN (:cancelled_running) THEN 'cancelled_running'
     WHEN status = 'failed' AND last_error = 'cancelled' THEN 'cancelled'
     WHEN status = 'queued' AND run_at > coalesce(%(now)s, now()) THEN 'scheduled'
     ELSE status END;

-- name: ui_queues
-- The queues page, one row per queue: queued jobs, those ready now, the oldest ready
-- one's age, running jobs and the expired leases among them, failed jobs among the
-- newest %(cap)s failed, and jobs done in the last hour among the newest %(cap)s done
-- (by creation: no index orders done jobs by done_at; a job created earlier but done
-- within the hour is missed). Each count reads at most %(cap)s + 1 index entries.
-- The queues: those with queued jobs (one descent of the ready index apiece, as
-- next_due lists them), with running jobs, among the newest failed and done jobs,
-- and those with limits or schedules.
WITH RECURSIVE t(now) AS (SELECT now()),
listed(queue, n) AS (
  (SELECT queue, 1 FROM jobs WHERE status = 'queued' ORDER BY queue LIMIT 1)
  UNION ALL
  SELECT (SELECT j.queue FROM jobs j WHERE j.status = 'queued' AND j.queue > q.queue
          ORDER BY j.queue LIMIT 1), q.n + 1
  FROM listed q WHERE q.queue IS NOT NULL AND q.n < 1000
),
running AS MATERIALIZED (
  SELECT queue, locked_until FROM jobs WHERE status = 'running' LIMIT %(cap)s + 1
),
failed AS MATERIALIZED (
  SELECT queue FROM jobs WHERE status = 'failed' ORDER BY run_at DESC LIMIT %(cap)s + 1
),
done AS MATERIALIZED (
  SELECT queue FROM (SELECT queue, done_at FROM jobs WHERE status = 'done'
                     ORDER BY created_at DESC LIMIT %(cap)s + 1) AS d
  WHERE d.done_at > now() - interval '1 hour'
),
names(queue) AS (
  SELECT queue FROM listed WHERE queue IS NOT NULL
  UNION SELECT queue FROM running
  UNION SELECT queue FROM failed
  UNION SELECT queue FROM done
  UNION SELECT queue FROM drainer_limits
  UNION SELECT queue FROM drainer_schedules WHERE NOT withdrawn
)
SELECT n.queue,
       (SELECT count(*) FROM (SELECT FROM jobs j WHERE j.queue = n.queue
                                AND j.status = 'queued' LIMIT %(cap)s + 1) AS c),
       (SELECT count(*) FROM (SELECT FROM jobs j WHERE j.queue = n.queue
                                AND j.status = 'queued' AND j.run_at <= t.now
                              LIMIT %(cap)s + 1) AS c),
       (SELECT extract(epoch FROM t.now - j.run_at)::float8 FROM jobs j
        WHERE j.queue = n.queue AND j.status = 'queued' AND j.run_at <= t.now
        ORDER BY j.run_at LIMIT 1),
       (SELECT count(*) FROM running r WHERE r.queue = n.queue),
       (SELECT count(*) FROM running r WHERE r.queue = n.queue AND r.locked_until < t.now),
       (SELECT count(*) FROM failed f WHERE f.queue = n.queue),
       (SELECT count(*) FROM done d WHERE d.queue = n.queue),
       (SELECT count(*) > %(cap)s FROM running),
       (SELECT count(*) > %(cap)s FROM failed),
       t.now
FROM names n, t
ORDER BY n.queue;

-- name: ui_failed_groups
-- The failures page: the newest %(cap)s failed jobs (by when they failed, their
-- run_at) grouped by queue and error, the largest groups first, with the newest job
-- of each and when the group's jobs failed; and whether older failed jobs were left out.
WITH f AS MATERIALIZED (
  SELECT id, queue, last_error, run_at FROM jobs WHERE status = 'failed'
  ORDER BY run_at DESC LIMIT %(cap)s + 1
), seen AS (
  SELECT * FROM f ORDER BY run_at DESC LIMIT %(cap)s
)
SELECT queue, last_error, count(*), max(id), min(run_at), max(run_at),
       (SELECT count(*) > %(cap)s FROM f)
FROM seen
GROUP BY queue, last_error
ORDER BY count(*) DESC, max(id) DESC
LIMIT %(groups)s;

-- name: ui_failed_group
-- The jobs of one group of the failures page (a queue and an error, among the same
-- newest %(cap)s failed jobs), for the requeue's confirmation: their ids are what
-- the requeue then applies to.
SELECT id FROM (SELECT id, queue, last_error FROM jobs WHERE status = 'failed'
                ORDER BY run_at DESC LIMIT %(cap)s) AS f
WHERE queue = %(queue)s AND last_error IS NOT DISTINCT FROM %(error)s
ORDER BY id DESC;

-- name: ui_jobs
-- The jobs page, newest first, paged by id (keyset: the page after id %(before)s).
-- At most %(cap)s jobs of the status asked are read, by the primary key or that
-- status's partial index; the other filters (queue, key, text in the last error) are
-- applied to them, so a rare match may take several pages. The last two columns say
-- how many jobs were read and the oldest id among them, where the next page starts:
-- a row of them alone (the others NULL) when none matched.
WITH w AS MATERIALIZED (
  SELECT id, queue, status, run_at, attempts, max_attempts, last_error, key, priority,
         created_at, (:ui_state) AS state
  FROM jobs
  WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
    AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
  ORDER BY id DESC
  LIMIT %(cap)s
), matched AS (
  SELECT * FROM w
  WHERE (%(queue)s::text IS NULL OR w.queue = %(queue)s::text)
    AND (%(key)s::text IS NULL OR w.key = %(key)s::text)
    AND (%(error)s::text IS NULL OR strpos(lower(w.last_error), lower(%(error)s::text)) > 0)
    AND (%(cancelled)s::bool IS NULL
         OR (w.status = 'failed' AND w.last_error = 'cancelled') = %(cancelled)s::bool)
  ORDER BY w.id DESC
  LIMIT %(limit)s
)
SELECT m.id, m.queue, m.state, m.attempts, m.max_attempts,
       to_json(m.run_at) #>> '{}', to_json(m.created_at) #>> '{}',
       left(m.last_error, 300), m.key, m.priority, r.read, r.oldest
FROM (SELECT count(*) AS read, min(id) AS oldest FROM w) AS r
LEFT JOIN matched m ON true
ORDER BY m.id DESC;

-- name: ui_job_state
-- The job page: one job's state as the dashboard names it (NULL: not in jobs).
SELECT (:ui_state) FROM jobs WHERE id = %(id)s;
